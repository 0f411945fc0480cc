"""The numerics debugger and float fallback: tools over the flow, not part of it.

- :func:`compare`: per quantized node, the model output's SQNR gained when it alone runs
  float (its ranking), the SQNR of its output against the float model's (accumulated)
  and of the node alone fed the float model's inputs (local);
- :func:`fallback`: keep the nodes of largest output gain float, fewest first, until a
  budget holds;
- :func:`choose_precision`: int8, bf16 or fp32 per Linear/Conv node, from measured
  per-node timings, under an accuracy budget and a latency budget at once.

Their documented path is ``fxquant.numerics`` (``from fxquant.numerics import compare``),
which gives these same objects; nothing in the flow, configs or registry imports them.

Example:
    >>> import fxquant.numerics, fxquant.tools.debug
    >>> fxquant.numerics.compare is fxquant.tools.debug.compare
    True
"""

from __future__ import annotations

from fxquant.tools.debug.budget import Budget
from fxquant.tools.debug.compare import compare
from fxquant.tools.debug.comparison import Comparison, NodeError
from fxquant.tools.debug.fallback import fallback
from fxquant.tools.debug.fallback_report import FallbackResult, FallbackStep
from fxquant.tools.debug.precision_choice import choose_precision
from fxquant.tools.debug.precision_report import PrecisionChoice, PrecisionResult

__all__ = [
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
]
