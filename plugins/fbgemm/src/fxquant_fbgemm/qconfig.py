"""The default QConfigMapping of the fbgemm backend.

PTQ: histogram observers on 7-bit activations (``reduce_range``: fbgemm's
uint8 x int8 products saturate int16 pairs on full-range inputs, and its
depthwise conv loses 57-74 steps there), 8-bit ones on the inputs of Linear,
whose GEMM stays exact on them (#23), and symmetric per-channel int8
weights (fbgemm's conv and linear take per-channel scales). QAT: moving-average
fake-quantize on the same ranges (0..127). Fixed-qparams ops (sigmoid, tanh, ...) get
their exact grids; transposed convs per-tensor weights; layer norm float weights
(see :func:`fxquant_quantized_engine.engine_default_qconfig_mapping`).

Weights are -128..127 on CPUs with VNNI or AMX and 7 bits (-63..63) on CPUs
without (``fxquant.kernels.cpu``, asked when the mapping is built): there FBGEMM
adds pairs of u8 x s8 products in int16 with saturation, and the 7-bit activations
do not prevent it (a value beyond the calibrated range is stored up to 255, and
fixed-qparams ops such as tanh and sigmoid use the full 0..255); weights within
+-64 keep its GEMMs exact for every input. The lowering rules decline larger
weights there (``fxquant.explain`` says why).
"""

from __future__ import annotations

from typing import Any

import torch
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering.kernels import cpu
from fxquant_quantized_engine import engine_default_qconfig_mapping

_ACTIVATION: dict[str, Any] = {"dtype": torch.uint8, "reduce_range": True}
_WEIGHT: dict[str, Any] = {"dtype": torch.int8, "quant_min": -128, "quant_max": 127}
# fake-quantize takes the 7-bit range explicitly
_QAT_ACTIVATION: dict[str, Any] = {"dtype": torch.uint8, "quant_min": 0, "quant_max": 127}
# Linear inputs use all 8 bits (#23): its GEMM is exact on them (int32 sums with VNNI,
# 7-bit weights without), and the 8th bit is what takes a BERT from 0.976 to 0.993
_LINEAR_ACTIVATION: dict[str, Any] = {"dtype": torch.uint8, "quant_min": 0, "quant_max": 255}


def default_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """The mapping ``fxquant.get_default_qconfig_mapping("fbgemm", is_qat)`` returns.

    Example:
        >>> qconfig = default_qconfig_mapping().global_qconfig
        >>> qconfig.activation().quant_max, qconfig.weight().qscheme
        (127, torch.per_channel_symmetric)
        >>> qconfig.weight().quant_max == (127 if cpu.has_vnni() else 63)
        True
        >>> default_qconfig_mapping().qconfig_for("", torch.nn.Linear).activation().quant_max
        255
    """
    weight = dict(_WEIGHT)
    if not cpu.has_vnni():
        weight["quant_min"], weight["quant_max"] = cpu.SEVEN_BIT_WEIGHT
    return engine_default_qconfig_mapping(
        is_qat,
        activation=_ACTIVATION,
        weight=weight,
        qat_activation=_QAT_ACTIVATION,
        linear_activation=_LINEAR_ACTIVATION,
    )
