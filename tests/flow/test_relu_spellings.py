"""A relu fuses into the conv or linear before it however the user writes it.

``torch.relu(x)``, ``x.relu()``, ``F.relu(x)``, ``nn.ReLU()`` and their in-place
forms are one op to a user; each backend's fused patterns name only some of them
(conv + ``torch.relu`` in none, conv + add + relu with ``nn.ReLU`` only).
"""

from __future__ import annotations

from collections.abc import Callable

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.flow.match import PatternIndex, match_graph
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.zoo.runner import sqnr

SPELLINGS: dict[str, Callable[[nn.Module, torch.Tensor], torch.Tensor]] = {
    "torch.relu": lambda m, y: torch.relu(y),
    "torch.relu_": lambda m, y: torch.relu_(y),
    "x.relu()": lambda m, y: y.relu(),
    "x.relu_()": lambda m, y: y.relu_(),
    "F.relu": lambda m, y: F.relu(y),
    "F.relu(inplace=True)": lambda m, y: F.relu(y, inplace=True),
    "nn.ReLU": lambda m, y: m.relu(y),
    "nn.ReLU(inplace=True)": lambda m, y: m.relu_inplace(y),
}
BACKENDS = ["x86", "fbgemm", "qnnpack", "onednn"]


class Relu(nn.Module):
    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.relu, self.relu_inplace = nn.ReLU(), nn.ReLU(inplace=True)
        self.spelling = spelling


class ConvRelu(Relu):
    def __init__(self, spelling: str, with_bn: bool) -> None:
        super().__init__(spelling)
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8) if with_bn else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return SPELLINGS[self.spelling](self, y if self.bn is None else self.bn(y))


class LinearRelu(Relu):
    def __init__(self, spelling: str, with_bn: bool) -> None:
        super().__init__(spelling)
        self.fc = nn.Linear(12, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SPELLINGS[self.spelling](self, self.fc(x))


def quantized(model: nn.Module, backend: str, x: torch.Tensor) -> torch.fx.GraphModule:
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    prepared(x)
    return fxquant.convert_fx(prepared)


@settings(max_examples=24, deadline=None)
@given(
    spelling=st.sampled_from(sorted(SPELLINGS)),
    backend=st.sampled_from(BACKENDS),
    linear=st.booleans(),
    with_bn=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_every_spelling_of_relu_fuses_lowered_and_close_to_float(
    spelling: str, backend: str, linear: bool, with_bn: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    model = (LinearRelu if linear else ConvRelu)(spelling, with_bn).eval()
    x = torch.randn(4, 12) if linear else torch.randn(2, 3, 10, 10)
    lowered = quantized(model, backend, x)
    model.spelling = "nn.ReLU"
    lowered_as_module = quantized(model, backend, x)
    rows = fxquant.explain(lowered, show=False).entries()
    ops = [(e.node, e.pattern, e.status) for e in rows if e.op not in ("placeholder", "output")]
    weighted = "fc" if linear else "conv"
    fused = "LinearReLU" if linear else "ConvReLU2d"
    assert len(ops) == 1, ops  # no relu row: it runs inside the fused kernel
    node, pattern, status = ops[0]
    assert (node, status) == (weighted, "lowered")
    assert pattern is not None
    assert pattern.startswith(fused), pattern
    with torch.no_grad():
        assert torch.equal(lowered(x), lowered_as_module(x))
        assert sqnr(model(x), lowered(x)) > 25.0


def conv_add_relu(spelling: str) -> nn.Module:
    class ConvAddRelu(ConvRelu):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return SPELLINGS[self.spelling](self, torch.add(self.bn(self.conv(x)), x[:, :1]))

    return ConvAddRelu(spelling, with_bn=True).eval()


@pytest.mark.parametrize("spelling", ["torch.relu", "x.relu()", "F.relu"])
def test_conv_add_relu_fuses_with_a_relu_pattern_written_as_nn_relu(spelling: str) -> None:
    # x86's conv + add + relu patterns are written with nn.ReLU alone (as torch.ao's)
    torch.manual_seed(0)
    model = conv_add_relu(spelling)
    x = torch.randn(2, 3, 10, 10)
    prepared = fxquant.prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping("x86"),
        (x,),
        backend_config=fxquant.get_backend_config("x86"),
    )
    assert type(prepared.conv).__name__ == "ConvAddReLU2d"


def test_a_spelling_index_prefers_the_pattern_written_as_the_node_is() -> None:
    index = PatternIndex.build(
        [(F.relu, "functional"), (torch.relu, "torch")], spellings=[{F.relu, torch.relu}]
    )
    gm = torch.fx.symbolic_trace(ConvRelu("torch.relu", with_bn=False))
    (match,) = {id(m): m for m in match_graph(gm, index).values()}.values()
    assert match.payload == "torch"


def test_without_spellings_the_matcher_keeps_ops_apart() -> None:
    index = PatternIndex.build([(F.relu, "functional")])
    gm = torch.fx.symbolic_trace(ConvRelu("torch.relu", with_bn=False))
    assert match_graph(gm, index) == {}
