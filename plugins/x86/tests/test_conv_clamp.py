"""x86 observes conv (+ bn) + relu6 / hardtanh / hardswish / SiLU after the activation (issue
31), as pt2e's x86 quantizer.

Before, x86's patterns quantized the activation on its own: a clamp shared the conv's qparams
observed before it (a MobileNetV2 conv + relu6 came out with a uint8 zero point near 128, half
its codes on negatives the clamp removes, and a non-zero input zero point for the next conv),
and a hardswish / SiLU was quantized a second time after the conv's output.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant_onednn.patterns import ConvUnary2d, fuse_conv_unary
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

BACKEND = "x86"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class ConvClamp(nn.Module):
    """conv (+ bn) then ``clamp`` (a module, or ``F.relu6``)."""

    def __init__(self, clamp: Any, *, bn: bool, channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels) if bn else None
        self.clamp = clamp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.clamp(y if self.bn is None else self.bn(y))  # type: ignore[no-any-return]


def settled(model: nn.Module, x: torch.Tensor) -> nn.Module:
    """``model`` in eval mode with BatchNorm statistics of ``x`` (not the identity)."""
    model.train()
    with torch.no_grad():
        model(x)
    return model.eval()


def convert(
    model: nn.Module, batches: list[torch.Tensor], backend: str = BACKEND
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """(reference, lowered) of ``model`` with ``backend``'s defaults, calibrated on ``batches``."""
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    prepared = fxquant.prepare_fx(model, mapping, (batches[0],), backend_config=config)
    with torch.no_grad():
        for batch in batches:
            prepared(batch)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    return reference, fxquant.convert_fx(prepared)


def output_qparams(reference: fx.GraphModule) -> tuple[float, int]:
    """(scale, zero point) of the model's last quantize step: the clamp's output."""
    quantize = [
        n
        for n in reference.graph.nodes
        if n.target == torch.ops.fxquant.quantize_per_tensor.default
    ]
    return float(quantize[-1].args[1]), int(quantize[-1].args[2])


INF = float("inf")
# the activation and the range of its output
ACTS: dict[str, tuple[Any, float, float]] = {
    "relu6": (nn.ReLU6(), 0.0, 6.0),
    "hardtanh": (nn.Hardtanh(-0.5, 0.25), -0.5, 0.25),
    "functional_relu6": (F.relu6, 0.0, 6.0),
    "hardswish": (nn.Hardswish(), -0.375, INF),
    "functional_hardswish": (F.hardswish, -0.375, INF),
    "silu": (nn.SiLU(), -0.2785, INF),
    "functional_silu": (F.silu, -0.2785, INF),
}


@pytest.mark.parametrize("bn", [False, True], ids=["conv", "conv_bn"])
@pytest.mark.parametrize("name", list(ACTS))
def test_conv_activation_output_is_observed_after_the_activation(name: str, bn: bool) -> None:
    torch.manual_seed(0)
    act, low, high = ACTS[name]
    x = 3 * torch.randn(4, 3, 8, 8)  # conv outputs well beyond the clamp on both sides
    model = settled(ConvClamp(act, bn=bn), x)
    reference, _ = convert(model, [x])
    modules = dict(reference.named_modules())
    assert type(modules["conv"]).__name__ == "ConvUnary2d"  # one node, one quantize step
    scale, zero_point = output_qparams(reference)
    # the uint8 codes stand for reals inside the activation's range: none spent outside it
    assert (0 - zero_point) * scale >= low - scale
    assert (255 - zero_point) * scale <= high + scale
    if low == 0.0:
        assert zero_point == 0  # relu6: pt2e's qparams, no input zero point for the next conv


@settings(deadline=None, max_examples=8)
@given(
    channels=st.integers(1, 12),
    act=st.sampled_from(["hardtanh", "hardswish", "silu"]),
    low=st.floats(-2.0, 0.0),
    width=st.floats(0.1, 6.0),
    bn=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_lowered_conv_activation_runs_as_the_post_op_within_one_step(
    channels: int, act: str, low: float, width: float, bn: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    x = 2 * torch.randn(2, 3, 6, 6)
    module = {"hardtanh": nn.Hardtanh(low, low + width), "hardswish": nn.Hardswish()}
    model = settled(ConvClamp(module.get(act, nn.SiLU()), bn=bn, channels=channels), x)
    reference, lowered = convert(model, [x])
    entries = {e.node: e for e in fxquant.explain(lowered).entries()}
    assert entries["conv"].pattern == "ConvUnary2d"
    assert entries["conv"].status == "lowered"
    kernels = [m for m in lowered.modules() if type(m).__name__ == "QConv"]
    assert len(kernels) == 1  # the activation inside the conv: no separate module or pass
    assert kernels[0].unary == {"silu": "swish"}.get(act, act)
    if act == "hardtanh":
        assert kernels[0].unary_args == [low, low + width]
    assert [type(m).__name__ for m in lowered.modules()] == ["ConvClamp", "QConv"]
    scale, _ = output_qparams(reference)
    with torch.no_grad():
        assert float((lowered(x) - reference(x)).abs().max()) <= scale * 1.001


class ReLU6Stack(nn.Module):
    """Three conv + bn + relu6 layers: a MobileNetV2 stem and expansion without the rest."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for cin, cout in ((3, 16), (16, 32), (32, 32)):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU6()]
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # type: ignore[no-any-return]


def sqnr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    return float(20 * torch.log10(expected.norm() / (expected - actual).norm()))


def test_relu6_stack_is_closer_to_float_than_with_the_clamp_sharing_the_conv_qparams() -> None:
    # onednn keeps torch.ao's patterns (the clamp shares the conv's qparams) with the same
    # kernels and default mapping: the same model there is what x86 gave before
    torch.manual_seed(0)
    batches = [torch.randn(4, 3, 16, 16) for _ in range(4)]
    model = settled(ReLU6Stack(), torch.cat(batches))
    held_out = torch.randn(8, 3, 16, 16)
    with torch.no_grad():
        expected = model(held_out)
        scores = {}
        for backend in ("x86", "onednn"):
            reference, lowered = convert(copy.deepcopy(model), batches, backend)
            scores[backend] = sqnr(expected, lowered(held_out))
            assert abs(scores[backend] - sqnr(expected, reference(held_out))) < 0.5
    assert scores["x86"] >= scores["onednn"] + 1.5, scores  # 35.8 against 33.4 dB here


def test_qat_keeps_conv_bn_trainable_and_the_clamp_on_its_own() -> None:
    # no QAT module fuses the clamp: the flow falls back to ConvBn2d (which trains) instead
    # of failing, and the clamp shares its qparams as before
    torch.manual_seed(0)
    model = ConvClamp(nn.ReLU6(), bn=True).train()
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND, is_qat=True)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_qat_fx(model, mapping, (x,), backend_config=config)
    kinds = {type(m).__name__ for m in prepared.modules()}
    assert "ConvBn2d" in kinds
    assert "ConvUnary2d" not in kinds
    prepared(x).sum().backward()
    with pytest.raises(NotImplementedError, match="post-training quantization only"):
        fuse_conv_unary(True, nn.Conv2d(1, 1, 1), nn.ReLU6())


@pytest.mark.parametrize("act", [nn.GELU(), F.relu6], ids=["gelu", "function"])
def test_conv_unary_refuses_anything_but_its_activation_modules(act: Callable[..., Any]) -> None:
    with pytest.raises(fxquant.errors.ConfigTypeError, match=r"'act' must be a torch\.nn\.ReLU6"):
        ConvUnary2d(nn.Conv2d(1, 1, 1), act)  # type: ignore[arg-type]
