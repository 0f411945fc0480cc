"""What mybackend supports: data, built with fxquant's shared pattern builders."""

from __future__ import annotations

import torch
from fxquant.config.backend import DTypeConfig, DTypeWithConstraints
from fxquant.patterns import conv_configs, linear_configs

# uint8 activations whose scale is at least 2**-12, int8 weights, float bias
ACTIVATION = DTypeWithConstraints(
    dtype=torch.uint8,
    quant_min_lower_bound=0,
    quant_max_upper_bound=255,
    scale_min_lower_bound=2**-12,
)
WEIGHTED_INT8 = DTypeConfig(
    input_dtype=ACTIVATION,
    output_dtype=ACTIVATION,
    weight_dtype=torch.int8,
    bias_dtype=torch.float,
)


def pattern_configs():
    """Linear and 2-d conv, with their relu / batch-norm fusions."""
    return linear_configs([WEIGHTED_INT8]) + conv_configs(
        [WEIGHTED_INT8], dims=(2,), transpose=False
    )
