"""What the qnnpack backend quantizes: fxquant's shared pattern builders with QNNPACK's dtypes.

    weighted ops (conv, linear)     uint8 activations (scale >= 2**-12), int8 weight in
                                    -127..127 (scale >= 2**-12), float bias
    linear                          + dynamic int8 (QNNPACK has no fp16 GEMM)
    every other op                  uint8 in and out, scale >= 2**-12
    fixed-qparams ops               exact scale and zero point (sigmoid 1/256, 0; tanh 2/256, 128)
    embedding                       weight-only uint8 / int8 / 4-bit

QNNPACK requantizes with a fixed-point multiplier that loses precision below
a scale of 2**-12, hence ``scale_min_lower_bound``; the full 0..255 range is
allowed (its kernels do not saturate like fbgemm's).
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
WEIGHTED_INT8 = DTypeConfig(
    input_dtype=ACTIVATION, output_dtype=ACTIVATION, weight_dtype=WEIGHT, bias_dtype=torch.float
)
STATIC_INT8 = DTypeConfig(input_dtype=ACTIVATION, output_dtype=ACTIVATION)
# fixed-qparams ops get their exact grid from the builder, which takes no scale bound
_FULL_RANGE = DTypeWithConstraints(
    dtype=torch.uint8, quant_min_lower_bound=0, quant_max_upper_bound=255
)
FIXED_INT8 = DTypeConfig(input_dtype=_FULL_RANGE, output_dtype=_FULL_RANGE)
LAYER_NORM_INT8 = DTypeConfig(
    input_dtype=ACTIVATION,
    output_dtype=ACTIVATION,
    weight_dtype=torch.float,
    bias_dtype=torch.float,
)

# dynamic int8 only: QNNPACK has no fp16 GEMM (quantized::linear_prepack_fp16 raises)
DYNAMIC_INT8 = next(c for c in dynamic_dtype_configs() if c.weight_dtype == torch.int8)

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
    """Each shared builder with the dtype configs qnnpack gives its ops.

    Example:
        >>> len(families()) > 10
        True
    """
    static = [STATIC_INT8]
    return [
        (conv_configs, [WEIGHTED_INT8]),
        (linear_configs, [WEIGHTED_INT8, DYNAMIC_INT8]),
        (binary_op_configs, static),
        (matmul_configs, static),
        (cat_configs, static),
        (default_op_configs, static),
        (fixed_qparams_op_configs, [FIXED_INT8]),
        (share_qparams_op_configs, static),
        (extra_shared_op_configs, static),
        (tensor_info_op_configs, static),
        (bn_configs, static),
        (ln_configs, [LAYER_NORM_INT8]),
        (rnn_configs, [DYNAMIC_INT8]),
        (embedding_configs, weight_only_dtype_configs()),
    ]


def pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the qnnpack backend.

    Example:
        >>> any(c.pattern is torch.nn.Linear for c in pattern_configs())
        True
    """
    configs: list[BackendPatternConfig] = []
    for build, dtype_configs in families():
        configs += build(dtype_configs)
    return configs
