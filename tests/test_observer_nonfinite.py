"""Non-finite calibration values are left out, with one warning per observer (#18).

Before: one NaN gave an all-NaN model with MinMax observers, HistogramObserver
raised torch's ``histc`` error, and in QAT the scales stayed NaN after 50 clean
batches (convert then returned NaN or crashed). Now every observer computes its
statistics on the finite values of a batch (per channel for per-channel
observers), a batch with nothing finite leaves it unchanged, and the first
non-finite values raise one ``CalibrationWarning`` naming the observer.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import fxquant
import pytest
import torch
from fxquant.config.defaults import default_per_channel_qconfig
from fxquant.errors import CalibrationWarning
from fxquant.numerics import observer as fxobs
from fxquant.numerics.fake_quantize import FakeQuantize, FusedMovingAvgObsFakeQuantize
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

NAN, INF = float("nan"), float("inf")

PER_TENSOR: dict[str, Callable[[], nn.Module]] = {
    "MinMaxObserver": fxobs.MinMaxObserver,
    "MovingAverageMinMaxObserver": lambda: fxobs.MovingAverageMinMaxObserver(0.5),
    "HistogramObserver": lambda: fxobs.HistogramObserver(bins=64),
}
PER_CHANNEL: dict[str, Callable[[], nn.Module]] = {
    "PerChannelMinMaxObserver": lambda: fxobs.PerChannelMinMaxObserver(ch_axis=1),
    "MovingAveragePerChannelMinMaxObserver": lambda: fxobs.MovingAveragePerChannelMinMaxObserver(
        0.5, ch_axis=1
    ),
}


def _poison(x: torch.Tensor, mask: torch.Tensor, values: list[float]) -> torch.Tensor:
    out = x.clone()
    picks = torch.tensor(values)[torch.arange(int(mask.sum())) % len(values)]
    out[mask] = picks
    return out


batches = st.lists(st.tuples(st.integers(0, 2**16), st.floats(0.0, 0.5)), min_size=1, max_size=4)


@settings(max_examples=40)
@given(name=st.sampled_from(sorted(PER_TENSOR)), plan=batches, kinds=st.sampled_from(
    [[NAN], [INF], [-INF], [NAN, INF, -INF]]
))  # fmt: skip
def test_per_tensor_observers_ignore_non_finite_values(
    name: str, plan: list[tuple[int, float]], kinds: list[float]
) -> None:
    poisoned, clean = PER_TENSOR[name](), PER_TENSOR[name]()
    bad = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed, fraction in plan:
            gen = torch.Generator().manual_seed(seed)
            x = torch.randn(64, generator=gen) * 3
            mask = torch.rand(64, generator=gen) < fraction
            poisoned(_poison(x, mask, kinds))
            if bool((~mask).any()):
                clean(x[~mask])  # the same batch, its finite values only
            bad += int(mask.sum())
    ours = [w for w in caught if issubclass(w.category, CalibrationWarning)]
    assert len(ours) == (1 if bad else 0)
    assert poisoned.nonfinite_count == bad
    scale, zero_point = poisoned.calculate_qparams()
    assert bool(torch.isfinite(scale).all())
    torch.testing.assert_close((scale, zero_point), clean.calculate_qparams(), rtol=0, atol=0)


@settings(max_examples=30)
@given(name=st.sampled_from(sorted(PER_CHANNEL)), plan=batches)
def test_per_channel_observers_ignore_non_finite_values_per_channel(
    name: str, plan: list[tuple[int, float]]
) -> None:
    poisoned, clean = PER_CHANNEL[name](), PER_CHANNEL[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        for seed, fraction in plan:
            gen = torch.Generator().manual_seed(seed)
            x = torch.randn(8, 3, generator=gen)
            mask = torch.rand(8, 3, generator=gen) < fraction
            mask[0] = False  # every channel keeps a finite value: the twin can repeat it
            poisoned(_poison(x, mask, [NAN, INF, -INF]))
            clean(torch.where(mask, x[0].expand_as(x), x))  # row 0 changes no min or max
    torch.testing.assert_close(poisoned.calculate_qparams(), clean.calculate_qparams())
    assert bool(torch.isfinite(poisoned.calculate_qparams()[0]).all())


@pytest.mark.parametrize("name", sorted(PER_TENSOR) + sorted(PER_CHANNEL))
def test_a_batch_with_nothing_finite_leaves_the_observer_unchanged(name: str) -> None:
    obs = {**PER_TENSOR, **PER_CHANNEL}[name]()
    obs(torch.randn(4, 3))
    before = copy.deepcopy(obs.state_dict())
    with pytest.warns(CalibrationWarning, match=r"ignored 12 non-finite value"):
        obs(torch.full((4, 3), NAN))
    for key, value in obs.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, equal_nan=False)


@pytest.mark.parametrize("name", sorted(PER_TENSOR))
@pytest.mark.parametrize("poison", [NAN, INF, -INF])
def test_a_batch_of_zeros_with_a_non_finite_value_is_observed_as_its_zeros(
    name: str, poison: float
) -> None:
    # a histogram over the range 0..0 is binned over the range of the data (torch.histc):
    # the observer must hand it the finite values only
    poisoned, clean = PER_TENSOR[name](), PER_TENSOR[name]()
    with pytest.warns(CalibrationWarning, match=r"ignored 1 non-finite value"):
        poisoned(torch.tensor([0.0, 0.0, poison]))
    clean(torch.tensor([0.0, 0.0]))
    for obs in (poisoned, clean):
        obs(torch.tensor([-1.0, 0.5, 2.0]))
    for key, value in clean.state_dict().items():
        torch.testing.assert_close(poisoned.state_dict()[key], value, rtol=0, atol=0)
    torch.testing.assert_close(poisoned.calculate_qparams(), clean.calculate_qparams())


def test_a_channel_that_never_saw_a_finite_value_gets_scale_one() -> None:
    obs = fxobs.PerChannelMinMaxObserver(ch_axis=1)
    with pytest.warns(CalibrationWarning):
        obs(torch.tensor([[1.0, NAN], [-2.0, NAN]]))
    scale, zero_point = obs.calculate_qparams()
    assert float(scale[1]) == 1.0
    assert int(zero_point[1]) == 0
    assert float(scale[0]) == pytest.approx(3.0 / 255)


@pytest.mark.parametrize("cls", [FakeQuantize, FusedMovingAvgObsFakeQuantize])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quantize_recovers_from_a_nan_batch(cls: type, per_channel: bool) -> None:
    kwargs: dict[str, object] = {"quant_min": 0, "quant_max": 255}
    if per_channel:
        kwargs = {
            "observer": fxobs.MovingAveragePerChannelMinMaxObserver,
            "quant_min": -128,
            "quant_max": 127,
            "dtype": torch.int8,
            "qscheme": "per_channel_symmetric",
            "ch_axis": 0,
        }
    poisoned, clean = cls(**kwargs), cls(**kwargs)
    gen = torch.Generator().manual_seed(0)
    first = torch.randn(3, 16, generator=gen)
    poisoned(first), clean(first)
    bad = torch.randn(3, 16, generator=gen)
    bad[1, 2], bad[0, 0] = NAN, INF
    with pytest.warns(CalibrationWarning, match="ignored 2 non-finite"):
        poisoned(bad)
    clean(torch.where(torch.isfinite(bad), bad, bad[:, 5:6].expand_as(bad)))
    for _ in range(50):
        x = torch.randn(3, 16, generator=gen)
        poisoned(x), clean(x)
    assert bool(torch.isfinite(poisoned.scale).all())
    torch.testing.assert_close(poisoned.scale, clean.scale)
    torch.testing.assert_close(poisoned.zero_point, clean.zero_point)


# --- the flow: calibration and QAT with a poisoned batch ------------------------------


@pytest.mark.parametrize("backend", ["x86", "fbgemm", "qnnpack", "onednn", "reference"])
def test_ptq_with_one_nan_in_the_calibration_data(backend: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    data = [torch.randn(2, 3, 8, 8) for _ in range(3)]
    poisoned_data = [d.clone() for d in data]
    poisoned_data[1][0, 0, 0, 0] = NAN

    def calibrated(batches: list[torch.Tensor]) -> torch.fx.GraphModule:
        prepared = fxquant.prepare_fx(
            model,
            fxquant.get_default_qconfig_mapping(backend),
            (data[0],),
            backend_config=fxquant.get_backend_config(backend),
        )
        for batch in batches:
            prepared(batch)
        return fxquant.convert_to_reference_fx(prepared)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        poisoned = calibrated(poisoned_data)
    ours = [str(w.message) for w in caught if issubclass(w.category, CalibrationWarning)]
    # one warning per observer that saw the NaN (it spreads through the float model)
    assert len(ours) == len({text.split(" (")[0] for text in ours}) >= 1
    assert "observer activation_post_process_0 (output of node 'input_1'" in ours[0]
    assert "ignored 1 non-finite value(s)" in ours[0]
    out = poisoned(data[0])
    assert bool(torch.isfinite(out).all())
    # the NaN spreads through the float model: every later observer saw NaN too; the ranges
    # of the finite values are those of the clean data with that one image's values less
    clean = calibrated(data)
    assert float((out - clean(data[0])).abs().max()) < 0.25 * float(out.abs().max())


@pytest.mark.parametrize("backend", ["fbgemm", "x86", "reference"])
def test_qat_recovers_after_a_nan_batch(backend: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).train()
    x = torch.randn(16, 4)
    prepared = fxquant.prepare_qat_fx(
        model,
        fxquant.get_default_qconfig_mapping(backend, is_qat=True),
        (x,),
        backend_config=fxquant.get_backend_config(backend),
    )
    prepared(x)
    with pytest.warns(CalibrationWarning):
        prepared(torch.full((16, 4), NAN))
    for _ in range(50):
        prepared(torch.randn(16, 4))
    scales = [m.scale for m in prepared.modules() if isinstance(m, FakeQuantize)]
    assert scales
    assert all(bool(torch.isfinite(s).all()) for s in scales)
    converted = fxquant.convert_fx(prepared.eval())
    out = converted(x)
    assert bool(torch.isfinite(out).all())
    if backend != "x86":  # x86 crashed; its numbers on a CPU without VNNI: another issue
        assert float((out - prepared(x)).detach().abs().max()) < 0.1


def test_a_nan_weight_is_named_by_its_module_at_convert() -> None:
    # the weight observers run at convert: their warning names the module, not a class
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with torch.no_grad():
        model[2].weight[0, 0] = NAN
    x = torch.randn(8, 4)
    # an explicit qconfig: the registry's defaults are what other tests may extend
    mapping = fxquant.QConfigMapping().set_global(default_per_channel_qconfig)
    # the generic patterns observe the last Linear's output (x86 ends on a float output)
    reference = fxquant.get_backend_config("reference")
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=reference)
    with pytest.warns(CalibrationWarning, match="output of node '_2'"):
        prepared(x)  # the NaN weight makes the output edge NaN too
    with pytest.warns(CalibrationWarning) as caught:
        fxquant.convert_fx(prepared)
    words = [str(w.message) for w in caught]
    named = "observer of the weight of '2' ignored 1 non-finite"
    assert any(w.startswith(named) for w in words), words
    assert not any("not in a prepared model" in w for w in words)


@pytest.mark.parametrize(
    "make",
    [
        fxobs.MinMaxObserver,
        fxobs.HistogramObserver,
        lambda: fxobs.PerChannelMinMaxObserver(ch_axis=0),
        fxobs.MovingAverageMinMaxObserver,
    ],
    ids=["minmax", "histogram", "per_channel", "moving_average"],
)
def test_observers_keep_the_two_largest_batch_peaks_until_reset(
    make: Callable[[], fxobs.ObserverBase],
) -> None:
    # what convert's one-outlier-batch warning reads (tests/flow/test_not_calibrated.py)
    observer = make()
    for batch in ([1.0, -2.0], [0.5, 0.25], [3.0, -300.0], [4.0, 1.0]):
        observer(torch.tensor([batch, batch]))
    assert observer.batch_peaks == (300.0, 4.0)  # a negative peak counts by its magnitude
    observer.reset_min_max_vals()
    assert observer.batch_peaks == (0.0, 0.0)
