"""fxquant.fake_quantize: forward and gradients (vs float and torch.ao), switches, state."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.factory import ModuleFactory
from fxquant.numerics import fake_quantize as fxfq
from fxquant.numerics import observer as fxobs
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import oracle

torch.set_num_threads(1)


def reference_fake_quant(x: torch.Tensor, scale: float, zero_point: int, low: int, high: int):
    """(clamp(round(x / scale) + zp) - zp) * scale and its straight-through mask.

    torch's fake-quant kernels round before adding the zero point, so ties go to
    the even multiple of scale whatever the zero point.
    """
    q = torch.round(x / scale) + zero_point
    inside = (q >= low) & (q <= high)
    return (q.clamp(low, high) - zero_point) * scale, inside


@given(
    values=st.lists(st.floats(-100, 100, width=32), min_size=2, max_size=40),
    scale_exponent=st.integers(-6, 2),
    zero_point=st.integers(0, 255),
)
def test_forward_and_gradient_follow_the_straight_through_estimator(
    values: list[float], scale_exponent: int, zero_point: int
):
    scale = 2.0**scale_exponent  # exact in float32: the reference has no rounding doubt
    fq = fxfq.FakeQuantize(quant_min=0, quant_max=255)
    fq.disable_observer()
    fq.scale.fill_(scale)
    fq.zero_point.fill_(zero_point)
    x = torch.tensor(values, dtype=torch.float64).float().requires_grad_()
    y = fq(x)
    want, inside = reference_fake_quant(x.detach().double(), scale, zero_point, 0, 255)
    assert torch.allclose(y.double(), want, rtol=0, atol=scale * 1e-3)
    y.sum().backward()
    assert torch.equal(x.grad, inside.float())


def test_observer_updates_scale_then_fake_quantizes():
    fq = fxfq.FakeQuantize(observer=fxobs.MinMaxObserver, quant_min=0, quant_max=255)
    y = fq(torch.tensor([-1.0, 0.0, 3.0]))
    assert torch.allclose(fq.scale, torch.tensor([4.0 / 255]))
    assert fq.zero_point.tolist() == [64]
    assert fq.zero_point.dtype == torch.int32
    assert torch.allclose(y, torch.tensor([-1.0, 0.0, 3.0]), atol=4.0 / 255)


def test_switches_turn_observation_and_fake_quantization_off():
    fq = fxfq.FakeQuantize(observer=fxobs.MinMaxObserver)
    fq.disable_fake_quant()
    x = torch.tensor([0.1234, 5.0])
    assert torch.equal(fq(x), x)
    assert float(fq.activation_post_process.max_val) == 5.0
    fq.disable_observer()
    fq.enable_fake_quant()
    fq(torch.tensor([100.0]))
    assert float(fq.activation_post_process.max_val) == 5.0
    assert (int(fq.observer_enabled[0]), int(fq.fake_quant_enabled[0])) == (0, 1)


def test_module_level_switches_work_with_model_apply():
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 2), fxfq.default_fake_quant(), fxfq.default_fused_act_fake_quant()
    )
    model.apply(fxfq.disable_observer)
    model.apply(fxfq.disable_fake_quant)
    assert [int(m.observer_enabled[0]) for m in model[1:]] == [0, 0]
    assert [int(m.fake_quant_enabled[0]) for m in model[1:]] == [0, 0]
    model.apply(fxfq.enable_observer)
    model.apply(fxfq.enable_fake_quant)
    assert [int(m.observer_enabled[0]) for m in model[1:]] == [1, 1]
    assert [int(m.fake_quant_enabled[0]) for m in model[1:]] == [1, 1]


def test_per_channel_state_dict_round_trip_resizes_scale_and_zero_point():
    trained = fxfq.default_per_channel_weight_fake_quant()
    trained(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)))
    assert trained.scale.shape == (5,)
    fresh = fxfq.default_per_channel_weight_fake_quant()
    fresh.load_state_dict(trained.state_dict())
    for name, value in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    x = torch.randn(5, 3)
    fresh.disable_observer()
    trained.disable_observer()
    assert torch.equal(fresh(x), trained(x))


def test_range_outside_the_observer_dtype_is_rejected():
    with pytest.raises(ConfigError) as info:
        fxfq.FakeQuantize(quant_min=-128, quant_max=127)
    assert str(info.value) == (
        "quant_min=-128, quant_max=127 do not fit dtype torch.uint8 (0..255); "
        "narrow the range or pick a wider dtype"
    )


def test_range_check_reads_the_dtype_bound_in_an_observer_factory():
    make = fxobs.MovingAverageMinMaxObserver.with_args(dtype=torch.int8)
    fq = fxfq.FakeQuantize(observer=make, quant_min=-128, quant_max=127)
    assert (fq.quant_min, fq.quant_max, fq.dtype) == (-128, 127, torch.int8)


def test_inverted_range_is_rejected():
    with pytest.raises(ConfigError, match="must not exceed quant_max"):
        fxfq.FakeQuantize(quant_min=10, quant_max=0)


def test_fixed_qparams_fake_quant_needs_a_fixed_qparams_observer():
    with pytest.raises(ConfigTypeError, match="needs a FixedQParamsObserver"):
        fxfq.FixedQParamsFakeQuantize(fxobs.MinMaxObserver)


def test_fixed_qparams_fake_quant_never_changes_its_qparams():
    fq = fxfq.default_fixed_qparams_range_0to1_fake_quant()
    y = fq(torch.tensor([-1.0, 0.5, 3.0]))
    assert y.tolist() == [0.0, 0.5, 255.0 / 256.0]
    assert fq.calculate_qparams()[0].tolist() == [1.0 / 256.0]


def test_fused_fake_quant_rejects_other_observers():
    with pytest.raises(ConfigTypeError, match="needs a moving-average min/max observer"):
        fxfq.FusedMovingAvgObsFakeQuantize(observer=fxobs.MinMaxObserver)


def test_with_args_builds_comparable_factories():
    assert isinstance(fxfq.default_weight_fake_quant, ModuleFactory)
    assert fxfq.FakeQuantize.with_args(quant_min=0, quant_max=127) == fxfq.FakeQuantize.with_args(
        quant_min=0, quant_max=127
    )


def test_embedding_fake_quant_has_float_zero_points():
    fq = fxfq.default_embedding_fake_quant()
    fq(torch.randn(4, 3))
    assert fq.zero_point.dtype == torch.float32
    assert fq.zero_point.shape == (4,)


# --- torch.ao as the oracle -------------------------------------------------------------

DEFAULTS = [
    "default_fake_quant",
    "default_weight_fake_quant",
    "default_per_channel_weight_fake_quant",
    "default_dynamic_fake_quant",
    "default_embedding_fake_quant",
    "default_histogram_fake_quant",
    "default_fused_act_fake_quant",
    "default_fused_wt_fake_quant",
    "default_fused_per_channel_wt_fake_quant",
    "default_fixed_qparams_range_0to1_fake_quant",
    "default_fixed_qparams_range_neg1to1_fake_quant",
    "fused_wt_fake_quant_range_neg_127_to_127",
    "fused_per_channel_wt_fake_quant_range_neg_127_to_127",
]


def assert_same_steps(mine: Any, theirs: Any, batches: list[torch.Tensor]) -> None:
    for x in batches:
        x_mine = x.clone().requires_grad_()
        x_theirs = x.clone().requires_grad_()
        y_mine = mine(x_mine)
        with oracle.quiet():
            y_theirs = theirs(x_theirs)
        assert torch.equal(y_mine, y_theirs)
        grad = torch.linspace(-1.0, 1.0, x.numel()).reshape(x.shape)
        y_mine.backward(grad)
        y_theirs.backward(grad)
        assert torch.equal(x_mine.grad, x_theirs.grad)
        assert torch.equal(mine.scale, theirs.scale)
        assert torch.equal(mine.zero_point, theirs.zero_point)


@pytest.mark.parametrize("name", DEFAULTS)
@settings(max_examples=5)
@given(
    seeds=st.lists(st.integers(0, 2**16), min_size=1, max_size=3),
    magnitude=st.sampled_from([1e-3, 1.0, 50.0]),
)
def test_default_fake_quants_equal_torch_ao_forward_and_backward(
    name: str, seeds: list[int], magnitude: float
):
    ao = oracle.load()
    mine = getattr(fxfq, name)()
    with oracle.quiet():
        theirs = getattr(ao.fake_quantize, name)()
    batches = [
        torch.randn(4, 6, generator=torch.Generator().manual_seed(s)) * magnitude for s in seeds
    ]
    assert_same_steps(mine, theirs, batches)


@settings(max_examples=40)
@given(
    per_channel=st.booleans(),
    symmetric=st.booleans(),
    signed=st.booleans(),
    ch_axis=st.integers(0, 2),
    averaging_constant=st.sampled_from([0.01, 0.5, 1.0]),
    seeds=st.lists(st.integers(0, 2**16), min_size=1, max_size=3),
)
def test_fake_quantize_settings_equal_torch_ao(
    per_channel: bool,
    symmetric: bool,
    signed: bool,
    ch_axis: int,
    averaging_constant: float,
    seeds: list[int],
):
    ao = oracle.load()
    kind = ("per_channel_" if per_channel else "per_tensor_") + (
        "symmetric" if symmetric else "affine"
    )
    low, high = (-128, 127) if signed else (0, 255)
    kwargs: dict[str, Any] = {
        "quant_min": low,
        "quant_max": high,
        "averaging_constant": averaging_constant,
    }
    if per_channel:
        kwargs["ch_axis"] = ch_axis
    mine_observer = (
        fxobs.MovingAveragePerChannelMinMaxObserver
        if per_channel
        else fxobs.MovingAverageMinMaxObserver
    )
    mine = fxfq.FakeQuantize(
        observer=mine_observer,
        dtype=torch.int8 if signed else torch.uint8,
        qscheme=kind,
        **kwargs,
    )
    with oracle.quiet():
        theirs_observer = (
            ao.MovingAveragePerChannelMinMaxObserver
            if per_channel
            else ao.MovingAverageMinMaxObserver
        )
        theirs = ao.FakeQuantize(
            observer=theirs_observer,
            dtype=torch.qint8 if signed else torch.quint8,
            qscheme=getattr(torch, kind),
            **kwargs,
        )
    batches = [torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(s)) for s in seeds]
    assert_same_steps(mine, theirs, batches)


@pytest.mark.parametrize("name", DEFAULTS)
def test_fxquant_state_dict_loads_into_torch_ao_and_back(name: str):
    ao = oracle.load()
    mine = getattr(fxfq, name)()
    mine(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)))
    with oracle.quiet():
        theirs = getattr(ao.fake_quantize, name)()
        theirs.load_state_dict(mine.state_dict())
    fresh = getattr(fxfq, name)()
    fresh.load_state_dict(theirs.state_dict())
    for key, value in mine.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
