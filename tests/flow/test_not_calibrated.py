"""convert_fx of a model that was not calibrated is never silent (#18).

Before: observers still at +inf/-inf gave scale 1.0 and zero point 0, explain
said ``lowered``, no warning even with ``strict=True`` (5.54 off on a Linear with
inputs of scale 3). Now the nodes of never-calibrated activation observers stay
float (the float model's numbers), ``explain`` says ``not_calibrated``, convert
warns once naming the observers and nodes, and ``strict=True`` raises.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import fxquant
import pytest
import torch
from fxquant.config.defaults import default_dynamic_qconfig
from fxquant.errors import CalibrationWarning, QuantizationSkipped
from fxquant.numerics.observer import (
    FixedQParamsObserver,
    MinMaxObserver,
    PlaceholderObserver,
    is_calibrated,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

BACKENDS = ["x86", "fbgemm", "qnnpack", "onednn", "reference"]


def _prepare(model: nn.Module, backend: str, *inputs: torch.Tensor) -> torch.fx.GraphModule:
    return fxquant.prepare_fx(
        model.eval(),
        fxquant.get_default_qconfig_mapping(backend),
        inputs,
        backend_config=fxquant.get_backend_config(backend),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_uncalibrated_model_warns_once_and_stays_float(backend: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(16, 4) * 3
    prepared = _prepare(model, backend, x)
    with pytest.warns(CalibrationWarning) as caught:
        converted = fxquant.convert_fx(prepared)
    assert len(caught) == 1
    words = str(caught[0].message)
    assert "activation_post_process_0" in words
    assert "not_calibrated" in words
    assert "calibrate" in words  # what to do
    torch.testing.assert_close(converted(x), model(x), rtol=0, atol=1e-6)
    entries = {e.node: e for e in fxquant.explain(converted, show=False).entries()}
    skipped = [e for e in entries.values() if e.reason is not None]
    assert skipped
    assert all(e.reason.code == "not_calibrated" for e in skipped)
    assert all(e.status == "skipped" for e in skipped)
    assert not any(e.status == "lowered" for e in entries.values())


def test_strict_convert_of_an_uncalibrated_model_raises_without_warning() -> None:
    model = nn.Sequential(nn.Linear(4, 2))
    prepared = _prepare(model, "fbgemm", torch.randn(2, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(QuantizationSkipped, match=r"\[not_calibrated\]") as info:
            fxquant.convert_fx(prepared, strict=True)
    assert "activation_post_process_0" in str(info.value)


def test_convert_to_reference_fx_warns_too() -> None:
    prepared = _prepare(nn.Sequential(nn.Linear(4, 2)), "reference", torch.randn(2, 4))
    with pytest.warns(CalibrationWarning, match="convert_to_reference_fx"):
        reference = fxquant.convert_to_reference_fx(prepared)
    assert not any("quantize" in str(n.target) for n in reference.graph.nodes)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x), self.b(y)


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), scale=st.floats(0.5, 8.0))
def test_a_path_that_saw_only_nan_stays_float_the_rest_is_quantized(
    seed: int, scale: float
) -> None:
    torch.manual_seed(seed)
    model = TwoInputs().eval()
    x, nan = torch.randn(8, 4) * scale, torch.full((8, 4), float("nan"))
    prepared = _prepare(model, "fbgemm", x, x)
    with pytest.warns(CalibrationWarning):  # the observers of y each ignored 32 NaN
        prepared(x, nan)
    with pytest.warns(CalibrationWarning, match="not_calibrated") as caught:
        converted = fxquant.convert_fx(prepared)
    assert sum("not_calibrated" in str(w.message) for w in caught) == 1
    statuses = {e.node: e.status for e in fxquant.explain(converted, show=False).entries()}
    assert statuses["a"] == "lowered"
    assert statuses["b"] == "skipped"
    y = torch.randn(8, 4) * scale
    got_a, got_b = converted(x, y)
    torch.testing.assert_close(got_b, model.b(y), rtol=0, atol=1e-6)  # float: exact
    step = (float(x.max()) - min(float(x.min()), 0.0)) / 255
    assert float((got_a - model.a(x)).detach().abs().max()) < 50 * step  # quantized: near


def test_dynamic_fixed_and_placeholder_observers_are_never_uncalibrated() -> None:
    assert is_calibrated(FixedQParamsObserver(scale=1 / 256, zero_point=0))
    assert is_calibrated(PlaceholderObserver(dtype=torch.float16))
    assert is_calibrated(MinMaxObserver(is_dynamic=True))
    assert not is_calibrated(MinMaxObserver())
    mapping = fxquant.QConfigMapping().set_global(default_dynamic_qconfig)
    model = nn.Sequential(nn.Linear(4, 2)).eval()
    prepared = fxquant.prepare_fx(
        model, mapping, (torch.randn(2, 4),), backend_config=fxquant.get_backend_config("fbgemm")
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dynamic: nothing to calibrate, no warning
        fxquant.convert_fx(prepared)


@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
def test_calibration_data_of_one_value_warns_naming_the_observer(backend: str) -> None:
    # data of zeros gives the input observer the range [0, 0]: every real input would be
    # clamped to 0 (0.43 off on this model), so convert says so and still quantizes
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    x = torch.randn(16, 4)
    prepared = _prepare(model, backend, x)
    prepared(torch.zeros(16, 4))
    with pytest.warns(CalibrationWarning, match="saw a single value") as caught:
        converted = fxquant.convert_fx(prepared)
    assert len(caught) == 1
    assert caught[0].filename == __file__  # the user's convert_fx call
    words = str(caught[0].message)
    assert "activation_post_process_0 on input_1 saw only 0" in words  # the model's input
    assert "representative data" in words
    assert "activation_post_process_1" not in words  # the Linear's output varied (bias)
    lowered = [e for e in fxquant.explain(converted, show=False).entries() if e.status == "lowered"]
    assert lowered  # a warning, not a fallback: the user may mean it


@pytest.mark.parametrize("backend", ["x86", "qnnpack", "onednn", "reference"])
def test_activations_within_one_quantization_step_warn_naming_the_observer(backend: str) -> None:
    # a layer whose outputs are ~1e-8 (an untrained or mis-scaled one): its observer's range
    # is below eps, every value quantizes to the zero point, the model's output is zeros
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    with torch.no_grad():
        model[0].weight.mul_(1e-8)
        model[0].bias.zero_()
        model[2].bias.zero_()
    x = torch.randn(8, 16)
    prepared = _prepare(model, backend, x)
    prepared(x)
    with pytest.warns(CalibrationWarning, match="less than one quantization step") as caught:
        converted = fxquant.convert_fx(prepared)
    assert len(caught) == 1
    assert caught[0].filename == __file__
    words = str(caught[0].message)
    # the ReLU's output, ~1e-8: the observer, the node it watches and the module to name
    assert "activation_post_process_1 on _0 (module '0') saw 0..1." in words
    assert "(eps " in words  # float32's eps on x86, 2**-12 on qnnpack
    assert "activation_post_process_0" not in words  # the input varies over [-3, 3]
    with torch.no_grad():  # the zeros the warning is about
        assert bool(model(x).abs().max() > 0)
        assert bool(converted(x).abs().max() == 0)


class AroundLinear(nn.Module):
    """``fc`` with ``edit`` applied to its input and output: ``edit(fc(edit(x)))``."""

    def __init__(self, edit: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fc, self.edit = nn.Linear(4, 4), edit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.edit(self.fc(self.edit(x)))


@pytest.mark.parametrize(
    ("edit", "backend"),
    [
        (torch.relu, "x86"),  # varied calibration: nothing to say
        # edges the model makes constant itself, whatever the calibration data: zeros_like,
        # and transformers' masks' torch.tensor(1.0, dtype=x.dtype) - x (executorch
        # quantizes the sub, so the literal has an observer)
        (lambda y: y + torch.zeros_like(y).view(-1, 4), "reference"),
        (lambda y: torch.tensor(1.0, dtype=y.dtype) - y, "executorch"),
    ],
    ids=["varied", "zeros_like", "literal"],
)
def test_no_single_value_warning_for_varied_data_or_constants_the_model_makes(
    edit: Callable[[torch.Tensor], torch.Tensor], backend: str
) -> None:
    torch.manual_seed(0)
    x = torch.rand(8, 4)
    prepared = _prepare(AroundLinear(edit), backend, x)
    prepared(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        fxquant.convert_to_reference_fx(prepared)


def _sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    return float(10 * torch.log10(expected.pow(2).mean() / (expected - got).pow(2).mean()))


@pytest.mark.parametrize("backend", ["reference", "x86", "fbgemm"])  # min/max and histogram
def test_one_outlier_calibration_batch_warns_naming_the_observer(backend: str) -> None:
    # one corrupt batch (a value of 1e30 among values near 1) sets the input observer's range:
    # every real input quantizes to the zero point, the output is the bias alone (near 0 dB),
    # and nothing said so. Convert now names the observer and both peaks.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    batches = [torch.randn(16, 4) for _ in range(4)]
    clean = _prepare(model, backend, batches[0])
    poisoned = _prepare(model, backend, batches[0])
    corrupt = batches[2].clone()
    corrupt[3, 1] = 1e30
    with torch.no_grad():
        for x in batches:
            clean(x)
        for x in (batches[0], batches[1], corrupt, batches[3]):
            poisoned(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the clean calibration: nothing to say
        fine = fxquant.convert_fx(clean)
    with pytest.warns(CalibrationWarning, match="set by a single calibration batch") as caught:
        broken = fxquant.convert_fx(poisoned)
    assert len(caught) == 1
    words = str(caught[0].message)
    assert "activation_post_process_0 (output of node 'input_1')" in words
    assert "one batch reached 1e+30" in words
    assert "corrupt or unnormalized batch" in words  # what to do
    x = torch.randn(64, 4)
    with torch.no_grad():
        expected = model(x)
        assert _sqnr(expected, fine(x)) > 15
        assert _sqnr(expected, broken(x)) < 5  # what the warning is about


def test_batches_of_similar_range_or_a_single_batch_do_not_warn() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    one = _prepare(model, "reference", torch.randn(2, 4))
    growing = _prepare(model, "reference", torch.randn(2, 4))
    with torch.no_grad():
        one(torch.randn(16, 4) * 1e6)  # one batch: no other to compare it with
        for scale in (1.0, 10.0, 100.0, 999.0):  # each batch under 1000x the largest before
            growing(torch.randn(16, 4) * scale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxquant.convert_fx(one)
        fxquant.convert_fx(growing)
