"""The ONNX export: real Q/DQ nodes, per-pattern numerics in onnxruntime, fusion, bad input."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import fxquant
import onnx
import pytest
import torch
from fxquant.errors import ConfigTypeError, ExportError
from fxquant.tools import testing
from fxquant_tensorrt import check_placement, deploy, export_onnx
from fxquant_tensorrt.runtime import OnnxRuntimeModel
from torch import nn
from trt_helpers import quantize

REFERENCE = fxquant.get_backend_config("reference")
"""Where a test checks what tensorrt reports of another backend's Q/DQ: the generic patterns."""

# the reference patterns TensorRT runs in int8, as fxquant's kit builds them
CASES = {
    case.name: case
    for case in testing.LOWERING_CASES
    if case.name
    in {
        "linear",
        "linear_relu",
        "functional_linear",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv2d_relu",
        "conv_bn_relu2d",
        "depthwise_conv2d",
        "conv_transpose2d",
        "add",
        "add_relu",
        "mul",
        "mul_relu",
        "cat",
        "max_pool2d",
        "avg_pool2d",
        "adaptive_avg_pool2d",
        "flatten",
        "reshape",
        "mean",
        "relu",
        "hardtanh",
        "relu6",
        "interpolate",
    }
}
# what onnxruntime fuses each into on x86 (int8 allowed); conv/linear + relu keep a float
# Relu there: on a symmetric grid relu is not a clamp onnxruntime can drop (TensorRT fuses it).
# A linear is int8 in, float out (#23): Q/DQ on the GEMM's inputs only, which TensorRT fuses;
# onnxruntime makes a QGemm only with a QuantizeLinear after it, so its Gemm runs in float there
FUSED = {
    "linear": None,
    "conv2d": "QLinearConv",
    "conv_bn_relu2d": None,
    "add": "QLinearAdd",
    "mul": "QLinearMul",
    "cat": "QLinearConcat",
    "avg_pool2d": "QLinearAveragePool",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_pattern_runs_in_onnxruntime_within_one_step_of_the_reference(name: str) -> None:
    converted, reference, inputs = testing.quantize_case("tensorrt", CASES[name], (2, 4, 4, 6))
    deployed = deploy(converted, tuple(inputs))
    with torch.no_grad():
        expected = reference(*inputs)
    step = testing.output_scale(reference)
    assert step > 0
    assert float((deployed(*inputs) - expected).abs().max()) <= step * 1.001
    assert deployed.exported.placement.ok, str(deployed.exported.placement)
    placed = deployed.exported.placement.report(converted)
    assert {e.status for e in placed.entries()} <= {"lowered", "float"}  # TensorRT fuses all
    assert_report_says_what_onnxruntime_ran(deployed)
    if FUSED.get(name):
        assert deployed.fused_ops[FUSED[name]] == 1, deployed.optimized_ops
        assert "lowered" in {e.status for e in deployed.report.entries()}


def assert_report_says_what_onnxruntime_ran(deployed: OnnxRuntimeModel) -> None:
    """``lowered`` exactly where onnxruntime's optimized graph runs integer kernels only."""
    for entry in deployed.report.entries():
        kernels = deployed.kernels.get(entry.node, [])
        if entry.status == "lowered":
            assert all(k.integer for k in kernels), (entry.node, [str(k) for k in kernels])
        floats = [k for k in kernels if not k.integer]
        if floats and entry.status == "reference" and entry.reason.bound == "onnxruntime":
            assert entry.reason.code == "qdq_not_fusable"
            assert all(f"{k.onnx_node} as {k.op_type}" in entry.reason.words for k in floats)


def conv_relu_linear() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5)
    ).eval()
    return model, torch.randn(2, 3, 8, 8)


