"""A module's weight read elsewhere in the graph reads the float weight after fusion, folding,
swaps and lowering (#18).

Before: ``F.linear(relu(self.fc(x)), self.fc.weight)`` failed in prepare's ``graph.lint``
(the fused LinearReLU has no ``weight``); ``F.conv2d(bn(conv(x)), self.conv.weight)`` read
the BatchNorm-folded weight (1.6 dB from the float model on the reference backend, no
warning; -41.7 dB on fbgemm for ``bn(conv(x)) + conv.weight.sum()``); a lowered Linear's
weight read by ``F.linear`` failed at run time ("quantize expects a floating point input,
got a tensor of dtype torch.int8").
"""

from __future__ import annotations

import fxquant
import pytest
import torch
import torch.nn.functional as F
from torch import nn

BACKENDS = ["reference", "x86", "onednn", "fbgemm", "qnnpack"]


class FusedThenRead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.relu(self.fc(x)), self.fc.weight, self.fc.bias)


class LoweredThenRead(FusedThenRead):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(torch.sigmoid(self.fc(x)), self.fc.weight, self.fc.bias)


class FoldedThenRead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.2, 3)
            self.bn.weight.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(self.bn(self.conv(x)), self.conv.weight, self.conv.bias, padding=1)


class FoldedThenSummed(FoldedThenRead):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) + self.conv.weight.sum()


def _sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    noise = (expected - got).pow(2).sum()
    return float(10 * torch.log10(expected.pow(2).sum() / noise))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("model_class", "shape"),
    [
        (FusedThenRead, (16, 8)),
        (LoweredThenRead, (16, 8)),
        (FoldedThenRead, (2, 3, 8, 8)),
        (FoldedThenSummed, (2, 3, 8, 8)),
    ],
)
def test_a_weight_read_after_its_module_is_replaced_is_the_float_weight(
    backend: str, model_class: type[nn.Module], shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    model = model_class().eval()
    x = torch.randn(*shape)
    prepared = fxquant.prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping(backend),
        (x,),
        backend_config=fxquant.get_backend_config(backend),
    )
    for _ in range(3):
        prepared(torch.randn(*shape))
    converted = fxquant.convert_fx(prepared)
    with torch.no_grad():
        assert _sqnr(model(x), converted(x)) > 25


def test_the_alias_is_the_parameter_qat_trains() -> None:
    model = FusedThenRead().train()
    prepared = fxquant.prepare_qat_fx(
        model, fxquant.get_default_qat_qconfig_mapping("x86"), (torch.randn(4, 8),)
    )
    weights = [p for name, p in prepared.named_parameters() if name.endswith("weight")]
    assert len(weights) == 1  # one weight, read by the QAT LinearReLU and the F.linear
    fused = prepared.get_submodule("fc")
    assert any(p is weights[0] for p in fused.parameters())
