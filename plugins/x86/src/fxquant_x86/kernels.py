"""x86's lowering rules: fxquant-onednn's kernels, one rule per x86 pattern."""

from __future__ import annotations

from fxquant.lowering import LoweringRule
from fxquant_onednn.kernels import lowering_rules

from fxquant_x86.patterns import shared_pattern_configs

__all__ = ["x86_lowering_rules"]


def x86_lowering_rules() -> list[LoweringRule]:
    """A oneDNN kernel (or an integer / float op module) for every x86 pattern.

    Dynamic int8 LSTM / GRU / cells: torch's quantized recurrent ops on the ``x86``
    quantized engine (``fxquant_quantized_engine.recurrent``).

    Example:
        >>> len(x86_lowering_rules()) > 100
        True
    """
    return lowering_rules(shared_pattern_configs(), recurrent_engine="x86")
