"""Input-weight equalization against torch.ao's ``_equalization_config`` (issue 23).

Both flows get the same float model, the same per-tensor MinMax qconfig on Linear
and ``F.linear`` (torch.ao's ``default_qconfig``, as its own equalization tests use),
``default_equalization_qconfig`` on the same ops and the same calibration batches.
The per-channel scales must agree to float precision (torch.ao's computed by its own
``calculate_equalization_scale``), and so must the reference models' outputs, but on
chains, where torch.ao keeps quantizing the first Linear's output with its unscaled
range: there the weights agree and fxquant's output is at least as close to float.

torch.ao's input observer reads channels on axis 1, so inputs here are 2-d, where
axis 1 is the Linear's input channel axis (fxquant reads the last axis).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.config import defaults
from fxquant.flow import convert_to_reference_fx, prepare_fx
from fxquant.flow.equalization.prepare import EQUALIZATION_KEY
from fxquant.numerics import default_equalization_qconfig
from torch import nn

from tests import oracle

# a few input channels with outliers, as in transformer activations
CHANNEL_GAIN = torch.tensor([1.0, 30.0, 0.5, 1.0, 8.0, 1.0, 0.2, 1.0])


class TwoLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 6)
        self.fc2 = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


class LinearReluLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


class FunctionalLinears(nn.Module):
    weight1: torch.Tensor
    bias1: torch.Tensor
    weight2: torch.Tensor
    bias2: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        # buffers: torch.ao's equalization assigns plain tensors to them (a Parameter fails);
        # it finds a functional's bias by the word 'bias' in its name
        self.register_buffer("weight1", torch.randn(6, 8))
        self.register_buffer("bias1", torch.randn(6))
        self.register_buffer("weight2", torch.randn(4, 6))
        self.register_buffer("bias2", torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.relu(F.linear(x, self.weight1, self.bias1)), self.weight2, self.bias2)


class SingleLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class LayerNormLinear(nn.Module):
    """A transformer block's input side: LayerNorm then a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 12)
        with torch.no_grad():  # an outlier channel after the norm, as in BERT
            self.norm.weight.copy_(CHANNEL_GAIN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class FunctionalLinear(nn.Module):
    w: torch.Tensor
    b: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        # buffers: torch.ao's equalization assigns plain tensors to them (a Parameter fails)
        self.register_buffer("w", torch.randn(5, 8))
        self.register_buffer("b", torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w, self.b)


# torch.ao equalizes these exactly as fxquant does, so their outputs agree
SAME_OUTPUT: dict[str, Callable[[], nn.Module]] = {
    "single_linear": SingleLinear,
    "layer_norm_linear": LayerNormLinear,
    "functional_linear": FunctionalLinear,
}
# chains: the second scale is folded into the first Linear's rows by both; torch.ao then
# quantizes the first Linear's output with the range observed before scaling (clipping
# what the scale grew), fxquant with the scaled range
CHAINS: dict[str, Callable[[], nn.Module]] = {
    "two_linear": TwoLinear,
    "linear_relu_linear": LinearReluLinear,
    "functional_linears": FunctionalLinears,
}
OPS = (nn.Linear, F.linear, nn.ReLU, F.relu)  # torch.ao's own equalization tests map these


def _batches() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(32, 8, generator=generator) * CHANNEL_GAIN for _ in range(4)]


def _fxquant(model: nn.Module, batches: list[torch.Tensor]) -> tuple[nn.Module, Any]:
    mapping, equalization = fxquant.QConfigMapping(), fxquant.QConfigMapping()
    for op in OPS:
        mapping.set_object_type(op, defaults.default_qconfig)
        equalization.set_object_type(op, default_equalization_qconfig)
    reference = fxquant.get_backend_config("reference")  # the reference model's numbers
    prepared = prepare_fx(
        copy.deepcopy(model), mapping, (batches[0],), None, equalization, reference
    )
    for batch in batches:
        prepared(batch)
    reference = convert_to_reference_fx(prepared)
    return reference, fxquant.explain(reference, show=False)


