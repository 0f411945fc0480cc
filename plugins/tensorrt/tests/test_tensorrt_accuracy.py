"""Accuracy in onnxruntime: digits within one point of float; zoo SQNR beside the reference.

The digits CNN (the zoo's ``SmallCNN``) is trained in float on one thread (a few
seconds), quantized with the tensorrt default PTQ mapping, exported to ONNX and
run in onnxruntime: the int8 test accuracy must stay within one point of
float's on the 397 held-out images. The ResNet-, MobileNetV2- and BERT-like zoo
models report the SQNR against float of the ONNX model in onnxruntime beside
the reference model's (PyTorch); the two run the same Q/DQ graph, so they must
agree within a dB or two (onnxruntime rounds ties and divides by the scale
where fxquant multiplies by its inverse).
"""

from __future__ import annotations

import operator
from types import ModuleType
from typing import Any

import fxquant
import pytest
import torch
from fxquant.errors import GraphModeWarning
from fxquant.flow.state import flow_state
from fxquant.tools import testing
from fxquant_tensorrt import deploy
from torch import nn
from trt_helpers import quantize, sqnr_db

pytestmark = pytest.mark.slow  # trains a model


def test_digits_in_onnxruntime_stay_within_one_point_of_float(
    zoo: ModuleType, one_thread: None
) -> None:
    pytest.importorskip("sklearn.datasets")
    data = testing.load_digits()
    model = testing.train_digits_classifier(zoo.seeded(zoo.SmallCNN), data)
    test_x = data.test_x
    calibration = [(chunk,) for chunk in data.train_x[:512].split(128)]
    converted = quantize(model, (test_x,), calibration[:-1])
    deployed = deploy(converted, (test_x,))
    float_accuracy = testing.digits_accuracy(model, data)
    reference_accuracy = testing.digits_accuracy(converted, data)
    onnx_accuracy = testing.digits_accuracy(deployed, data)
    print(
        f"digits: float {float_accuracy:.2f}%, reference int8 {reference_accuracy:.2f}%, "
        f"ONNX int8 in onnxruntime {onnx_accuracy:.2f}%; fused {dict(deployed.fused_ops)}"
    )
    assert float_accuracy > 90, "the float model did not learn: the test proves nothing"
    assert abs(onnx_accuracy - float_accuracy) <= 1.0
    # TensorRT fuses all three (the placement check); onnxruntime runs the float-output
    # classifier GEMM in float, and its report says so
    placed = deployed.exported.placement.report(converted)
    statuses = {e.node: e.status for e in placed.entries()}
    assert [statuses[n] for n in ("conv1", "conv2", "fc")] == ["lowered"] * 3
    assert deployed.report.entry("fc").status == "reference"
    # the classifier's GEMM is int8 in, float out (#23): Q/DQ on its two inputs, none after it
    graph = deployed.exported.model.graph
    producers = {out: n for n in graph.node for out in n.output}
    gemm = next(n for n in graph.node if n.op_type == "Gemm")
    assert [producers[i].op_type for i in gemm.input[:2]] == ["DequantizeLinear"] * 2
    assert not [n for n in graph.node if gemm.output[0] in n.input]


def zoo_case(zoo: ModuleType, name: str) -> tuple[nn.Module, tuple[Any, ...], list[Any]]:
    generator = torch.Generator().manual_seed(0)
    if name == "bert":
        model = zoo.seeded(zoo.BertLike)
        batches = [zoo.bert_inputs(model.vocab, seed) for seed in range(5)]
        return model.eval(), batches[0], batches[1:]
    build = {"resnet": zoo.ResNetLike, "mobilenet_v2": zoo.MobileNetV2Like}[name]
    batches = [(torch.randn(4, 3, 32, 32, generator=generator),) for _ in range(5)]
    return zoo.seeded(build).eval(), batches[0], batches[1:]


