"""What the ``x86`` backend quantizes: torch's x86 pattern set plus oneDNN's fusions.

The dtypes and kernels are fxquant-onednn's (plain uint8/int8 tensors through
oneDNN); x86 states only its pattern list:

    PyTorch's x86 set    conv, linear (static uint8 in and float out as oneDNN's kernel returns
                         it (#23), dynamic int8, dynamic fp16), binary ops, cat,
                         default, fixed-qparams, share-qparams and tensor-info ops, bn,
                         rnn (dynamic int8/fp16), embedding (weight-only uint8 / 4-bit)
    added                conv2d + add (+ relu) fused into one oneDNN conv (ResNet blocks),
                         torch.matmul / bmm (transformer attention),
                         conv2d (+ bn) + relu6 / hardtanh / hardswish / SiLU fused and
                         observed after the activation (``ConvUnary2d``: MobileNetV2/V3,
                         EfficientNet), as pt2e's x86 quantizer does; torch.ao's FX configs
                         quantize the activation on its own (a clamp sharing the conv's
                         qparams, observed before it)
"""

from __future__ import annotations

from fxquant.config.backend import BackendPatternConfig
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
    matmul_configs,
    rnn_configs,
    share_qparams_op_configs,
    tensor_info_op_configs,
)
from fxquant.patterns.reference import weight_only_dtype_configs
from fxquant_onednn.patterns import (
    DYNAMIC_FP16,
    DYNAMIC_INT8,
    LINEAR_INT8,
    STATIC_INT8,
    WEIGHTED_INT8,
    conv_unary_configs,
)

__all__ = ["pattern_configs"]


def pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the x86 backend.

    Example:
        >>> len(pattern_configs()) > 200
        True
    """
    static = [STATIC_INT8]
    dynamic = [DYNAMIC_INT8, DYNAMIC_FP16]
    return [
        *conv_configs([WEIGHTED_INT8]),
        *conv_add_configs([WEIGHTED_INT8]),
        *conv_unary_configs([WEIGHTED_INT8]),
        *linear_configs([LINEAR_INT8, *dynamic]),
        *binary_op_configs(static),
        *matmul_configs(static),
        *cat_configs(static),
        *default_op_configs(static),
        *fixed_qparams_op_configs(static),
        *share_qparams_op_configs(static),
        *tensor_info_op_configs(static),
        *bn_configs(static),
        *rnn_configs(dynamic),
        *embedding_configs(weight_only_dtype_configs()),
    ]