def _ao(model: nn.Module, batches: list[torch.Tensor]) -> tuple[nn.Module, list[torch.Tensor]]:
    ao = oracle.load()
    from torch.ao.quantization.fx import _equalize
    from torch.ao.quantization.quantize_fx import convert_to_reference_fx as ao_convert
    from torch.ao.quantization.quantize_fx import prepare_fx as ao_prepare

    with oracle.quiet():
        mapping, equalization = ao.QConfigMapping(), ao.QConfigMapping()
        for op in OPS:
            mapping.set_object_type(op, ao.default_qconfig)
            equalization.set_object_type(op, _equalize.default_equalization_qconfig)
        prepared = ao_prepare(
            copy.deepcopy(model), mapping, (batches[0],), _equalization_config=equalization
        )
        for batch in batches:
            prepared(batch)
        scales = _ao_scales(prepared, _equalize)
        reference = ao_convert(prepared)
    oracle.release()
    return reference, scales


def _ao_scales(prepared: Any, equalize: Any) -> list[torch.Tensor]:
    """torch.ao's scales, in graph order, from its own observers and scale function."""
    modules = dict(prepared.named_modules())
    scales = []
    for node in prepared.graph.nodes:
        module = modules.get(str(node.target)) if node.op == "call_module" else None
        if not isinstance(module, equalize._InputEqualizationObserver):
            continue
        (user,) = node.users
        if user.op == "call_module":
            target = modules[str(user.target)]
            weight = target[0].weight if isinstance(target, nn.Sequential) else target.weight
            weight_observer = equalize.default_equalization_qconfig.weight()
            weight_observer(weight.detach())
        else:
            weight_observer = modules[str(user.args[1].target)]
        scales.append(equalize.calculate_equalization_scale(module, weight_observer))
    return scales


def _output_step(reference: nn.Module) -> float:
    quantize = [n for n in reference.graph.nodes if "quantize_per_tensor" in str(n.target)]
    return float(quantize[-1].args[1])


def _sqnr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    return float(10 * torch.log10(expected.pow(2).sum() / (expected - actual).pow(2).sum()))


def _compared(name: str, build: Callable[[], nn.Module]) -> tuple[Any, ...]:
    torch.manual_seed(sorted([*SAME_OUTPUT, *CHAINS]).index(name))
    model = build().eval()
    batches = _batches()
    ao_reference, ao_scales = _ao(model, batches)
    reference, report = _fxquant(model, batches)
    pairs = reference.meta[EQUALIZATION_KEY]
    assert len(pairs) == len(ao_scales) == len(report.notes())
    for pair, expected in zip(pairs, ao_scales, strict=True):
        torch.testing.assert_close(pair.scale, expected, rtol=1e-6, atol=0)
    return model, batches, reference, ao_reference


@pytest.mark.parametrize("name", sorted(SAME_OUTPUT))
def test_scales_and_outputs_equal_torch_ao_equalization(name: str) -> None:
    _, batches, reference, ao_reference = _compared(name, SAME_OUTPUT[name])
    with torch.no_grad(), oracle.quiet():
        for batch in batches:
            torch.testing.assert_close(reference(batch), ao_reference(batch))


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_chains_have_torch_ao_scales_and_weights_and_an_output_at_least_as_close_to_float(
    name: str,
) -> None:
    model, batches, reference, ao_reference = _compared(name, CHAINS[name])
    ours = dict(reference.named_buffers()) | dict(reference.named_parameters())
    theirs = dict(ao_reference.named_buffers()) | dict(ao_reference.named_parameters())
    for key in ("fc1.weight", "fc1.bias", "fc2.weight", "weight1", "bias1", "weight2"):
        if key in ours or key in theirs:
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6)
    x = torch.cat(batches)
    with torch.no_grad(), oracle.quiet():
        expected = model(x)
        assert _sqnr(expected, reference(x)) >= _sqnr(expected, ao_reference(x)) - 0.1


def main() -> None:
    """Print the comparison's figures: ``python -m tests.numerics.test_equalization_oracle``."""
    for name, build in {**SAME_OUTPUT, **CHAINS}.items():
        model, batches, reference, ao_reference = _compared(name, build)
        _, ao_scales = _ao(model, batches)
        pairs = reference.meta[EQUALIZATION_KEY]
        scale_diff = max(
            float((p.scale - s).abs().max()) for p, s in zip(pairs, ao_scales, strict=True)
        )
        x = torch.cat(batches)
        with torch.no_grad(), oracle.quiet():
            theirs, ours, expected = ao_reference(x), reference(x), model(x)
        print(
            f"{name}: scale max|diff| {scale_diff:.1e}, output max|diff| "
            f"{float((theirs - ours).abs().max()):.3g} (one step: {_output_step(reference):.3g}), "
            f"SQNR to float {_sqnr(expected, ours):.1f} dB (torch.ao {_sqnr(expected, theirs):.1f})"
        )


if __name__ == "__main__":
    main()
