"""Numerics: quantize/dequantize on integer tensors, observers, fake quantize, and the debugger.

- :mod:`fxquant.numerics.qdq`, :mod:`~fxquant.numerics.observer`,
  :mod:`~fxquant.numerics.fake_quantize`: the mechanism (``fxquant.observer`` and
  ``fxquant.fake_quantize`` are the documented paths of the last two);
- ``EqualizationQConfig``, ``default_equalization_qconfig`` and the two equalization
  observers, for ``prepare_fx(..., _equalization_config=...)``: they live with the rest of
  input-weight equalization in :mod:`fxquant.flow.equalization`;
- :func:`compare`, :func:`fallback`, :func:`choose_precision` (with ``Budget``,
  ``Comparison``, ``NodeError``, ``FallbackResult``, ``FallbackStep``, ``PrecisionChoice``,
  ``PrecisionResult``): the numerics debugger, float fallback and the per-node precision
  chooser, tools that live in :mod:`fxquant.tools.debug`.

The names that live elsewhere load on first use: the flow imports this package's modules
(an eager import of the flow here would be a cycle), and importing the mechanism never
loads the tools.

Example:
    >>> from fxquant.numerics import compare, default_equalization_qconfig, fallback
    >>> compare.__module__, fallback.__module__
    ('fxquant.tools.debug.compare', 'fxquant.tools.debug.fallback')
    >>> type(default_equalization_qconfig).__name__
    'EqualizationQConfig'
"""

from __future__ import annotations

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


def __getattr__(name: str) -> object:
    """The names that live in the flow or the tools, loaded on first use (PEP 562)."""
    if name not in __all__:
        msg = f"module 'fxquant.numerics' has no attribute {name!r}"
        raise AttributeError(msg)
    from fxquant.flow import equalization  # why: the flow imports numerics: a cycle if eager

    value: object
    if name in equalization.__all__:
        value = getattr(equalization, name)
    else:  # the rest of __all__ is the numerics debugger's
        from fxquant.tools import debug  # why: a tool above the mechanism, loaded when asked for

        value = getattr(debug, name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
