"""QNNPACK rounds a layer's bias to int32 steps of input scale x weight scale (#30).

Where a channel's weight scale is huge beside the output's (BN-folded weights grown during
QAT: MobileNetV2 after two steps), the rounding swallowed the bias and the lowered layer was
160 steps from its reference model, silently. Such a layer now stays its reference module,
and ``explain`` says why.
"""

from __future__ import annotations

import fxquant
import pytest
import torch
from fxquant.numerics import compare
from torch import nn

STEP_SLACK = 1.0 + 1e-3


class Cancelling(nn.Module):
    """A Linear whose channel 0 has weights +-w on a duplicated input: they cancel, its output
    is its bias alone, while its weight scale (w / 127) dwarfs the output's."""

    def __init__(self, w: float) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)  # fc's output quantized: its input
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[w, -w], [1.0, 0.5]]))
            self.fc.bias.copy_(torch.tensor([0.3, -0.2]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(torch.cat([x, x], dim=-1)))


def _quantize(model: nn.Module, backend: str) -> tuple[nn.Module, nn.Module, list]:
    config = fxquant.get_backend_config(backend)
    batches = [
        (torch.rand(16, 1, generator=torch.Generator().manual_seed(s)) * 2,) for s in range(3)
    ]
    prepared = fxquant.prepare_fx(
        model.eval(),
        fxquant.get_default_qconfig_mapping(backend),
        batches[0],
        backend_config=config,
    )
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    lowered = fxquant.convert_fx(prepared, backend_config=config)
    reference = fxquant.convert_to_reference_fx(prepared, backend_config=config)
    return lowered, reference, batches


def _far(lowered: nn.Module, reference: nn.Module, batches: list) -> list[tuple[str, float]]:
    return [
        (row.node, row.local_steps)
        for row in compare(reference, lowered, batches)
        if row.node != "output" and row.local_steps is not None and row.local_steps > STEP_SLACK
    ]


@pytest.mark.parametrize("backend", ["qnnpack", "fbgemm"])
def test_a_layer_whose_bias_rounding_exceeds_half_a_step_agrees_with_its_reference(
    backend: str,
) -> None:
    lowered, reference, batches = _quantize(Cancelling(5000.0), backend)
    assert not _far(lowered, reference, batches)


def test_qnnpack_says_why_the_layer_stays_its_reference_module() -> None:
    lowered, _, _ = _quantize(Cancelling(5000.0), "qnnpack")
    (entry,) = [e for e in fxquant.explain(lowered, show=False).entries() if e.node == "fc"]
    assert entry.status == "reference"
    assert "QNNPACK rounds the bias to int32 steps" in entry.reason.words
    assert "output channel 0" in entry.reason.words


def test_an_ordinary_layer_still_lowers_on_qnnpack() -> None:
    lowered, reference, batches = _quantize(Cancelling(1.0), "qnnpack")
    (entry,) = [e for e in fxquant.explain(lowered, show=False).entries() if e.node == "fc"]
    assert entry.status == "lowered"
    assert not _far(lowered, reference, batches)
