"""Reference and lowered models leave Python: torch.export keeps the fxquant ops; save/load.

These run the whole flow (prepare_fx, calibration, convert) on small models.
"""

from __future__ import annotations

import io
from typing import Any

import fxquant
import torch
from fxquant.flow import convert_fx, convert_to_reference_fx, prepare_fx
from fxquant.flow.state import META_KEY
from torch import nn

from tests.flow.test_lower import testint8  # noqa: F401  # the fixture

OPS = torch.ops.fxquant


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = y + y
        return self.fc(y.mean((2, 3)))


def prepared(backend_config: fxquant.BackendConfig | None = None) -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping("reference")
    model = prepare_fx(Block().eval(), mapping, (x,), backend_config=backend_config)
    with torch.no_grad():
        model(x)
    return model, x


def exported_targets(program: torch.export.ExportedProgram) -> set[object]:
    return {n.target for n in program.graph.nodes if n.op == "call_function"}


def test_reference_model_exports_with_fxquant_ops_intact() -> None:
    model, x = prepared()
    reference = convert_to_reference_fx(model)
    program = torch.export.export(reference, (x,))
    found = exported_targets(program)
    assert OPS.quantize_per_tensor.default in found
    assert OPS.dequantize_per_tensor.default in found
    # reference modules quantize their weights with the .tensor overloads (qparams buffers)
    assert OPS.quantize_per_tensor.tensor in found or OPS.quantize_per_channel.default in found
    assert torch.equal(program.module()(x), reference(x))


def test_reference_model_round_trips_through_state_dict_and_torch_save() -> None:
    model, x = prepared()
    reference = convert_to_reference_fx(model)
    expected = reference(x)
    other = convert_to_reference_fx(prepared()[0])
    other.load_state_dict(reference.state_dict())
    assert torch.equal(other(x), expected)
    buffer = io.BytesIO()
    torch.save(reference, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=False)(x), expected)


def test_reference_model_carries_the_report() -> None:
    model, _ = prepared()
    report = fxquant.flow.explain(convert_to_reference_fx(model), show=False)
    statuses = {e.node: e.status for e in report.entries()}
    assert statuses["conv"] == statuses["fc"] == "reference"


def test_lowered_model_exports_saves_and_loads(testint8: fxquant.BackendConfig) -> None:  # noqa: F811  # the fixture
    model, x = prepared(testint8)
    lowered = convert_fx(model)
    statuses = {e.node: e.status for e in lowered.meta[META_KEY].report.entries()}
    assert statuses["conv"] == statuses["fc"] == statuses["add"] == "lowered"
    expected = lowered(x)
    program = torch.export.export(lowered, (x,))
    assert torch.equal(program.module()(x), expected)
    buffer = io.BytesIO()
    torch.save(lowered, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=False)(x), expected)
    with torch.no_grad():
        reference = convert_to_reference_fx(model)(x)
    scale = float(model.get_submodule(next(iter(_last_observer(model)))).calculate_qparams()[0])
    assert (expected - reference).abs().max() <= scale * 1.001


def _last_observer(model: Any) -> list[str]:
    output = next(n for n in reversed(model.graph.nodes) if n.op == "output")
    return [str(output.args[0].target)]
