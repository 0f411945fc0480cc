"""What :func:`fxquant.numerics.choose_precision` returns: a precision per node, and why."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fxquant.config.qconfig_mapping import QConfigMapping

__all__ = ["PrecisionChoice", "PrecisionResult"]


@dataclass(frozen=True, slots=True)
class PrecisionChoice:
    """One node's precision: what runs, why, and the measured time of each precision offered.

    Example:
        >>> PrecisionChoice("fc", "bf16", "int8 misses the accuracy budget",
        ...                 {"int8": 0.1, "bf16": 0.2, "fp32": 0.4}).chosen_ms
        0.2
    """

    node: str
    precision: str
    """``int8``, ``bf16`` or ``fp32``."""
    why: str
    ms: Mapping[str, float]
    """Measured ms of the node alone in each precision the backend offers it in."""

    @property
    def chosen_ms(self) -> float:
        """The chosen precision's ms."""
        return self.ms[self.precision]


@dataclass(frozen=True)
class PrecisionResult:
    """What :func:`choose_precision` chose, and whether both budgets hold.

    ``qconfig_mapping`` is the user's mapping with an entry per node that does not
    stay int8 (``bfloat16_static_qconfig`` or ``None``); ``model`` is what it
    quantizes to. ``latency_ms`` is the estimate of the whole model: the float
    model's measured time with each node's float32 time replaced by its chosen one
    (only the nodes' sum when the timings were given).
    """

    qconfig_mapping: QConfigMapping
    model: nn.Module
    choices: tuple[PrecisionChoice, ...]
    score: float
    min_score: float
    latency_ms: float
    max_latency_ms: float | None
    fastest_ms: float
    """The estimate with every node at its fastest precision: the least the model can take."""
    verdict: str = field(default="")

    @property
    def met_accuracy(self) -> bool:
        """The score reaches the accuracy budget."""
        return self.score >= self.min_score

    @property
    def met_latency(self) -> bool:
        """The latency estimate is within the latency budget (always, without one)."""
        return self.max_latency_ms is None or self.latency_ms <= self.max_latency_ms

    @property
    def met(self) -> bool:
        """Both budgets hold."""
        return self.met_accuracy and self.met_latency

    def table(self) -> str:
        """Per node: the choice, each precision's ms and why; then the verdict."""
        names = sorted({p for c in self.choices for p in c.ms}, key=_order)
        head = "node".ljust(24) + "".join(f"{n + ' ms':>11}" for n in names)
        lines = [f"{head}  chosen  why"]
        for c in self.choices:
            cells = "".join(f"{c.ms[n]:>11.3f}" if n in c.ms else f"{'-':>11}" for n in names)
            lines.append(f"{c.node:<24}{cells}  {c.precision:<6}  {c.why}")
        lines.append(self.verdict)
        return "\n".join(lines)

    __str__ = table

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able)."""
        return {
            "qconfig_mapping": self.qconfig_mapping.to_json(),
            "choices": [
                {"node": c.node, "precision": c.precision, "why": c.why, "ms": dict(c.ms)}
                for c in self.choices
            ],
            "score": self.score,
            "min_score": self.min_score,
            "latency_ms": self.latency_ms,
            "max_latency_ms": self.max_latency_ms,
            "fastest_ms": self.fastest_ms,
            "met": self.met,
            "verdict": self.verdict,
        }


def _order(precision: str) -> int:
    known = ("int8", "bf16", "fp32")
    return known.index(precision) if precision in known else len(known)


def is_budget(value: object) -> bool:
    """A positive, finite number of ms (not a bool)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
