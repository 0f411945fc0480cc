"""What the qnnpack backend quantizes: fxquant's quint8-engine patterns with QNNPACK's dtypes.

    weighted ops (conv, linear)     uint8 activations (scale >= 2**-12), int8 weight in
                                    -127..127 (scale >= 2**-12), float bias
    linear                          + dynamic int8 (QNNPACK has no fp16 GEMM)
    every other op                  uint8 in and out, scale >= 2**-12
    fixed-qparams ops               exact scale and zero point (sigmoid 1/256, 0; tanh 2/256, 128)

QNNPACK requantizes with a fixed-point multiplier that loses precision below
a scale of 2**-12, hence ``scale_min_lower_bound``; the full 0..255 range is
allowed (its kernels do not saturate like fbgemm's).
"""

from __future__ import annotations

import torch
from fxquant.config.backend import BackendPatternConfig, DTypeWithConstraints
from fxquant.patterns.generic import dynamic_dtype_configs
from fxquant_quantized_engine import engine_pattern_configs

SCALE_MIN = 2**-12
ACTIVATION = DTypeWithConstraints(
    dtype=torch.uint8,
    quant_min_lower_bound=0,
    quant_max_upper_bound=255,
    scale_min_lower_bound=SCALE_MIN,
)
WEIGHT = DTypeWithConstraints(
    dtype=torch.int8,
    quant_min_lower_bound=-127,
    quant_max_upper_bound=127,
    scale_min_lower_bound=SCALE_MIN,
)
# fixed-qparams ops get their exact grid from the builder, which takes no scale bound
FIXED_ACTIVATION = DTypeWithConstraints(
    dtype=torch.uint8, quant_min_lower_bound=0, quant_max_upper_bound=255
)


def pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the qnnpack backend.

    Example:
        >>> any(c.pattern is torch.nn.Linear for c in pattern_configs())
        True
    """
    # dynamic int8 only: QNNPACK has no fp16 GEMM (quantized::linear_prepack_fp16 raises)
    dynamic = [c for c in dynamic_dtype_configs() if c.weight_dtype == torch.int8]
    return engine_pattern_configs(ACTIVATION, WEIGHT, dynamic, fixed_activation=FIXED_ACTIVATION)
