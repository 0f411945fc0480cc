"""Accuracy on real data (issue 5): sklearn's handwritten digits through every CPU backend.

A small CNN (conv-bn-relu x2, pool, linear; the zoo's ``SmallCNN``) is trained in
float once per module with a fixed seed on one thread (a few seconds). Each
installed first-party backend then quantizes it with its own default mapping
(static PTQ, lowered by ``convert_fx`` to the backend's kernels), and one
backend also fine-tunes it with QAT. The int8 test accuracy must stay within
one point of float's on the 397 held-out images (one point is four images), and
``explain`` must show both convolutions and the linear layer lowered to kernels.

scikit-learn ships the images inside its package (no download); the module is
skipped without it (it is in the ``test`` extra).
"""

from __future__ import annotations

import copy

import fxquant
import pytest
import torch
from fxquant.tools import testing
from fxquant.tools.testing import Digits
from torch import nn

from tests.flow.zoo import SmallCNN, seeded

TRAIN = 1400
FLOAT_STEPS = 400
QAT_STEPS = 150
BATCH = 64
CALIBRATION = 512
WEIGHTED = ("conv1", "conv2", "fc")  # the fused conv-bn-relu nodes and the classifier

pytestmark = pytest.mark.slow  # trains a model (a few seconds on one thread)


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy in percent."""
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item() * 100


def train(model: nn.Module, data: Digits, steps: int, lr: float) -> nn.Module:
    """Adam on random batches of the training split, fixed seed; returns the model in eval mode."""
    return testing.train_digits_classifier(model, data, steps=steps, lr=lr, batch=BATCH)


@pytest.fixture(scope="module")
def digits() -> Digits:
    pytest.importorskip("sklearn.datasets")
    return testing.load_digits(TRAIN)


@pytest.fixture(scope="module")
def float_model(digits: Digits) -> nn.Module:
    """The float CNN, trained once for the module (one thread: a few seconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(seeded(SmallCNN), digits, FLOAT_STEPS, lr=0.01)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ptq_models() -> dict[str, torch.fx.GraphModule]:
    """Lowered PTQ models by backend, built on first use (the accuracy and explain tests share)."""
    return {}


def static_ptq(
    backend: str, model: nn.Module, data: Digits, cache: dict[str, torch.fx.GraphModule]
) -> torch.fx.GraphModule:
    """``model`` quantized with ``backend``'s default PTQ mapping and lowered by convert_fx."""
    if backend not in cache:
        config = fxquant.get_backend_config(backend)
        mapping = fxquant.get_default_qconfig_mapping(backend)
        calibration = data.train_x[:CALIBRATION]
        prepared = fxquant.prepare_fx(
            copy.deepcopy(model), mapping, (calibration[:1],), backend_config=config
        )
        with torch.no_grad():
            for chunk in calibration.split(128):
                prepared(chunk)
        cache[backend] = fxquant.convert_fx(prepared, backend_config=config)
    return cache[backend]


def test_static_ptq_with_the_default_mapping_keeps_accuracy_within_one_point_of_float(
    backend: str,
    float_model: nn.Module,
    digits: Digits,
    ptq_models: dict[str, torch.fx.GraphModule],
) -> None:
    torch.set_num_threads(1)
    float_accuracy = accuracy(float_model, digits.test_x, digits.test_y)
    quantized = static_ptq(backend, float_model, digits, ptq_models)
    int8_accuracy = accuracy(quantized, digits.test_x, digits.test_y)
    print(f"digits {backend} PTQ: float {float_accuracy:.2f}%, int8 {int8_accuracy:.2f}%")

    assert float_accuracy > 90, "the float model did not learn the task: the test proves nothing"
    assert abs(int8_accuracy - float_accuracy) <= 1.0, (
        f"{backend} static PTQ: int8 {int8_accuracy:.2f}% vs float {float_accuracy:.2f}%"
    )


def test_explain_shows_both_convs_and_the_linear_lowered_to_kernels(
    backend: str,
    float_model: nn.Module,
    digits: Digits,
    ptq_models: dict[str, torch.fx.GraphModule],
) -> None:
    quantized = static_ptq(backend, float_model, digits, ptq_models)
    entries = {entry.node: entry for entry in fxquant.explain(quantized, show=False).entries()}

    statuses = {node: entries[node].status if node in entries else None for node in WEIGHTED}
    assert statuses == dict.fromkeys(WEIGHTED, "lowered"), (
        f"{backend}: {statuses}\n{fxquant.explain(quantized, show=False)}"
    )


def test_qat_fine_tuning_converts_within_one_point_of_float(
    qat_backend: str, float_model: nn.Module, digits: Digits
) -> None:
    torch.set_num_threads(1)
    config = fxquant.get_backend_config(qat_backend)
    mapping = fxquant.get_default_qconfig_mapping(qat_backend, is_qat=True)
    source = copy.deepcopy(float_model).train()
    prepared = fxquant.prepare_qat_fx(source, mapping, (digits.train_x[:2],), backend_config=config)
    trained = train(prepared, digits, QAT_STEPS, lr=0.001)
    quantized = fxquant.convert_fx(trained, backend_config=config)

    float_accuracy = accuracy(float_model, digits.test_x, digits.test_y)
    int8_accuracy = accuracy(quantized, digits.test_x, digits.test_y)
    print(f"digits {qat_backend} QAT: float {float_accuracy:.2f}%, int8 {int8_accuracy:.2f}%")
    assert abs(int8_accuracy - float_accuracy) <= 1.0, (
        f"{qat_backend} QAT: int8 {int8_accuracy:.2f}% vs float {float_accuracy:.2f}%"
    )
    statuses = {e.node: e.status for e in fxquant.explain(quantized, show=False).entries()}
    assert [statuses.get(node) for node in WEIGHTED] == ["lowered"] * 3, statuses
