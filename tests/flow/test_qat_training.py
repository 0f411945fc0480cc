"""Quantization-aware training on a real task (issue 4: "training reduces the loss on a real task,
and the trained model converts").

The task is sklearn's handwritten digits (1,797 8x8 images, 10 classes) when
scikit-learn is installed, else a synthetic task of the same shape (noisy
class prototypes). A small CNN (conv-bn-relu x2, pool, linear) is trained
with a fixed seed, once with fake quantization (``prepare_qat_fx``) and once
in float with the same recipe; the converted QAT model must score within two
points of the float one.
"""

from __future__ import annotations

import copy

import fxquant
import pytest
import torch
from fxquant.flow import convert_to_reference_fx, prepare_qat_fx
from torch import nn

from tests.flow.zoo import SmallCNN, seeded

STEPS = 300
BATCH = 64
TRAIN = 1400


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, 1, 8, 8) in [0, 1] and labels (N,)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return synthetic_digits()
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    # shuffled once: the file is ordered by writer, and the test split must not be one writer
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    return images[order], torch.tensor(data.target, dtype=torch.int64)[order]


def synthetic_digits(count: int = 1797) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten random 8x8 prototypes plus noise: separable, but not in one step."""
    generator = torch.Generator().manual_seed(0)
    prototypes = torch.rand(10, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 10, (count,), generator=generator)
    noise = 0.35 * torch.randn(count, 1, 8, 8, generator=generator)
    return (prototypes[labels] + noise).clamp(0, 1), labels


def train(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Adam, fixed seed, STEPS steps of BATCH samples; returns the loss of each step."""
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    model.train()
    for _ in range(STEPS):
        batch = torch.randint(0, len(images), (BATCH,))
        loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item() * 100


@pytest.mark.slow
def test_qat_training_reduces_the_loss_and_converts_within_two_points_of_float() -> None:
    torch.set_num_threads(1)
    images, labels = digits()
    train_x, train_y = images[:TRAIN], labels[:TRAIN]
    test_x, test_y = images[TRAIN:], labels[TRAIN:]

    float_model = seeded(SmallCNN)
    qat_source = copy.deepcopy(float_model).train()
    train(float_model, train_x, train_y)
    float_accuracy = accuracy(float_model.eval(), test_x, test_y)

    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
    prepared = prepare_qat_fx(qat_source, mapping, (train_x[:2],))
    losses = train(prepared, train_x, train_y)
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert last < 0.3 * first, f"loss {first:.3f} -> {last:.3f}"

    converted = convert_to_reference_fx(prepared.eval())
    int_accuracy = accuracy(converted, test_x, test_y)
    assert float_accuracy > 80.0, f"the float baseline did not learn: {float_accuracy:.1f}%"
    assert int_accuracy >= float_accuracy - 2.0, (
        f"int {int_accuracy:.1f}% vs float {float_accuracy:.1f}%"
    )
    assert abs(int_accuracy - accuracy(prepared, test_x, test_y)) <= 1.0