def test_onnx_holds_real_quantize_and_dequantize_nodes_with_per_channel_weights(
    tmp_path: Path,
) -> None:
    model, x = conv_relu_linear()
    path = tmp_path / "model.onnx"
    exported = export_onnx(quantize(model, (x,)), (x,), path)
    written = onnx.load(path)
    onnx.checker.check_model(written)
    ops = [n.op_type for n in written.graph.node]
    # input, conv output, flatten output (sharing the conv's scale); the linear's output is
    # float (#23: int8 in, float out)
    assert ops.count("QuantizeLinear") == 3
    assert ops.count("DequantizeLinear") == 5  # the three, plus the two weights
    assert not {"Mul", "Round", "Cast"} & set(ops)  # not decomposed (pytorch#127167)
    initializers = {i.name: i for i in written.graph.initializer}
    weights = [
        n
        for n in written.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in initializers
    ]
    assert len(weights) == 2
    for node in weights:
        assert initializers[node.input[0]].data_type == onnx.TensorProto.INT8
        assert {a.name: a.i for a in node.attribute} == {"axis": 0}
        assert onnx.numpy_helper.to_array(initializers[node.input[2]]).any() == 0  # symmetric
    assert exported.path == path
    assert exported.placement.ok


def test_export_leaves_the_users_model_as_it_was() -> None:
    model, x = conv_relu_linear()
    converted = quantize(model, (x,))
    before = copy.deepcopy(converted.state_dict())
    code = converted.code
    export_onnx(converted, (x,))
    assert converted.code == code
    after = converted.state_dict()
    assert before.keys() == after.keys()
    tensors = [k for k, v in before.items() if isinstance(v, torch.Tensor)]
    assert tensors
    assert all(torch.equal(before[k], after[k]) for k in tensors)


def test_deployed_report_says_onnxruntime_ran_the_conv_relu_and_the_gemm_in_float() -> None:
    model, x = conv_relu_linear()
    converted = quantize(model, (x,))
    deployed = deploy(converted, (x,))
    assert isinstance(deployed, OnnxRuntimeModel)
    placed = {e.node: e.status for e in deployed.exported.placement.report(converted).entries()}
    assert placed["_0"] == "lowered"  # conv + bn + relu, one TensorRT layer
    assert placed["_4"] == "lowered"
    # onnxruntime: a ReLU between the conv and its QuantizeLinear is a float FusedConv (a
    # symmetric grid's relu is no clamp it can drop); a float-output Gemm stays Gemm
    statuses = {e.node: e for e in deployed.report.entries()}
    assert [str(k) for k in deployed.kernels["_0"]] == ["node_conv2d FusedConv (float)"]
    assert statuses["_0"].status == "reference"
    assert "node_conv2d as FusedConv in float" in statuses["_0"].reason.words
    assert [k.op_type for k in deployed.kernels["_4"]] == ["Gemm"]
    assert statuses["_4"].status == "reference"
    assert not deployed.fused_ops
    assert deployed.kernel_summary().splitlines() == [
        "onnxruntime ran 1 of 3 int8 nodes on integers only",
        "  _0: node_conv2d FusedConv (float)",
        "  _3: node_view Reshape (int8)",
        "  _4: node_linear Gemm (float)",
    ]
    # the classifier: int8 in (both inputs dequantized), float out, no Q/DQ after it (#23)
    graph = deployed.exported.model.graph
    producers = {out: n for n in graph.node for out in n.output}
    gemm = next(n for n in graph.node if n.op_type == "Gemm")
    assert [producers[i].op_type for i in gemm.input[:2]] == ["DequantizeLinear"] * 2
    assert not [n for n in graph.node if gemm.output[0] in n.input]  # the model's output


def residual() -> tuple[nn.Module, torch.Tensor]:
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
            self.conv = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.stem(x)
            return torch.relu(self.conv(y) + y)

    torch.manual_seed(0)
    return Residual().eval(), torch.randn(2, 3, 8, 8)


def test_a_residual_add_gets_qdq_on_both_inputs_and_onnxruntime_fuses_it() -> None:
    model, x = residual()
    deployed = deploy(quantize(model, (x,)), (x,))
    graph = deployed.exported.model.graph
    producers = {out: n for n in graph.node for out in n.output}
    add = next(n for n in graph.node if n.op_type == "Add")
    assert [producers[i].op_type for i in add.input] == ["DequantizeLinear"] * 2
    assert deployed.exported.placement.ok
    assert deployed.fused_ops["QLinearConv"] >= 1


