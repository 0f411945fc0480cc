"""Numerics tools (#21 layout, #23): input-weight equalization, a per-node debugger, float fallback.

- :mod:`fxquant.numerics.equalization`: ``default_equalization_qconfig`` and its observers,
  for ``prepare_fx(..., _equalization_config=...)``;
- :func:`compare`: per quantized node, the SQNR of its output against the float model's
  (accumulated) and of the node alone fed the float model's inputs (local);
- :func:`fallback`: keep the most sensitive nodes float, fewest first, until a budget holds.
"""

from __future__ import annotations

from fxquant.numerics.budget import Budget
from fxquant.numerics.compare import compare
from fxquant.numerics.comparison import Comparison, NodeError
from fxquant.numerics.equalization import (
    EqualizationQConfig,
    InputEqualizationObserver,
    WeightEqualizationObserver,
    default_equalization_qconfig,
)
from fxquant.numerics.fallback import fallback
from fxquant.numerics.fallback_report import FallbackResult, FallbackStep

__all__ = [
    "Budget",
    "Comparison",
    "EqualizationQConfig",
    "FallbackResult",
    "FallbackStep",
    "InputEqualizationObserver",
    "NodeError",
    "WeightEqualizationObserver",
    "compare",
    "default_equalization_qconfig",
    "fallback",
]
