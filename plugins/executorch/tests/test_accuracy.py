"""Whole models in ExecuTorch: the zoo's CNNs and transformer, and the digits CNN on real data.

The ResNet-, MobileNetV2- and BERT-like zoo models are quantized with the
backend's default mapping, exported with ``to_executorch`` and run in
ExecuTorch's runtime. XNNPACK rounds like fxquant's reference model but for
ties and the order of its integer arithmetic, so each op is within one step
(``test_patterns.py``); through a whole network those steps can meet, so the
output must stay within two steps of the reference model and its SQNR against
float within half a dB of the reference model's. The digits CNN (trained in
float on one thread, a few seconds) must keep its int8 accuracy in ExecuTorch
within one point of float's on the 397 held-out images.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import fxquant
import pytest
import torch
from fxquant.tools import testing
from fxquant_executorch import to_executorch
from torch import nn

pytestmark = pytest.mark.slow  # exports whole models, trains one

BACKEND = "executorch"
WEIGHTED = ("Conv", "Linear")  # the patterns that must run in XNNPACK in every zoo model


def sqnr_db(signal: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (signal - approximation).pow(2).mean()
    return float(10 * torch.log10(signal.pow(2).mean() / noise)) if noise > 0 else float("inf")


def zoo_case(zoo: ModuleType, name: str) -> tuple[nn.Module, list[tuple[Any, ...]]]:
    """The model and five batches (four to calibrate, the last to compare on)."""
    if name == "bert":
        model = zoo.seeded(zoo.BertLike)
        return model.eval(), [zoo.bert_inputs(model.vocab, seed) for seed in range(5)]
    build = {"resnet": zoo.ResNetLike, "mobilenet_v2": zoo.MobileNetV2Like}[name]
    generator = torch.Generator().manual_seed(0)
    return zoo.seeded(build).eval(), [
        (torch.randn(2, 3, 32, 32, generator=generator),) for _ in range(5)
    ]


@pytest.fixture(scope="module")
def exported(zoo: ModuleType) -> Callable[[str], tuple[Any, ...]]:
    """``exported(name)``: the zoo case's model, batches, converted and reference models and its
    program, quantized and exported once for the module (the BERT's tests share one export)."""
    done: dict[str, tuple[Any, ...]] = {}

    def export(name: str) -> tuple[Any, ...]:
        if name not in done:
            model, batches = zoo_case(zoo, name)
            converted, reference = testing.quantize_model(
                BACKEND, model, [list(b) for b in batches]
            )
            done[name] = (
                model,
                batches,
                converted,
                reference,
                to_executorch(converted, batches[-1]),
            )
        return done[name]

    return export


@pytest.mark.parametrize("name", ["resnet", "mobilenet_v2", "bert"])
def test_zoo_model_in_executorch_matches_the_reference_model(
    exported: Callable[[str], tuple[Any, ...]], name: str, linear_input_step: Callable[..., float]
) -> None:
    model, batches, converted, reference, program = exported(name)
    example = batches[-1]
    with torch.no_grad():
        expected, from_reference = model(*example), reference(*example)
    deployed = program(*example)
    # the BERT's head returns float (dynamic int8 per token, #23): one step of its input
    step = linear_input_step(reference, "head", example) if name == "bert" else 0.0
    step = step or testing.output_scale(reference)
    reference_db, deployed_db = sqnr_db(expected, from_reference), sqnr_db(expected, deployed)
    print(f"{name}: SQNR vs float: reference {reference_db:.1f} dB, .pte {deployed_db:.1f} dB")
    assert float((deployed - from_reference).abs().max()) <= 2 * step * 1.001
    assert deployed_db >= reference_db - 0.5
    entries = fxquant.explain(converted, show=False).entries()
    weighted = {
        e.node for e in entries if e.pattern and ("Conv" in e.pattern or "Linear" in e.pattern)
    }
    statuses = {e.node: e for e in program.report.entries()}
    assert weighted
    assert all(statuses[node].status == "lowered" for node in weighted)
    # nothing quantized is outside XNNPACK without its reason
    for entry in program.report.entries():
        if entry.status == "reference":
            assert entry.reason is not None
            assert entry.reason.code == "not_delegated"


def test_the_transformers_embeddings_are_int8_lookups_in_the_portable_runtime(
    exported: Callable[[str], tuple[Any, ...]],
) -> None:
    *_, program = exported("bert")
    outside = {e.node: e.reason.words for e in program.report.entries() if e.status == "reference"}
    assert set(outside) >= {"words", "positions"}
    assert all("embedding_byte" in outside[node] for node in ("words", "positions"))


def test_digits_in_executorch_stay_within_one_point_of_float(zoo: ModuleType) -> None:
    pytest.importorskip("sklearn.datasets")
    data = testing.load_digits()
    model = testing.train_digits_classifier(zoo.seeded(zoo.SmallCNN), data)
    calibration = [[chunk] for chunk in data.train_x[:512].split(128)]
    converted, _ = testing.quantize_model(BACKEND, model, [*calibration, [data.test_x]])
    program = to_executorch(converted, (data.test_x,))
    float_accuracy = testing.digits_accuracy(model, data)
    pte_accuracy = testing.digits_accuracy(program, data)
    print(f"digits: float {float_accuracy:.2f}%, int8 .pte in ExecuTorch {pte_accuracy:.2f}%")
    assert float_accuracy > 90, "the float model did not learn: the test proves nothing"
    assert abs(pte_accuracy - float_accuracy) <= 1.0
    statuses = {e.node: e.status for e in program.report.entries()}
    assert [statuses[n] for n in ("conv1", "conv2", "fc")] == ["lowered"] * 3