def bypass_dequantize(model: onnx.ModelProto, consumer: str, position: int) -> None:
    """Feed ``consumer``'s input ``position`` with what its Q/DQ pair quantized (drop the pair)."""
    producers = {out: n for n in model.graph.node for out in n.output}
    node = next(n for n in model.graph.node if n.op_type == consumer)
    dequantize = producers[node.input[position]]
    quantize_node = producers[dequantize.input[0]]
    node.input[position] = quantize_node.input[0]


def test_a_missing_qdq_on_one_branch_of_an_add_is_reported_with_the_node_and_source() -> None:
    model, x = residual()
    converted = quantize(model, (x,))
    exported = export_onnx(converted, (x,))
    broken = copy.deepcopy(exported.model)
    bypass_dequantize(broken, "Add", 1)  # the identity branch: the stem's relu, float
    placement = check_placement(broken, exported.origins, sources=exported.sources)
    assert [f.problem for f in placement.findings] == ["missing_qdq"]
    finding = placement.findings[0]
    assert finding.node == "add"
    assert "input 1" in finding.words
    assert "Relu" in finding.words  # names what feeds it without Q/DQ
    assert "test_tensorrt_onnx.py:" in finding.words  # the user's source line
    entry = placement.report(converted).entry("add")
    assert (entry.status, entry.reason.code) == ("reference", "qdq_not_fusable")
    assert placement.report(converted).entry("conv").status == "lowered"


def test_a_conv_feeding_an_add_directly_is_tensorrts_residual_fusion() -> None:
    model, x = residual()
    exported = export_onnx(quantize(model, (x,)), (x,))
    fused = copy.deepcopy(exported.model)
    bypass_dequantize(fused, "Add", 0)  # conv -> add: TensorRT fuses the add into the conv
    assert check_placement(fused, exported.origins).ok


def test_concat_inputs_on_different_scales_are_reported() -> None:
    converted, _, inputs = testing.quantize_case("tensorrt", CASES["cat"], (2, 4, 4, 6))
    exported = export_onnx(converted, tuple(inputs))
    model = copy.deepcopy(exported.model)
    producers = {out: n for n in model.graph.node for out in n.output}
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    dequantize = producers[concat.input[0]]
    other = onnx.numpy_helper.from_array(
        onnx.numpy_helper.to_array(
            next(i for i in model.graph.initializer if i.name == dequantize.input[1])
        )
        * 2,
        "doubled_scale",
    )
    model.graph.initializer.append(other)
    dequantize.input[1] = "doubled_scale"
    placement = check_placement(model, exported.origins)
    assert [f.problem for f in placement.findings] == ["scale_mismatch"]


def mapping_with(
    activation: Callable[..., object] | None = None, weight: Callable[..., object] | None = None
) -> fxquant.QConfigMapping:
    default = fxquant.get_default_qconfig_mapping("tensorrt").global_qconfig
    qconfig = fxquant.QConfig(
        activation=activation or default.activation, weight=weight or default.weight
    )
    return fxquant.QConfigMapping().set_global(qconfig)


def test_an_asymmetric_qconfig_is_refused_at_prepare_with_reason_zero_point() -> None:
    from fxquant.numerics.observer import MinMaxObserver

    model, x = conv_relu_linear()
    asymmetric = MinMaxObserver.with_args(dtype=torch.int8, quant_min=-128, quant_max=127)
    converted = quantize(model, (x,), mapping=mapping_with(activation=asymmetric))
    entry = fxquant.explain(converted, show=False).entry("_0")
    assert (entry.status, entry.reason.code) == ("skipped", "zero_point")
    assert "symmetric" in entry.reason.words
    assert export_onnx(converted, (x,)).placement.ok  # a float model: nothing to fuse


