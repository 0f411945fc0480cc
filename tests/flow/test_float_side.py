"""A bfloat16 float side in the DTypeConfig vocabulary: int8 in, bf16 out; float ops in bf16 (#31).

The backend says it (``DTypeConfig(uint8, bfloat16, int8, float)``, ``DTypeConfig(bfloat16,
bfloat16)``), the user asks for it (``QConfig(..., output_dtype=torch.bfloat16)``,
``bfloat16_static_qconfig``), the reference model rounds those values to bfloat16, and
``explain`` and ``numerics.compare`` say so per node.
"""

from __future__ import annotations

import math
import operator

import fxquant
import hypothesis.strategies as st
import pytest
import torch
from fxquant import BackendConfig, DTypeConfig, QConfig, QConfigMapping
from fxquant.config.defaults import bfloat16_static_qconfig, default_qconfig
from fxquant.config.qconfig import OUTPUT_DTYPES
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.numerics import compare
from fxquant.patterns import binary_op_configs, linear_configs, ln_configs
from hypothesis import given, settings
from torch import fx, nn

BF16 = torch.bfloat16
INT8_BF16_OUT = DTypeConfig(
    input_dtype=torch.uint8, output_dtype=BF16, weight_dtype=torch.int8, bias_dtype=torch.float
)
INT8_FLOAT_OUT = DTypeConfig(
    input_dtype=torch.uint8,
    output_dtype=torch.float,
    weight_dtype=torch.int8,
    bias_dtype=torch.float,
)
FLOAT_BF16 = DTypeConfig(input_dtype=BF16, output_dtype=BF16)
INT8_BF16_QCONFIG = QConfig(default_qconfig.activation, default_qconfig.weight, output_dtype=BF16)


def backend(linear: list[DTypeConfig]) -> BackendConfig:
    return BackendConfig("bf16_side").set_backend_pattern_configs(
        [*linear_configs(linear), *ln_configs([FLOAT_BF16]), *binary_op_configs([FLOAT_BF16])]
    )


