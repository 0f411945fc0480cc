"""The default QConfigMapping of the fbgemm backend.

PTQ: histogram observers on uint8 activations over all 8 bits (0..255) and symmetric
per-channel int8 weights (fbgemm's conv and linear take per-channel scales). QAT:
moving-average fake-quantize on the same ranges. Fixed-qparams ops (sigmoid, tanh, ...)
get their exact grids; transposed convs per-tensor weights; layer norm float weights
(see :func:`fxquant_quantized_engine.engine_default_qconfig_mapping`).

The weights of convs are 7 bits (-63..63) on every CPU: FBGEMM adds pairs of u8 x s8
products in int16 with saturation on CPUs without VNNI or AMX, and its depthwise conv
does on every CPU (57-74 steps off on full-range inputs with 8-bit weights, with VNNI
too). Weights within +-64 keep every pair below 32767 for any uint8 input
(2 x 255 x 64 = 32640): each kernel is exact against the reference model, whatever the
inputs, even beyond the calibrated range. The weights of Linear are -128..127 where its
GEMM adds in int32 (VNNI, AMX) and 7 bits elsewhere (``fxquant.lowering.kernels.cpu``, asked
when the mapping is built). The lowering rules decline larger weights where they would
saturate (``fxquant.explain`` says why).

torch.ao's fbgemm recipe, 7-bit activations (``reduce_range``) and 8-bit weights, is
neither exact there (an input beyond the calibrated range is stored up to 255 and
overflows) nor as accurate: the zoo's SQNR against float on an AVX2 CPU
(``python bench/zoo.py --backends fbgemm``), ResNet 33.4 dB against torch.ao's 31.2
(fxquant's former 7-bit activations and weights: 25.9), ResNeXt 37.5 (35.6),
MobileNetV3 40.9 (39.2), RegNet 38.3 (36.8), DenseNet 42.0 (39.8); the 8th activation
bit is worth more than the 8th weight bit (ResNet's reference model: 34.5 dB against
28.9 with torch.ao's ranges).
"""

from __future__ import annotations

from typing import Any

import torch
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering.kernels import cpu
from fxquant_quantized_engine import engine_default_qconfig_mapping

# all 8 bits; fake-quantize takes the range explicitly, so both read it from here
_ACTIVATION: dict[str, Any] = {"dtype": torch.uint8, "quant_min": 0, "quant_max": 255}
_EIGHT_BIT_WEIGHT: dict[str, Any] = {"dtype": torch.int8, "quant_min": -128, "quant_max": 127}


def _seven_bit_weight() -> dict[str, Any]:
    low, high = cpu.SEVEN_BIT_WEIGHT
    return {"dtype": torch.int8, "quant_min": low, "quant_max": high}


def default_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """The mapping ``fxquant.get_default_qconfig_mapping("fbgemm", is_qat)`` returns.

    0..255 activations, -63..63 conv weights; Linear's weights -128..127 on CPUs with
    VNNI or AMX, -63..63 without (module docstring).

    Example:
        >>> import os
        >>> from unittest import mock
        >>> mapping = default_qconfig_mapping()
        >>> qconfig = mapping.global_qconfig
        >>> qconfig.activation().quant_max, qconfig.weight().quant_max
        (255, 63)
        >>> with mock.patch.dict(os.environ, {"FXQUANT_CPU_VNNI": "1"}):
        ...     linear = default_qconfig_mapping().qconfig_for("", torch.nn.Linear)
        >>> linear.weight().quant_max, linear.weight().qscheme
        (127, torch.per_channel_symmetric)
    """
    seven_bit = _seven_bit_weight()
    return engine_default_qconfig_mapping(
        is_qat,
        activation=_ACTIVATION,
        weight=seven_bit,
        linear_weight=_EIGHT_BIT_WEIGHT if cpu.has_vnni() else seven_bit,
    )
