"""What the fbgemm backend quantizes: fxquant's quint8-engine patterns with fbgemm's dtypes.

    weighted ops (conv, linear)     uint8 activations, int8 weight (per-channel ok), float bias
    linear                          + dynamic int8 and fp16-weight (fbgemm's fp16 GEMM)
    every other op                  uint8 in and out
    embedding                       weight-only uint8 / int8 / 4-bit

What keeps fbgemm's uint8 x int8 products from saturating their int16 pair sums
is the default qconfig's: 7-bit conv weights with 8-bit activations
(:mod:`fxquant_fbgemm.qconfig`); the rules decline larger weights where they would.
"""

from __future__ import annotations

import torch
from fxquant.config.backend import BackendPatternConfig, DTypeWithConstraints
from fxquant.patterns.generic import dynamic_dtype_configs
from fxquant_quantized_engine import engine_pattern_configs

ACTIVATION = DTypeWithConstraints(dtype=torch.uint8)


def pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the fbgemm backend.

    Example:
        >>> any(c.pattern is torch.nn.Linear for c in pattern_configs())
        True
    """
    return engine_pattern_configs(ACTIVATION, torch.int8, dynamic_dtype_configs())
