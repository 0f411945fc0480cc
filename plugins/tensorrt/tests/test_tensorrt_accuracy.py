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

from types import ModuleType
from typing import Any

import pytest
import torch
from fxquant import testing
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
    statuses = {e.node: e.status for e in deployed.report.entries()}
    assert [statuses[n] for n in ("conv1", "conv2", "fc")] == ["lowered"] * 3
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
        ("bert", "QLinearMatMul", 25),
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


def test_the_transformer_mapping_keeps_the_residual_stream_float_and_gains_accuracy(
    zoo: ModuleType, one_thread: None
) -> None:
    from fxquant_tensorrt.qconfig import transformer_qconfig_mapping

    model, example, calibration = zoo_case(zoo, "bert")
    default = quantize(model, example, calibration)
    transformer = quantize(model, example, calibration, mapping=transformer_qconfig_mapping())
    deployed = deploy(transformer, example)
    with torch.no_grad():
        expected = model(*example)
        default_db = sqnr_db(expected, default(*example))
        onnx_db = sqnr_db(expected, deployed(*example))
    print(f"bert: SQNR vs float: default mapping {default_db:.1f} dB, transformer {onnx_db:.1f} dB")
    assert onnx_db > default_db + 1
    # the float adds read dequantized GEMM outputs on purpose: not a placement finding
    assert deployed.exported.placement.ok, str(deployed.exported.placement)
    statuses = {e.node: e.status for e in deployed.report.entries()}
    assert statuses["add_6"] == "float"
    assert "lowered" in statuses.values()