def test_asymmetric_qdq_of_another_backend_is_reported_and_strict_refuses_it() -> None:
    from fxquant.numerics.observer import MinMaxObserver
    from fxquant_tensorrt.placement import UnfusableQDQError

    model, x = conv_relu_linear()
    asymmetric = MinMaxObserver.with_args(dtype=torch.int8, quant_min=-128, quant_max=127)
    mapping = mapping_with(activation=asymmetric)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=REFERENCE)  # it takes it
    prepared(x)
    converted = fxquant.convert_to_reference_fx(prepared)
    deployed = deploy(converted, (x,))  # onnxruntime runs it: the numbers are right ...
    with torch.no_grad():
        assert (deployed(x) - converted(x)).abs().max() <= 2 * testing.output_scale(converted)
    findings = deployed.exported.placement.findings
    assert {f.problem for f in findings} == {"zero_point"}  # ... but TensorRT has no zero point
    assert {f.node for f in findings} == {"_0", "_3", "_4"}
    entry = deployed.report.entry("_0")
    assert (entry.status, entry.reason.code) == ("reference", "qdq_not_fusable")
    assert "zero point" in entry.reason.words
    with pytest.raises(UnfusableQDQError, match=r"\[zero_point\]"):
        export_onnx(converted, (x,), strict=True)


def test_uint8_qdq_is_reported_as_not_int8() -> None:
    model, x = conv_relu_linear()
    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=REFERENCE)
    prepared(x)
    placement = export_onnx(fxquant.convert_fx(prepared), (x,)).placement
    assert {f.problem for f in placement.findings} == {"not_int8"}


def test_weights_quantized_along_the_input_channel_are_reported() -> None:
    from fxquant.numerics.observer import PerChannelMinMaxObserver

    model, x = conv_relu_linear()
    wrong_axis = PerChannelMinMaxObserver.with_args(
        ch_axis=1,
        dtype=torch.int8,
        qscheme=torch.per_channel_symmetric,
        quant_min=-127,
        quant_max=127,
    )
    converted = quantize(model, (x,), mapping=mapping_with(weight=wrong_axis))
    placement = export_onnx(converted, (x,)).placement
    assert {f.problem for f in placement.findings} == {"weight_axis"}
    assert {f.node for f in placement.findings} == {"_0", "_4"}


def test_a_range_narrower_than_int8_exports_a_clip_and_is_reported() -> None:
    # fxquant stores activations on the dtype's full range; a hand-edited reference model
    # (or another tool's) may not: its -127..127 steps become QuantizeLinear + Clip
    model, x = conv_relu_linear()
    converted = quantize(model, (x,))
    quantize_op = torch.ops.fxquant.quantize_per_tensor.default
    for node in converted.graph.nodes:
        if node.target == quantize_op:
            node.args = (*node.args[:3], -127, *node.args[4:])
    converted.recompile()
    deployed = deploy(converted, (x,))
    assert "Clip" in [n.op_type for n in deployed.exported.model.graph.node]
    with torch.no_grad():
        assert (deployed(x) - converted(x)).abs().max() <= testing.output_scale(converted) * 1.001
    assert "narrow_range" in {f.problem for f in deployed.exported.placement.findings}


def test_a_dynamically_quantized_node_is_refused_by_name() -> None:
    from fxquant.config import defaults

    model = nn.Sequential(nn.Linear(4, 3)).eval()
    x = torch.randn(2, 4)
    mapping = fxquant.QConfigMapping().set_object_type(nn.Linear, defaults.default_dynamic_qconfig)
    prepared = fxquant.prepare_fx(
        model, mapping, (x,), backend_config=REFERENCE
    )  # has dynamic linear
    converted = fxquant.convert_to_reference_fx(prepared)
    with pytest.raises(ExportError, match=r"node '_0'.*dynamically"):
        export_onnx(converted, (x,))


