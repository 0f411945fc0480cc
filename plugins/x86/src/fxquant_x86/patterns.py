"""What the ``x86`` backend quantizes: torch's x86 pattern set plus oneDNN's fusions.

The dtypes and kernels are fxquant-onednn's (plain uint8/int8 tensors through
oneDNN); x86 states only its pattern list:

    PyTorch's x86 set    conv, linear (static uint8 in and float out as oneDNN's kernel returns
                         it, dynamic int8, dynamic fp16), binary ops, cat,
                         default, fixed-qparams, share-qparams and tensor-info ops, bn,
                         rnn (dynamic int8/fp16), embedding (weight-only uint8 / 4-bit)
    added                conv2d + add (+ relu) fused into one oneDNN conv (ResNet blocks),
                         torch.matmul / bmm (transformer attention),
                         conv2d (+ bn) + relu6 / hardtanh / hardswish / SiLU fused and
                         observed after the activation (``ConvUnary2d``: MobileNetV2/V3,
                         EfficientNet), as pt2e's x86 quantizer does; torch.ao's FX configs
                         quantize the activation on its own (a clamp sharing the conv's
                         qparams, observed before it)
    bfloat16 float side  where the CPU computes bfloat16 (AMX-BF16, AVX512-BF16): linear
                         also uint8 in, bfloat16 out (oneDNN's int8 GEMM writing bf16) and
                         all bfloat16 (a bf16 GEMM); the float ops between quantize steps
                         (adds, matmuls, LayerNorm, softmax, GELU, reshapes) also bfloat16
                         in and out (:data:`LINEAR_BF16`, :data:`GEMM_BF16`,
                         :data:`FLOAT_BF16`; a mapping that asks for them:
                         :func:`fxquant_x86.qconfig.bf16_qconfig_mapping`)
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.nn.functional as F
from fxquant.config.backend import BackendPatternConfig, DTypeConfig, ObservationType
from fxquant.patterns import (
    binary_op_configs,
    bn_configs,
    cat_configs,
    conv_add_configs,
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
from fxquant.patterns.builders import op_config
from fxquant.patterns.generic import weight_only_dtype_configs
from fxquant_onednn.patterns import (
    DYNAMIC_FP16,
    DYNAMIC_INT8,
    LINEAR_INT8,
    STATIC_INT8,
    WEIGHTED_INT8,
    conv_unary_configs,
)
from torch import nn

from fxquant_x86 import precision

__all__ = [
    "BF16_ONLY_OPS",
    "FLOAT_BF16",
    "GEMM_BF16",
    "LINEAR_BF16",
    "pattern_configs",
    "shared_pattern_configs",
]

LINEAR_BF16 = DTypeConfig(
    input_dtype=torch.uint8,
    output_dtype=torch.bfloat16,
    weight_dtype=torch.int8,
    bias_dtype=torch.float,
)
"""An int8 GEMM writing bfloat16 (``onednn.qlinear_pointwise`` with a bf16 output): the
reference model rounds its float output to bfloat16. Chosen by a qconfig whose
``output_dtype`` is ``torch.bfloat16``."""

FLOAT_BF16 = DTypeConfig(input_dtype=torch.bfloat16, output_dtype=torch.bfloat16)
"""A float op in bfloat16: its inputs and output rounded to bf16 in the reference model.
Chosen by a qconfig observing activations with ``PlaceholderObserver(dtype=torch.bfloat16)``."""

GEMM_BF16 = DTypeConfig(
    input_dtype=torch.bfloat16,
    output_dtype=torch.bfloat16,
    weight_dtype=torch.bfloat16,
    bias_dtype=torch.float,
)
"""A Linear in bfloat16 (AMX's bf16 GEMM): input, weight and output rounded to bf16. Chosen by
``bfloat16_static_qconfig``, e.g. by ``fxquant.numerics.choose_precision`` for a Linear
that int8 costs too much accuracy."""

# float ops of a transformer that x86 has no int8 pattern for: bfloat16 only (attention's
# scores / sqrt(d) among them: left float32, it put two casts around every attention)
BF16_ONLY_OPS = (nn.GELU, F.gelu, F.softmax, torch.softmax, operator.truediv, torch.div)


def pattern_configs(*, bf16: bool | None = None) -> list[BackendPatternConfig]:
    """Every pattern of the x86 backend, as configs of the caller's own.

    Args:
        bf16: offer the bfloat16 float side (:data:`LINEAR_BF16`, :data:`FLOAT_BF16`);
            default: where the CPU computes bfloat16 (:func:`precision.bf16_accelerated`).

    Example:
        >>> len(pattern_configs(bf16=False)) > 200
        True
    """
    return [config.copy() for config in shared_pattern_configs(bf16=bf16)]


def shared_pattern_configs(*, bf16: bool | None = None) -> tuple[BackendPatternConfig, ...]:
    """Every pattern of the x86 backend, built once per float side: the one list both hooks
    answer from.

    Read-only: the pattern hook hands these to the registry, which keeps copies, and the
    lowering hook makes a rule per pattern from them (``fxquant_x86.kernels``).

    Example:
        >>> shared_pattern_configs(bf16=False) is shared_pattern_configs(bf16=False)
        True
    """
    return _build(precision.bf16_accelerated() if bf16 is None else bf16)


@functools.cache
def _build(bf16: bool) -> tuple[BackendPatternConfig, ...]:
    static, linear = [STATIC_INT8], [LINEAR_INT8]
    if bf16:
        static, linear = [STATIC_INT8, FLOAT_BF16], [LINEAR_INT8, LINEAR_BF16, GEMM_BF16]
    dynamic = [DYNAMIC_INT8, DYNAMIC_FP16]
    return (
        *conv_configs([WEIGHTED_INT8]),
        *conv_add_configs([WEIGHTED_INT8]),
        *conv_unary_configs([WEIGHTED_INT8]),
        *linear_configs([*linear, *dynamic]),
        *binary_op_configs(static),
        *matmul_configs(static),
        *cat_configs(static),
        *default_op_configs(static),
        *fixed_qparams_op_configs([STATIC_INT8]),  # a fixed int8 grid: no bf16 form
        *share_qparams_op_configs(static),
        *tensor_info_op_configs(static),
        *bn_configs([STATIC_INT8]),
        *rnn_configs(dynamic),
        *embedding_configs(weight_only_dtype_configs()),
        *(_bf16_float_op_configs() if bf16 else ()),
    )


def _bf16_float_op_configs() -> list[BackendPatternConfig]:
    """LayerNorm, GELU and softmax in bfloat16 (their affine weights stay float)."""
    different = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    return [
        *ln_configs([FLOAT_BF16]),
        *(op_config(op, [FLOAT_BF16], different) for op in BF16_ONLY_OPS),
    ]