class Block(nn.Module):
    """linear -> residual add -> LayerNorm -> linear: int8 GEMMs around bf16 float ops."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(x + self.fc1(x)))


def bf16_mapping() -> QConfigMapping:
    return (
        QConfigMapping()
        .set_object_type(nn.Linear, INT8_BF16_QCONFIG)
        .set_object_type(nn.LayerNorm, bfloat16_static_qconfig)
        .set_object_type(torch.add, bfloat16_static_qconfig)
        .set_object_type(operator.add, bfloat16_static_qconfig)
    )


def reference_of(
    mapping: QConfigMapping, config: BackendConfig
) -> tuple[nn.Module, fx.GraphModule]:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(8, 32)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    with torch.no_grad():
        for seed in range(4):
            prepared(torch.randn(8, 32, generator=torch.Generator().manual_seed(seed)))
    return model, fxquant.convert_to_reference_fx(prepared, backend_config=config)


def sqnr(actual: torch.Tensor, expected: torch.Tensor) -> float:
    noise = float((actual - expected).pow(2).mean())
    return math.inf if noise == 0 else 10 * math.log10(float(expected.pow(2).mean()) / noise)


def casts(model: fx.GraphModule) -> list[tuple[str, torch.dtype]]:
    """Every ``.to(dtype)`` of the graph, named by the value it casts."""
    return [
        (str(n.args[0]), n.args[1])
        for n in model.graph.nodes
        if n.op == "call_method" and n.target == "to"
    ]


@pytest.mark.parametrize("value", [torch.int8, torch.float64])
def test_qconfig_output_dtype_other_than_a_float_side_names_the_argument_and_the_choices(
    value: torch.dtype,
) -> None:
    with pytest.raises(ConfigError, match=r"output_dtype=torch\.(int8|float64).*torch\.bfloat16"):
        QConfig(default_qconfig.activation, default_qconfig.weight, output_dtype=value)


def test_qconfig_output_dtype_given_as_a_string_is_a_type_error() -> None:
    with pytest.raises(
        ConfigTypeError, match=r"output_dtype must be None or a torch\.dtype.*'bf16'"
    ):
        QConfig(default_qconfig.activation, default_qconfig.weight, output_dtype="bf16")  # type: ignore[arg-type]  # the mistake under test


@settings(max_examples=10, deadline=None)
@given(output=st.sampled_from([None, *OUTPUT_DTYPES]))
def test_qconfig_output_dtype_survives_the_json_round_trip(output: torch.dtype | None) -> None:
    qconfig = QConfig(default_qconfig.activation, default_qconfig.weight, output_dtype=output)
    mapping = QConfigMapping().set_global(qconfig).set_object_type(nn.Linear, qconfig)
    text = mapping.to_json()
    assert ("output_dtype" in text) is (output is not None)  # torch.ao's JSON when unset
    again = QConfigMapping.from_json(text)
    assert again.global_qconfig == qconfig
    assert again.qconfig_for("fc", nn.Linear) == qconfig


def test_json_output_dtype_that_is_not_a_dtype_name_says_where() -> None:
    text = QConfigMapping().set_global(INT8_BF16_QCONFIG).to_json()
    with pytest.raises(ConfigError, match=r"output_dtype.*torch\.bfloat17"):
        QConfigMapping.from_json(text.replace("torch.bfloat16", "torch.bfloat17"))


def test_reference_model_rounds_the_bf16_side_and_stays_close_to_float() -> None:
    model, reference = reference_of(bf16_mapping(), backend([INT8_BF16_OUT]))
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(9))
    # fc1's and fc2's int8 outputs, the residual's input and the add's and LayerNorm's
    # outputs are rounded to bfloat16; the Linear inputs are quantized to uint8
    rounded = [value for value, dtype in casts(reference) if dtype == BF16]
    assert rounded == ["x", "fc1", "add", "norm", "fc2"]
    quantize = torch.ops.fxquant.quantize_per_tensor.default
    assert sum(n.target == quantize for n in reference.graph.nodes) == 2
    with torch.no_grad():
        got, want = reference(x), model(x)
    assert got.dtype == torch.float32
    assert sqnr(got, want) >= 30.0  # int8 GEMMs dominate; bf16 rounding adds ~0.1 dB


def test_explain_says_per_node_which_nodes_run_bf16() -> None:
    _, reference = reference_of(bf16_mapping(), backend([INT8_BF16_OUT]))
    rows = {row.node: row for row in fxquant.explain(reference).entries()}
    assert rows["fc1"].pattern == "Linear (int8 in, bfloat16 out)"
    assert rows["add"].pattern == "operator.add (bfloat16)"
    assert rows["norm"].pattern == "LayerNorm (bfloat16)"
    assert rows["fc1"].qconfig is not None
    assert rows["fc1"].qconfig.endswith("-> bfloat16")


def test_compare_holds_a_bf16_node_to_bf16_rounding_and_an_int8_one_to_int8() -> None:
    model, reference = reference_of(bf16_mapping(), backend([INT8_BF16_OUT]))
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(9))
    rows = {row.node: row for row in compare(model, reference, x)}
    # bfloat16 keeps 8 significant bits: a node alone on float inputs loses ~50 dB at most
    assert rows["norm"].local_sqnr is not None
    assert rows["norm"].local_sqnr >= 45.0
    assert rows["add"].local_sqnr is not None
    assert rows["add"].local_sqnr >= 45.0
    # an int8 GEMM's own quantization costs far more than a bf16 rounding
    assert rows["fc1"].local_sqnr is not None
    assert rows["fc1"].local_sqnr < 45.0


def test_bf16_output_asked_of_a_backend_with_float_output_only_is_skipped_saying_so() -> None:
    _, reference = reference_of(bf16_mapping(), backend([INT8_FLOAT_OUT]))
    rows = {row.node: row for row in fxquant.explain(reference).entries()}
    assert rows["fc1"].status == "skipped"
    reason = rows["fc1"].reason
    assert reason is not None
    assert "output dtype torch.bfloat16" in reason.words


def test_an_int8_qconfig_never_gets_the_bf16_output_kernel() -> None:
    # the backend lists int8 in / bf16 out first: a qconfig without output_dtype wants uint8
    # out, so only an explicit output_dtype chooses it
    config = backend([INT8_BF16_OUT, INT8_FLOAT_OUT])
    mapping = QConfigMapping().set_object_type(nn.Linear, default_qconfig)
    _, reference = reference_of(mapping, config)
    assert [dtype for _, dtype in casts(reference)] == []
    rows = {row.node: row for row in fxquant.explain(reference).entries()}
    assert rows["fc1"].pattern == "Linear (int8 in, float out)"


def test_strict_convert_lists_the_int8_nodes_without_kernel_but_not_the_bf16_float_ops() -> None:
    # a float op asked in bf16 has no integer to compute: its reference form is what was asked;
    # an int8 Linear without a kernel is a real miss (the backend here lowers nothing)
    config = backend([INT8_BF16_OUT])
    torch.manual_seed(0)
    prepared = fxquant.prepare_fx(
        Block().eval(), bf16_mapping(), (torch.randn(8, 32),), backend_config=config
    )
    prepared(torch.randn(8, 32))
    with pytest.raises(fxquant.QuantizationSkipped) as raised:
        fxquant.convert_fx(prepared, strict=True)
    lines = str(raised.value).splitlines()
    assert lines[0].startswith(
        "convert_fx(strict=True): 2 pattern(s) would not run as the qconfig mapping asks"
    )
    assert [line.split(":")[0].strip() for line in lines[1:3]] == ["fc1", "fc2"]
    report = fxquant.explain(fxquant.convert_fx(prepared), show=False)
    rows = {row.node: row for row in report.entries()}
    for node in ("add", "norm"):
        assert (rows[node].status, rows[node].reason) == ("reference", None), rows[node]
    assert "2 node(s) run as float ops in bfloat16, as their qconfig asks" in report.notes()[0]