def test_an_op_without_an_onnx_translation_is_a_clear_export_error() -> None:
    library = torch.library.Library("fxquant_trt_test", "FRAGMENT")  # an op ONNX cannot know
    library.define("opaque(Tensor x) -> Tensor")
    library.impl("opaque", lambda x: x.clone(), "CompositeExplicitAutograd")
    library.impl("opaque", lambda x: torch.empty_like(x), "Meta")

    class Opaque(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.fxquant_trt_test.opaque(torch.relu(x))

    x = torch.randn(2, 4)
    converted = quantize(Opaque().eval(), (x,))
    with pytest.raises(ExportError, match=r"torch\.onnx could not translate"):
        export_onnx(converted, (x,))


def test_a_model_that_is_not_converted_is_refused() -> None:
    with pytest.raises(ConfigTypeError, match="convert"):
        export_onnx(nn.Linear(2, 2), (torch.randn(1, 2),))


def test_a_dynamic_batch_takes_any_batch_and_a_static_export_says_how_to_get_one() -> None:
    model, x = conv_relu_linear()
    converted = quantize(model, (x,))
    batch = torch.export.Dim("batch", min=1, max=256)
    dynamic = deploy(converted, (x,), dynamic_shapes=({0: batch},))
    step = testing.output_scale(converted)
    with torch.no_grad():
        for size in (1, 5, 64):
            y = torch.randn(size, 3, 8, 8)
            assert dynamic(y).shape == (size, 5)
            assert (dynamic(y) - converted(y)).abs().max() <= step * 1.001
    static = deploy(converted, (x,))
    with pytest.raises(ValueError, match=r"shape \(5, 3, 8, 8\).*dynamic_shapes"):
        static(torch.randn(5, 3, 8, 8))


def test_a_saved_dynamic_batch_model_loads_with_its_report_and_takes_any_batch(
    tmp_path: Path,
) -> None:
    model, x = conv_relu_linear()
    converted = quantize(model, (x,))
    batch = torch.export.Dim("batch", min=1, max=256)
    deployed = deploy(converted, (x,), dynamic_shapes=({0: batch},))
    path = deployed.save(tmp_path / "model.onnx")
    assert onnx.load(str(path)).graph.node  # what TensorRT's parser reads
    loaded = OnnxRuntimeModel.load(path)
    assert fxquant.explain(loaded, show=False).table() == deployed.report.table()
    for size in (1, 7):
        y = torch.randn(size, 3, 8, 8)
        assert torch.equal(loaded(y), deployed(y))


def test_every_fxquant_quantize_and_dequantize_op_has_an_onnx_translation() -> None:
    from fxquant.lowering import PER_TOKEN_OPS, QDQ_OPS
    from fxquant_tensorrt.translation import translation_table

    # per-token steps come only from a dynamic qconfig, which tensorrt's patterns refuse
    # (TensorRT's explicit quantization has static scales): they never reach this exporter
    assert set(translation_table()) == set(QDQ_OPS) - PER_TOKEN_OPS


def test_a_dynamic_per_token_linear_stays_float_on_tensorrt_with_the_reason() -> None:
    dynamic_qconfig = pytest.importorskip("fxquant_executorch.qconfig").dynamic_qconfig
    model, x = nn.Sequential(nn.Linear(8, 8)).eval(), torch.randn(2, 8)
    mapping = fxquant.QConfigMapping().set_object_type(nn.Linear, dynamic_qconfig())
    config = fxquant.get_backend_config("tensorrt")
    reference = fxquant.convert_to_reference_fx(
        fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    )
    (skipped,) = [e for e in fxquant.explain(reference, show=False).entries() if e.reason]
    assert skipped.reason.code == "is_dynamic"


def test_a_transformer_deployed_report_says_what_onnxruntime_ran() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    x = torch.randn(2, 6, 32)
    deployed = deploy(quantize(model, (x,)), (x,))
    assert_report_says_what_onnxruntime_ran(deployed)
    lines = deployed.kernel_summary().splitlines()
    ran = {line.split(":")[0].strip(): line for line in lines[1:]}
    lowered = [e.node for e in deployed.report.entries() if e.status == "lowered"]
    assert lowered  # attention's int8 matmuls: onnxruntime's QLinearMatMul
    assert all("(float)" not in ran[node] for node in lowered), lines
    assert sum(deployed.fused_ops.values()) >= 1, deployed.optimized_ops
    assert f"ran {len(lowered)} of " in lines[0], lines
