"""fxquant.observer: behaviour users rely on, without torch.ao (see oracle/ for numerics)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from fxquant.dtypes import quant_range
from fxquant.errors import CalibrationWarning, ConfigError, ConfigTypeError
from fxquant.factory import ModuleFactory
from fxquant.numerics import observer as fxobs
from hypothesis import given, settings
from hypothesis import strategies as st

QUINT8 = getattr(torch, "quint8", torch.uint8)
QINT8 = getattr(torch, "qint8", torch.int8)


@given(
    values=st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=40),
    symmetric=st.booleans(),
)
def test_affine_and_symmetric_qparams_follow_the_min_max_formulas(
    values: list[float], symmetric: bool
):
    qscheme = "per_tensor_symmetric" if symmetric else "per_tensor_affine"
    obs = fxobs.MinMaxObserver(dtype=torch.int8, qscheme=qscheme)
    x = torch.tensor(values)
    obs(x)
    scale, zero_point = obs.calculate_qparams()
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    eps = torch.finfo(torch.float32).eps
    if symmetric:
        assert float(scale) == pytest.approx(max(max(-low, high) / 127.5, eps), rel=1e-6)
        assert int(zero_point) == 0
    else:
        assert float(scale) == pytest.approx(max((high - low) / 255, eps), rel=1e-6)
        assert -128 <= int(zero_point) <= 127
        # 0.0 maps onto an integer exactly: the zero point
        expected = -128 - round(low / float(scale))
        assert abs(int(zero_point) - expected) <= 1


@given(values=st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=30))
def test_quantized_and_plain_dtype_names_give_identical_qparams(values: list[float]):
    x = torch.tensor(values)
    results = []
    for dtype in (torch.uint8, QUINT8):
        obs = fxobs.MinMaxObserver(dtype=dtype)
        obs(x)
        results.append(obs.calculate_qparams())
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_defaults_are_plain_uint8_per_tensor_affine():
    obs = fxobs.MinMaxObserver()
    assert obs.dtype == torch.uint8
    assert obs.qscheme == torch.per_tensor_affine
    assert (obs.quant_min, obs.quant_max) == (0, 255)
    assert obs.eps.tolist() == [torch.finfo(torch.float32).eps]
    assert obs.is_dynamic is False


def test_qscheme_given_as_a_string_is_exposed_as_the_torch_object():
    obs = fxobs.PerChannelMinMaxObserver(qscheme="per_channel_symmetric", dtype=torch.int8)
    assert obs.qscheme == torch.per_channel_symmetric


@pytest.mark.parametrize(
    ("dtype", "reduce_range", "expected"),
    [
        (torch.uint8, False, (0, 255)),
        (torch.uint8, True, (0, 127)),
        (QINT8, False, (-128, 127)),
        (torch.int8, True, (-64, 63)),
        (torch.int32, False, (-(2**31), 2**31 - 1)),
    ],
)
def test_default_integer_range_follows_dtype_and_reduce_range(
    dtype: torch.dtype, reduce_range: bool, expected: tuple[int, int]
):
    obs = fxobs.MinMaxObserver(dtype=dtype, reduce_range=reduce_range)
    assert (obs.quant_min, obs.quant_max) == expected


def test_custom_range_is_halved_by_reduce_range():
    obs = fxobs.MinMaxObserver(quant_min=0, quant_max=255, reduce_range=True)
    assert (obs.quant_min, obs.quant_max, obs.has_customized_qrange) == (0, 127, True)


def test_custom_range_outside_the_dtype_is_rejected():
    with pytest.raises(ConfigError) as info:
        fxobs.MinMaxObserver(dtype=torch.int8, quant_min=0, quant_max=255)
    assert str(info.value) == (
        "quant_min=0, quant_max=255 do not fit dtype torch.int8 (-128..127); "
        "narrow the range or pick a wider dtype"
    )


def test_custom_range_must_include_zero():
    with pytest.raises(ConfigError, match="the range must include 0"):
        fxobs.MinMaxObserver(quant_min=1, quant_max=255)


def test_giving_only_quant_min_is_an_error():
    with pytest.raises(ConfigError, match="give both or neither"):
        fxobs.MinMaxObserver(quant_min=0)


def test_reduce_range_that_empties_the_range_is_rejected():
    with pytest.raises(ConfigError, match="which holds one value"):
        fxobs.MinMaxObserver(quant_min=0, quant_max=1, reduce_range=True)


def test_symmetric_uint8_with_reduce_range_is_rejected_for_both_spellings():
    for dtype in (torch.uint8, QUINT8):
        with pytest.raises(ConfigError, match=r"use dtype=torch\.int8 or reduce_range=False"):
            fxobs.MinMaxObserver(dtype=dtype, qscheme="per_tensor_symmetric", reduce_range=True)


def test_unknown_qscheme_lists_the_choices():
    with pytest.raises(ConfigError, match="is not one of per_tensor_affine"):
        fxobs.MinMaxObserver(qscheme="per_tensor_fancy")


def test_float_dtype_is_rejected_by_integer_observers():
    with pytest.raises(ConfigError, match="cannot be observed for integer quantization"):
        fxobs.MinMaxObserver(dtype=torch.float16)


def test_dtype_must_be_a_torch_dtype():
    with pytest.raises(ConfigTypeError, match=r"dtype must be a torch\.dtype"):
        fxobs.MinMaxObserver(dtype="uint8")  # type: ignore[arg-type]  # the mistake under test


@pytest.mark.skipif(not hasattr(torch, "quint4x2"), reason="this torch has no 4-bit packed dtype")
def test_packed_4bit_weights_are_observed_on_their_own_range():
    # torch.ao's 4-bit embedding weights: per row, float zero points, 0..15
    obs = fxobs.PerChannelMinMaxObserver(
        dtype=torch.quint4x2, qscheme="per_channel_affine_float_qparams"
    )
    assert (obs.quant_min, obs.quant_max) == (0, 15)
    obs(torch.tensor([[0.0, 1.5], [-3.0, 0.0]]))
    scale, zero_point = obs.calculate_qparams()
    assert scale.tolist() == pytest.approx([1.5 / 15, 3.0 / 15])
    assert zero_point.tolist() == [-0.0, 15.0]


def test_quant_range_of_a_non_dtype_names_the_value():
    for value in ("uint8", [torch.uint8]):
        with pytest.raises(ConfigTypeError, match=r"expected a torch\.dtype, got .*uint8"):
            quant_range(value)  # type: ignore[arg-type]  # the mistake under test


@pytest.mark.parametrize(
    ("cls", "qscheme"),
    [
        (fxobs.MinMaxObserver, "per_channel_affine"),
        (fxobs.HistogramObserver, "per_channel_symmetric"),
        (fxobs.PerChannelMinMaxObserver, "per_tensor_affine"),
    ],
)
def test_observers_reject_the_other_granularity(cls: type, qscheme: str):
    with pytest.raises(ConfigError, match="supports per-"):
        cls(qscheme=qscheme)


def test_an_observer_that_saw_nothing_returns_unit_scale_silently():
    for obs in (
        fxobs.MinMaxObserver(),
        fxobs.PerChannelMinMaxObserver(),
        fxobs.HistogramObserver(),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            scale, zero_point = obs.calculate_qparams()
        assert (scale.tolist(), zero_point.tolist()) == ([1.0], [0])


def test_constant_input_gives_eps_limited_scale():
    obs = fxobs.MinMaxObserver()
    obs(torch.zeros(4))
    scale, zero_point = obs.calculate_qparams()
    assert scale.tolist() == [torch.finfo(torch.float32).eps]
    assert zero_point.tolist() == [0]


def test_moving_average_first_batch_sets_then_averages():
    obs = fxobs.MovingAverageMinMaxObserver(averaging_constant=0.25)
    obs(torch.tensor([-4.0, 4.0]))
    obs(torch.tensor([0.0, 8.0]))
    assert (float(obs.min_val), float(obs.max_val)) == (-3.0, 5.0)


def test_dynamic_moving_average_needs_averaging_constant_one():
    with pytest.raises(ConfigError, match="needs averaging_constant=1"):
        fxobs.MovingAverageMinMaxObserver(is_dynamic=True)
    assert fxobs.MovingAverageMinMaxObserver(averaging_constant=1, is_dynamic=True).is_dynamic


@settings(max_examples=30)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    data=st.data(),
)
def test_per_channel_min_max_are_the_slices_min_max(shape: list[int], data: Any):
    axis = data.draw(st.integers(0, len(shape) - 1))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    obs = fxobs.PerChannelMinMaxObserver(ch_axis=axis)
    obs(x)
    obs(x * 2)
    moved = (x * 2).movedim(axis, 0).reshape(shape[axis], -1)
    both = torch.cat([moved, x.movedim(axis, 0).reshape(shape[axis], -1)], dim=1)
    assert torch.equal(obs.min_val, both.min(dim=1).values)
    assert torch.equal(obs.max_val, both.max(dim=1).values)
    scales, zero_points = obs.calculate_qparams()
    assert scales.shape == zero_points.shape == (shape[axis],)


def test_float_qparams_give_float_zero_points():
    obs = fxobs.default_float_qparams_observer()
    obs(torch.tensor([[1.0, 3.0], [-2.0, 2.0]]))
    scales, zero_points = obs.calculate_qparams()
    assert zero_points.dtype == torch.float32
    assert torch.allclose(scales, torch.tensor([2.0 / 255, 4.0 / 255]))
    assert torch.allclose(zero_points, torch.tensor([-127.5, 127.5]))


def test_reset_min_max_vals_forgets_the_range():
    obs = fxobs.MinMaxObserver()
    obs(torch.tensor([5.0, 6.0]))
    obs.reset_min_max_vals()
    obs(torch.tensor([-1.0, 1.0]))
    assert (float(obs.min_val), float(obs.max_val)) == (-1.0, 1.0)
    channel = fxobs.PerChannelMinMaxObserver()
    channel(torch.ones(3, 2))
    channel.reset_min_max_vals()
    assert channel.min_val.numel() == 0


@pytest.mark.parametrize(
    "make",
    [
        fxobs.default_per_channel_weight_observer,
        fxobs.default_observer,
        fxobs.default_histogram_observer,
        fxobs.MovingAveragePerChannelMinMaxObserver.with_args(ch_axis=1),
    ],
)
def test_state_dict_loads_into_a_fresh_observer(make: Any):
    trained = make()
    trained(torch.randn(4, 6, generator=torch.Generator().manual_seed(1)))
    fresh = make()
    fresh.load_state_dict(trained.state_dict())
    for got, want in zip(fresh.calculate_qparams(), trained.calculate_qparams(), strict=True):
        assert torch.equal(got, want)


def test_histogram_keeps_mass_when_the_range_grows():
    obs = fxobs.HistogramObserver(bins=32)
    obs(torch.linspace(0.0, 1.0, 100))
    obs(torch.linspace(-3.0, 5.0, 60))
    assert float(obs.histogram.sum()) == pytest.approx(160.0)
    assert (float(obs.min_val), float(obs.max_val)) == (-3.0, 5.0)


def test_histogram_ignores_infinities_with_one_warning():
    obs = fxobs.HistogramObserver(bins=16)
    with pytest.warns(CalibrationWarning, match="ignored 2 non-finite value"):
        obs(torch.tensor([float("inf"), -1.0, 2.0, float("-inf")]))
    assert (float(obs.min_val), float(obs.max_val)) == (-1.0, 2.0)
    obs(torch.tensor([float("inf")]))  # no second warning: filterwarnings=error would raise
    assert float(obs.histogram.sum()) == 2.0
    assert obs.nonfinite_count == 3


@settings(max_examples=30)
@given(seed=st.integers(0, 2**16), outliers=st.integers(0, 50))
def test_histogram_search_only_narrows_the_min_max_range(seed: int, outliers: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.randn(500, generator=gen), torch.full((outliers,), 40.0)])
    histogram, min_max = fxobs.HistogramObserver(bins=256), fxobs.MinMaxObserver()
    histogram(x)
    min_max(x)
    assert float(histogram.calculate_qparams()[0]) <= float(min_max.calculate_qparams()[0])


def test_with_args_returns_comparable_factories():
    make = fxobs.MinMaxObserver.with_args(dtype=torch.int8)
    assert isinstance(make, ModuleFactory)
    assert make == fxobs.MinMaxObserver.with_args(dtype=torch.int8)
    assert make().dtype == torch.int8
    assert make() is not make()


def test_fixed_qparams_observer_returns_its_buffers():
    obs = fxobs.default_fixed_qparams_range_neg1to1_observer()
    scale, zero_point = obs.calculate_qparams()
    assert (scale.tolist(), zero_point.tolist()) == ([2.0 / 256.0], [128])
    assert (obs.quant_min, obs.quant_max, obs.dtype) == (0, 255, torch.uint8)


@pytest.mark.parametrize("cls", [fxobs.PlaceholderObserver, fxobs.NoopObserver])
def test_placeholders_pass_through_and_compute_nothing(cls: type):
    obs = cls()
    x = torch.ones(2)
    assert obs(x) is x
    with pytest.raises(ConfigError, match="computes no quantization parameters"):
        obs.calculate_qparams()


def test_dynamic_quant_observer_is_a_dynamic_uint8_placeholder():
    obs = fxobs.default_dynamic_quant_observer()
    assert (obs.dtype, obs.is_dynamic, obs.quant_min, obs.quant_max) == (
        torch.uint8,
        True,
        0,
        255,
    )


def test_compute_dtype_marks_a_placeholder_dynamic():
    assert fxobs.PlaceholderObserver(dtype=torch.uint8, compute_dtype=torch.uint8).is_dynamic


def test_recording_observer_keeps_copies():
    obs = fxobs.default_debug_observer()
    x = torch.ones(2)
    obs(x)
    x.add_(1)
    assert obs.get_tensor_value()[0].tolist() == [1.0, 1.0]


def test_observers_keep_autograd_out_of_their_buffers():
    obs = fxobs.MinMaxObserver()
    x = torch.randn(3, requires_grad=True)
    assert obs(x) is x
    assert not obs.min_val.requires_grad


def test_a_per_token_observer_passes_values_through_and_refuses_static_use() -> None:
    """PerTokenObserver (#23): nothing to calibrate; the per-token ops use int8's full range."""
    observer = fxobs.PerTokenObserver.with_args(dtype=torch.qint8)()
    x = torch.randn(2, 3, 4)
    assert observer(x) is x
    assert (observer.dtype, observer.is_dynamic, observer.is_per_token) == (torch.int8, True, True)
    assert (observer.quant_min, observer.quant_max) == (-128, 127)
    with pytest.raises(ConfigError, match="is_dynamic=False"):
        fxobs.PerTokenObserver(is_dynamic=False)
    with pytest.raises(ConfigError, match=r"full range .* leave both unset"):
        fxobs.PerTokenObserver(quant_min=-127, quant_max=127)
    with pytest.raises(ConfigError, match="cannot be observed"):
        fxobs.PerTokenObserver(dtype=torch.float16)


@pytest.mark.parametrize(
    ("observer", "low", "high"),
    [
        (fxobs.MinMaxObserver(), [3.0], [1.0]),
        (fxobs.PerChannelMinMaxObserver(), [float("inf"), 3.0], [float("-inf"), 2.0]),
    ],
    ids=["per tensor", "per channel, beside a channel that saw nothing"],
)
def test_an_inverted_range_is_refused_with_both_ends(
    observer: torch.nn.Module, low: list[float], high: list[float]
) -> None:
    """A state dict or a hand-set range with min_val > max_val names the two ends."""
    shape = () if len(low) == 1 else (len(low),)
    observer.min_val.resize_(shape).copy_(torch.tensor(low).reshape(shape))
    observer.max_val.resize_(shape).copy_(torch.tensor(high).reshape(shape))
    with pytest.raises(ConfigError, match=r"observer range is inverted: min_val=.* > max_val="):
        observer.calculate_qparams()
