"""What :func:`fxquant.numerics.fallback` returns: the mapping it chose and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fxquant.config.qconfig_mapping import QConfigMapping

__all__ = ["FallbackResult", "FallbackStep"]


@dataclass(frozen=True)
class FallbackStep:
    """One try: which patterns were float and the score it got."""

    action: str
    """``quantize all``, ``keep float``, ``give back`` (verification)."""
    node: str | None
    score: float
    float_nodes: tuple[str, ...]
    kept: bool = True
    """False for a ``keep float`` try that lowered the score (the pattern stays quantized)
    or a ``give back`` try that broke the budget (the pattern stays float)."""


@dataclass(frozen=True)
class FallbackResult:
    """What :func:`fallback` chose and why.

    ``qconfig_mapping`` is the user's mapping plus a ``None`` entry per float
    pattern; pass it to ``prepare_fx`` (same model, same backend) to get
    ``model`` again, or save it with ``qconfig_mapping.to_json()``. When the
    backend picked a graph mode for the user's default mapping, it is the
    mode's mapping plus those entries, and ``equalization`` the mode's: pass it
    as ``prepare_fx``'s ``_equalization_config`` too.
    """

    qconfig_mapping: QConfigMapping
    model: nn.Module
    float_nodes: tuple[str, ...]
    sensitivity: dict[str, float]
    """Every quantized pattern's output gain (dB) when it alone runs float, largest first
    (``compare``'s ranking; ``-inf`` for one that cannot run float on its own)."""
    steps: tuple[FallbackStep, ...]
    score: float
    met: bool
    entries: tuple[str, ...] = field(default=())
    """The mapping entries added, as text."""
    equalization: QConfigMapping | None = None
    """The ``_equalization_config`` every try used: the backend's graph mode's, or None."""

    def table(self) -> str:
        """The steps as a text table (what ``print(result)`` shows)."""
        lines = ["step  action        node                      score     float nodes"]
        for index, step in enumerate(self.steps):
            mark = "" if step.kept else "  (reverted)"
            lines.append(
                f"{index:<5} {step.action:<13} {step.node or '-':<25} {step.score:<9.4f} "
                f"{len(step.float_nodes)}{mark}"
            )
        verdict = "met" if self.met else "NOT met"
        lines.append(
            f"budget {verdict}: score {self.score:.4f} with float: "
            f"{', '.join(self.float_nodes) or 'none'}"
        )
        return "\n".join(lines)

    __str__ = table

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-able): the mapping as ``to_json`` text, the nodes, scores, steps."""
        return {
            "qconfig_mapping": self.qconfig_mapping.to_json(),
            "float_nodes": list(self.float_nodes),
            "sensitivity": dict(self.sensitivity),
            "score": self.score,
            "met": self.met,
            "steps": [
                {
                    "action": s.action,
                    "node": s.node,
                    "score": s.score,
                    "float_nodes": list(s.float_nodes),
                    "kept": s.kept,
                }
                for s in self.steps
            ],
        }
