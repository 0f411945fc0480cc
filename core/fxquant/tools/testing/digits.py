"""scikit-learn's handwritten digits: real data for accuracy tests, with no download.

Example:
    >>> data = Digits(torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), torch.rand(2, 1, 8, 8),
    ...               torch.tensor([0, 0]))
    >>> digits_accuracy(lambda x: torch.tensor([[1.0, 0.0]] * len(x)), data)
    100.0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "Digits",
    "digits_accuracy",
    "load_digits",
    "train_digits_classifier",
]


@dataclass(frozen=True)
class Digits:
    """sklearn's handwritten digits, split once: images (N, 1, 8, 8) in [0, 1], int64 labels.

    Real data with no download (scikit-learn ships the images), for the accuracy
    tests every backend runs: a float CNN and its int8 forms on the same split.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def load_digits(train: int = 1400) -> Digits:
    """The digits shuffled with a fixed seed: ``train`` images to train on, the rest to test.

    Raises:
        ImportError: scikit-learn is not installed (tests ``importorskip`` it first).

    Example:
        >>> data = load_digits()  # doctest: +SKIP
        >>> data.test_x.shape  # doctest: +SKIP
        torch.Size([397, 1, 8, 8])
    """
    # a test extra, not a dependency of fxquant (and it ships no type information)
    from sklearn import datasets  # type: ignore[import-untyped,import-not-found,unused-ignore]

    data = datasets.load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    # shuffled once: the file is ordered by writer, and the test split must not be one writer
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    images, labels = images[order], labels[order]
    return Digits(images[:train], labels[:train], images[train:], labels[train:])


def train_digits_classifier(
    model: nn.Module, data: Digits, *, steps: int = 400, lr: float = 0.01, batch: int = 64
) -> nn.Module:
    """Adam on random batches of ``data``'s training split, fixed seed; returns ``model`` in eval.

    Example:
        >>> data = Digits(torch.rand(8, 1, 8, 8), torch.arange(8) % 2, torch.rand(2, 1, 8, 8),
        ...               torch.tensor([0, 1]))
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(64, 2))
        >>> train_digits_classifier(net, data, steps=2, batch=4).training
        False
    """
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        chosen = torch.randint(0, len(data.train_x), (batch,))
        loss = F.cross_entropy(model(data.train_x[chosen]), data.train_y[chosen])
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
    return model.eval()


def digits_accuracy(run: Callable[[torch.Tensor], torch.Tensor], data: Digits) -> float:
    """Top-1 accuracy in percent of ``run`` (a model, or a deployed one) on the test split.

    Example:
        >>> data = Digits(torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), torch.rand(2, 1, 8, 8),
        ...               torch.tensor([0, 0]))
        >>> digits_accuracy(lambda x: torch.tensor([[1.0, 0.0]] * len(x)), data)
        100.0
    """
    with torch.no_grad():
        return float((run(data.test_x).argmax(1) == data.test_y).float().mean()) * 100
