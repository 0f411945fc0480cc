"""The default QConfigMapping of the qnnpack backend.

PTQ: histogram observers on full-range uint8 activations (QNNPACK does not
saturate like fbgemm, so the 8th bit is kept) with ``eps = 2**-12`` so no scale
falls under the kernels' lower bound, and symmetric per-channel int8 weights in
-127..127 (QNNPACK's conv and linear take per-channel scales; the symmetric
range keeps the weight zero point at 0). QAT: moving-average fake-quantize on
the same ranges. Fixed-qparams ops (sigmoid, tanh, ...) get
their exact grids; transposed convs per-tensor weights; layer norm float weights
(see :func:`fxquant_quantized_engine.engine_default_qconfig_mapping`).
"""

from __future__ import annotations

from typing import Any

import torch
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant_quantized_engine import engine_default_qconfig_mapping

_EPS = 2**-12
_ACTIVATION: dict[str, Any] = {"dtype": torch.uint8, "quant_min": 0, "quant_max": 255, "eps": _EPS}
_WEIGHT: dict[str, Any] = {"dtype": torch.int8, "quant_min": -127, "quant_max": 127, "eps": _EPS}


def default_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """The mapping ``fxquant.get_default_qconfig_mapping("qnnpack", is_qat)`` returns.

    Example:
        >>> qconfig = default_qconfig_mapping().global_qconfig
        >>> qconfig.activation().quant_max, qconfig.weight().qscheme
        (255, torch.per_channel_symmetric)
    """
    return engine_default_qconfig_mapping(is_qat, activation=_ACTIVATION, weight=_WEIGHT)