@pytest.mark.parametrize(
    ("name", "fused", "least_db"),
    [
        ("resnet", "QLinearConv", 35),
        ("mobilenet_v2", "QLinearConv", 35),
        # the default picks the transformer mode on it (#23): GEMMs int8, matmuls float
        ("bert", "QGemm", 35),
    ],
)
def test_zoo_sqnr_in_onnxruntime_is_reported_beside_the_reference_models(
    zoo: ModuleType, one_thread: None, name: str, fused: str, least_db: float
) -> None:
    model, example, calibration = zoo_case(zoo, name)
    converted = quantize(model, example, calibration)
    deployed = deploy(converted, example)
    with torch.no_grad():
        expected = model(*example)
        reference_db = sqnr_db(expected, converted(*example))
        onnx_db = sqnr_db(expected, deployed(*example))
    print(f"{name}: SQNR vs float: reference {reference_db:.1f} dB, onnxruntime {onnx_db:.1f} dB")
    assert onnx_db > least_db
    assert abs(onnx_db - reference_db) < 2.0
    assert deployed.exported.placement.ok, str(deployed.exported.placement)
    assert deployed.fused_ops[fused] > 0, deployed.optimized_ops


def plain_default() -> tuple[fxquant.QConfigMapping, fxquant.QConfigMapping]:
    """The default mapping and no equalization, each part of the transformer mode decided
    by the user's own entries, which win over the mode's (``fxquant.flow.graph_mode``)."""
    mapping = fxquant.get_default_qconfig_mapping("tensorrt")
    for op in (operator.add, torch.add, torch.matmul, operator.matmul, torch.bmm):
        mapping.set_object_type(op, mapping.global_qconfig)
    none = fxquant.QConfigMapping().set_object_type(nn.Linear, None)
    return mapping, none.set_object_type(nn.functional.linear, None)


def test_the_default_picks_the_transformer_mode_on_a_bert_and_gains_accuracy(
    zoo: ModuleType, one_thread: None
) -> None:
    model, example, calibration = zoo_case(zoo, "bert")
    mapping, equalization = plain_default()
    with pytest.warns(GraphModeWarning, match="not applied, your entries kept: object_type oper"):
        plain = quantize(model, example, calibration, mapping, equalization=equalization)
    default = quantize(model, example, calibration)
    deployed = deploy(default, example)
    with torch.no_grad():
        expected = model(*example)
        plain_db = sqnr_db(expected, plain(*example))
        onnx_db = sqnr_db(expected, deployed(*example))
    print(
        f"bert: SQNR vs float: plain default {plain_db:.1f} dB, transformer mode {onnx_db:.1f} dB"
    )
    assert onnx_db > plain_db + 5
    notes = fxquant.explain(default, show=False).notes()
    assert notes[0].startswith("mode: transformer (4 Linear -> residual add -> LayerNorm blocks")
    assert any(n.startswith("equalized: ") for n in notes)
    plain_notes = fxquant.explain(plain, show=False).notes()
    assert not any(n.startswith("equalized: ") for n in plain_notes)
    assert any(
        n.startswith("mode transformer: not applied (your entries kept)") for n in plain_notes
    )
    # the float adds read dequantized GEMM outputs on purpose: not a placement finding
    assert deployed.exported.placement.ok, str(deployed.exported.placement)
    statuses = {e.node: e.status for e in deployed.exported.placement.report(default).entries()}
    assert statuses["add_6"] == "float"
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert all(statuses[n.replace(".", "_")] == "lowered" for n in linears), statuses


def test_a_cnn_keeps_the_default_mapping(zoo: ModuleType) -> None:
    model, example, calibration = zoo_case(zoo, "resnet")
    converted = quantize(model, example, calibration[:1])
    state = flow_state(converted)
    assert state is not None
    assert state.graph_mode is None
    assert state.qconfig_mapping == fxquant.get_default_qconfig_mapping("tensorrt")
    assert not any(n.startswith("mode:") for n in fxquant.explain(converted, show=False).notes())
