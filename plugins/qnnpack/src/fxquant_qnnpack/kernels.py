"""The kernels of the ``qnnpack`` backend: PyTorch's quint8 kernels on the qnnpack engine.

Which kernel runs each reference pattern is shared with every quint8 engine
(:func:`fxquant_quantized_engine.lowering_rules`); this backend states its
engine only.
"""

from __future__ import annotations

import fxquant_quantized_engine as quantized_engine
from fxquant.lowering import LoweringRule

from fxquant_qnnpack.patterns import pattern_configs

ENGINE = "qnnpack"


def lowering_rules() -> list[LoweringRule]:
    """One rule per reference pattern of the backend, on the qnnpack engine.

    Example:
        >>> any(rule.name == "qnnpack_linear" for rule in lowering_rules())
        True
    """
    rules: list[LoweringRule] = quantized_engine.lowering_rules(ENGINE, pattern_configs())
    return rules
