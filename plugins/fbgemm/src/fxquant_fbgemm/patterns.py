"""What the fbgemm backend quantizes: fxquant's shared pattern builders with fbgemm's dtypes.

    weighted ops (conv, linear)     uint8 activations, int8 weight (per-channel ok), float bias
    linear                          + dynamic int8 and fp16-weight (fbgemm's fp16 GEMM)
    every other op                  uint8 in and out
    embedding                       weight-only uint8 / int8 / 4-bit

The 7-bit activation range fbgemm needs (its uint8 x int8 products saturate
int16 pairs on full-range inputs) is set by the default qconfig
(``reduce_range``), as PyTorch's FBGEMM config does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.patterns import (
    binary_op_configs,
    bn_configs,
    cat_configs,
    conv_configs,
    default_op_configs,
    embedding_configs,
    fixed_qparams_op_configs,
    linear_configs,
    ln_configs,
    matmul_configs,
    rnn_configs,
    share_qparams_op_configs,
    tensor_info_op_configs,
)
from fxquant.patterns.reference import dynamic_dtype_configs, weight_only_dtype_configs
from fxquant.patterns.share_qparams import share_qparams_ops

ACTIVATION = DTypeWithConstraints(dtype=torch.uint8)
WEIGHTED_INT8 = DTypeConfig(
    input_dtype=ACTIVATION, output_dtype=ACTIVATION, weight_dtype=torch.int8, bias_dtype=torch.float
)
STATIC_INT8 = DTypeConfig(input_dtype=ACTIVATION, output_dtype=ACTIVATION)
LAYER_NORM_INT8 = DTypeConfig(
    input_dtype=ACTIVATION,
    output_dtype=ACTIVATION,
    weight_dtype=torch.float,
    bias_dtype=torch.float,
)

_Builder = Callable[[Sequence[DTypeConfig]], list[BackendPatternConfig]]


def extra_shared_op_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """``torch.relu``, which the shared list lacks: on a uint8 tensor it keeps the input's qparams.

    Without it, ``torch.relu(conv(x))`` leaves a float relu between two int8 kernels.

    Example:
        >>> [c.pattern for c in extra_shared_op_configs([])] in ([torch.relu], [])
        True
    """
    missing = [op for op in (torch.relu,) if op not in share_qparams_ops()]
    return share_qparams_op_configs(dtype_configs, ops=missing)


def families() -> list[tuple[_Builder, list[DTypeConfig]]]:
    """Each shared builder with the dtype configs fbgemm gives its ops.

    Example:
        >>> len(families()) > 10
        True
    """
    static = [STATIC_INT8]
    return [
        (conv_configs, [WEIGHTED_INT8]),
        (linear_configs, [WEIGHTED_INT8, *dynamic_dtype_configs()]),
        (binary_op_configs, static),
        (matmul_configs, static),
        (cat_configs, static),
        (default_op_configs, static),
        (fixed_qparams_op_configs, static),
        (share_qparams_op_configs, static),
        (extra_shared_op_configs, static),
        (tensor_info_op_configs, static),
        (bn_configs, static),
        (ln_configs, [LAYER_NORM_INT8]),
        (rnn_configs, dynamic_dtype_configs()),
        (embedding_configs, weight_only_dtype_configs()),
    ]


def pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the fbgemm backend.

    Example:
        >>> any(c.pattern is torch.nn.Linear for c in pattern_configs())
        True
    """
    configs: list[BackendPatternConfig] = []
    for build, dtype_configs in families():
        configs += build(dtype_configs)
    return configs
