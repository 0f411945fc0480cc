"""What mybackend supports: data, built with fxquant's shared pattern builders."""

from __future__ import annotations

import torch
from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.patterns import conv_configs, linear_configs

# The kernels take uint8 activations whose scale is at least 2**-12, and int8 weights.
ACTIVATION = DTypeWithConstraints(
    dtype=torch.quint8,
    quant_min_lower_bound=0,
    quant_max_upper_bound=255,
    scale_min_lower_bound=2**-12,
)
WEIGHTED_INT8 = DTypeConfig(
    input_dtype=ACTIVATION,
    output_dtype=ACTIVATION,
    weight_dtype=torch.qint8,
    bias_dtype=torch.float,
)


def pattern_configs() -> list[BackendPatternConfig]:
    """Linear and 2-d conv, with their relu / batch-norm fusions.

    Example:
        >>> len(pattern_configs()) > 0
        True
    """
    return linear_configs([WEIGHTED_INT8]) + conv_configs(
        [WEIGHTED_INT8], dims=(2,), transpose=False
    )
