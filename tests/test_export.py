"""fxquant.tools.export: torch.export of converted models, weights folded into integers."""

from __future__ import annotations

import copy

import fxquant
import pytest
import torch
from fxquant.errors import ConfigTypeError, ExportError
from fxquant.tools.export import DEQUANTIZE_OPS, QUANTIZE_OPS, export_quantized, origin, source_of
from torch import nn
from torch.export.graph_signature import InputKind


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        return self.fc(y.mean((2, 3)))


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent: torch.export cannot capture it
            return x * 2
        return x


class WithBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.branch = Branchy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.branch(self.fc(x))


def converted(model: nn.Module, x: torch.Tensor, **kwargs: object) -> torch.fx.GraphModule:
    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = fxquant.prepare_fx(model.eval(), mapping, (x,), **kwargs)  # type: ignore[arg-type]
    with torch.no_grad():
        prepared(x)
    return fxquant.convert_to_reference_fx(prepared)


@pytest.fixture
def reference() -> tuple[torch.fx.GraphModule, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    return converted(Net(), x), x


def test_weights_become_integer_constants_and_float_weights_leave(reference) -> None:
    model, x = reference
    program = export_quantized(model, (x,))
    constants = {k: v.dtype for k, v in program.constants.items()}
    # conv + torch.relu fuse: the ConvReLU2d holds the conv at conv.0
    assert constants == {"c_conv_0_weight_int": torch.int8, "c_fc_weight_int": torch.int8}
    params = [
        s.target for s in program.graph_signature.input_specs if s.kind == InputKind.PARAMETER
    ]
    assert params == ["conv.0.bias", "fc.bias"]
    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert not targets & QUANTIZE_OPS - {torch.ops.fxquant.quantize_per_tensor.default}
    assert torch.ops.fxquant.dequantize_per_channel.default in targets & DEQUANTIZE_OPS


def test_exported_program_computes_what_the_converted_model_does(reference) -> None:
    model, x = reference
    program = export_quantized(model, (x,))
    other = torch.randn(2, 3, 8, 8)
    assert torch.equal(program.module()(other), model(other))


def test_the_converted_model_is_left_as_it_was(reference) -> None:
    model, x = reference
    before = copy.deepcopy(model.state_dict())
    code = model.code
    export_quantized(model, (x,))
    assert model.code == code
    after = model.state_dict()
    assert before.keys() == after.keys()
    tensors = [k for k, v in before.items() if isinstance(v, torch.Tensor)]  # not _extra_state
    assert tensors
    assert all(torch.equal(before[k], after[k]) for k in tensors)


def test_exported_nodes_name_their_origin_and_the_user_source_line(reference) -> None:
    model, x = reference
    program = export_quantized(model, (x,))
    conv = next(n for n in program.graph.nodes if n.target == torch.ops.aten.conv2d.default)
    assert origin(conv) == "conv"
    source = source_of(model, origin(conv))
    assert source is not None
    assert source.startswith(__file__.rsplit("/", 1)[-1]) or __file__ in source


def test_a_float_model_is_refused_with_the_next_step() -> None:
    with pytest.raises(ConfigTypeError, match="convert_fx or convert_to_reference_fx"):
        export_quantized(Net(), (torch.randn(1, 3, 4, 4),))  # type: ignore[arg-type]


def test_a_prepared_model_is_refused() -> None:
    x = torch.randn(1, 3, 4, 4)
    prepared = fxquant.prepare_fx(
        Net().eval(), fxquant.get_default_qconfig_mapping("reference"), (x,)
    )
    with pytest.raises(ConfigTypeError, match=r"call fxquant\.convert_fx on it first"):
        export_quantized(prepared, (x,))


def test_export_failure_names_the_node_module_and_source_line() -> None:
    x = torch.randn(2, 4)
    custom = fxquant.PrepareCustomConfig().set_non_traceable_module_classes([Branchy])
    model = converted(WithBranch(), x, prepare_custom_config=custom)
    with pytest.raises(ExportError) as info:
        export_quantized(model, (x,))
    message = str(info.value)
    assert "node 'branch'" in message
    assert "module 'branch'" in message
    assert "test_export.py" in message
    assert "torch.cond" in message
    assert info.value.__cause__ is not None


def test_folded_constants_keep_static_shapes(reference) -> None:
    model, x = reference
    program = export_quantized(model, (x,))
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            assert all(isinstance(d, int) for d in value.shape), (node.name, value.shape)
