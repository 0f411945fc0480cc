"""Numerics: q/dq, observers, fake quantize, input-weight equalization.

- :mod:`fxquant.numerics.qdq`, :mod:`~fxquant.numerics.observer`,
  :mod:`~fxquant.numerics.fake_quantize`: the mechanism (``fxquant.observer`` and
  ``fxquant.fake_quantize`` are the documented paths of the last two);
- :mod:`fxquant.numerics.equalization`: ``default_equalization_qconfig`` and its observers,
  for ``prepare_fx(..., _equalization_config=...)``;
- :func:`compare`, :func:`fallback`, :func:`choose_precision` (with ``Budget``,
  ``Comparison``, ``NodeError``, ``FallbackResult``, ``FallbackStep``, ``PrecisionChoice``,
  ``PrecisionResult``): the numerics debugger and float fallback, tools that
  live in :mod:`fxquant.tools.debug` and keep this documented path. They load on first
  use, so importing the mechanism never loads the tools.

Example:
    >>> from fxquant.numerics import compare, fallback
    >>> compare.__module__, fallback.__module__
    ('fxquant.tools.debug.compare', 'fxquant.tools.debug.fallback')
"""

from __future__ import annotations

from fxquant.numerics.equalization import (
    EqualizationQConfig,
    InputEqualizationObserver,
    WeightEqualizationObserver,
    default_equalization_qconfig,
)

# the debugger's names, kept at their documented path; they live in fxquant.tools.debug
_DEBUG_NAMES = frozenset(
    {
        "Budget",
        "Comparison",
        "FallbackResult",
        "FallbackStep",
        "NodeError",
        "PrecisionChoice",
        "PrecisionResult",
        "choose_precision",
        "compare",
        "fallback",
    }
)


def __getattr__(name: str) -> object:
    """The debugger's names (:mod:`fxquant.tools.debug`), loaded on first use (PEP 562)."""
    if name not in _DEBUG_NAMES:
        msg = f"module 'fxquant.numerics' has no attribute {name!r}"
        raise AttributeError(msg)
    from fxquant.tools import debug  # why: a tool above the mechanism, loaded only when asked for

    value: object = getattr(debug, name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_DEBUG_NAMES})


__all__ = [
    "Budget",
    "Comparison",
    "EqualizationQConfig",
    "FallbackResult",
    "FallbackStep",
    "InputEqualizationObserver",
    "NodeError",
    "PrecisionChoice",
    "PrecisionResult",
    "WeightEqualizationObserver",
    "choose_precision",
    "compare",
    "default_equalization_qconfig",
    "fallback",
]
