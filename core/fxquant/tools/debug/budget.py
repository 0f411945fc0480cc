"""What a quantized model must reach in :func:`fxquant.numerics.fallback`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxquant.errors import ConfigTypeError

__all__ = ["Budget", "Evaluate", "as_budget", "cosine_score"]

Evaluate = Callable[[nn.Module], float]
"""Scores a quantized model; higher is better."""


@dataclass(frozen=True)
class Budget:
    """What the quantized model must reach: ``evaluate(quantized_model) >= min_score``.

    Args:
        min_score: the lowest acceptable score.
        evaluate: scores a quantized model (higher is better), e.g. accuracy on a
            validation set; ``None`` with :meth:`cosine`, where the mean cosine
            of the outputs to the float model's on the calibration data is scored.

    Raises:
        ConfigTypeError: ``evaluate`` is not callable.

    Example:
        >>> Budget.cosine(0.99).min_score
        0.99
        >>> Budget(0.9, evaluate=lambda model: 0.95).evaluate(None)
        0.95
    """

    min_score: float
    evaluate: Evaluate | None = None

    def __post_init__(self) -> None:
        if self.evaluate is not None and not callable(self.evaluate):
            msg = (
                f"Budget evaluate must be a callable scoring a quantized model, got "
                f"{self.evaluate!r}; use Budget.cosine(min_cosine) to score by cosine to float"
            )
            raise ConfigTypeError(msg)

    @classmethod
    def cosine(cls, min_cosine: float) -> Budget:
        """Mean cosine similarity of the outputs to the float model's, per sample."""
        return cls(float(min_cosine))

    @classmethod
    def accuracy_drop(cls, evaluate: Evaluate, float_score: float, max_drop: float) -> Budget:
        """``evaluate`` may drop at most ``max_drop`` below ``float_score`` (absolute).

        Example:
            >>> Budget.accuracy_drop(lambda m: 0.0, float_score=0.97, max_drop=0.01).min_score
            0.96
        """
        return cls(round(float_score - max_drop, 12), evaluate)


def as_budget(budget: object) -> Budget:
    """``budget`` as a :class:`Budget`: a number is a minimum cosine to float.

    Example:
        >>> as_budget(0.99) == Budget.cosine(0.99)
        True
    """
    if isinstance(budget, (int, float)) and not isinstance(budget, bool):
        return Budget.cosine(float(budget))
    if not isinstance(budget, Budget):
        msg = (
            f"budget must be a fxquant.numerics.Budget or a minimum cosine to float (a number), "
            f"got {budget!r} of type {type(budget).__name__}"
        )
        raise ConfigTypeError(msg)
    return budget


def cosine_score(model: nn.Module, batches: Sequence[tuple[Any, ...]]) -> Evaluate:
    """The mean per-sample cosine of a model's outputs to ``model``'s on ``batches``."""
    with torch.no_grad():
        expected = [model(*b).detach().float() for b in batches]

    def score(quantized: nn.Module) -> float:
        values = []
        with torch.no_grad():
            for batch, want in zip(batches, expected, strict=True):
                got = quantized(*batch).detach().float()
                cos = torch.nn.functional.cosine_similarity(
                    got.reshape(got.shape[0], -1), want.reshape(want.shape[0], -1), dim=1
                )
                values.append(cos)
        return float(torch.cat(values).mean())

    return score
