"""What the tensorrt backend quantizes: TensorRT's explicit-quantization rules as pattern configs.

TensorRT runs a layer in int8 when every input it reads comes from a
DequantizeLinear and it fuses each Q/DQ pair into the layers around it
(NVIDIA's "Q/DQ layer-placement recommendations"). The patterns say where
fxquant's reference model puts those pairs::

    conv (+bn) (+relu)                  int8 symmetric activations in and out, int8
                                        symmetric weights (per output channel), float bias
    linear, addmm                       the same, but the output float: Q/DQ on the
                                        GEMM's inputs only, as TensorRT's explicit
                                        quantization runs them; a quantized consumer puts
                                        its own Q/DQ after the GEMM, which TensorRT fuses
                                        as its output requantization
    add, mul (+relu)                    Q/DQ on both inputs, so TensorRT fuses the add
                                        into the conv that feeds it (a ResNet's residual)
    cat                                 inputs and output share one observer: one scale,
                                        no requantize before the concat
    pools, reshapes, relu, clamp, ...   share the input's observer: TensorRT moves the
                                        Q/DQ across them
    matmul, bmm                         both inputs int8 (attention), output int8

Everything is ``torch.int8`` with zero point 0 (``zero_point_exact_match=0``: prepare
refuses an asymmetric qconfig with reason ``zero_point``): TensorRT has no zero point. BN
and ReLU are fused into the conv before observers go in, so no Q/DQ lands
between them (the placement that kept TensorRT from fusing, NVIDIA/TensorRT#1831).
Ops TensorRT runs in float (layer norm, softmax, GELU, ...) have no pattern.
"""

from __future__ import annotations

import operator

import torch
from fxquant.config.backend import (
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
)
from fxquant.patterns import (
    binary_op_configs,
    cat_configs,
    conv_configs,
    linear_configs,
    matmul_configs,
    share_qparams_op_configs,
    tensor_info_op_configs,
)

__all__ = [
    "ACTIVATION",
    "GEMM",
    "NON_WEIGHTED",
    "WEIGHT",
    "WEIGHTED",
    "addmm_config",
    "pattern_configs",
]

# zero_point_exact_match alone: symmetric observers only (zero point 0), checked at prepare,
# so an asymmetric qconfig leaves the node float with reason zero_point instead of exporting
# a Q/DQ TensorRT cannot take
ACTIVATION = DTypeWithConstraints(
    dtype=torch.int8,
    quant_min_lower_bound=-128,
    quant_max_upper_bound=127,
    zero_point_exact_match=0,
)
"""int8 symmetric activations: TensorRT's QuantizeLinear saturates to -128..127, zero point 0."""
WEIGHT = DTypeWithConstraints(
    dtype=torch.int8,
    quant_min_lower_bound=-128,
    quant_max_upper_bound=127,
    zero_point_exact_match=0,
)
"""int8 symmetric weights (the default mapping uses the -127..127 NVIDIA recommends)."""

WEIGHTED = DTypeConfig(
    input_dtype=ACTIVATION, output_dtype=ACTIVATION, weight_dtype=WEIGHT, bias_dtype=torch.float
)
"""conv, linear, addmm: int8 in and out, int8 weight, float bias (TensorRT quantizes it itself)."""
GEMM = DTypeConfig(
    input_dtype=ACTIVATION, output_dtype=torch.float, weight_dtype=WEIGHT, bias_dtype=torch.float
)
"""linear, addmm: int8 in, float out (no Q/DQ after the GEMM unless its consumer is int8)."""
NON_WEIGHTED = DTypeConfig(input_dtype=ACTIVATION, output_dtype=ACTIVATION)
"""every other quantized op: int8 in and out."""


def addmm_config(dtype_configs: list[DTypeConfig]) -> BackendPatternConfig:
    """``torch.addmm(bias, input, weight)``: a GEMM with its weight at argument 2.

    Example:
        >>> addmm_config([WEIGHTED])._input_type_to_index
        {'bias': 0, 'input': 1, 'weight': 2}
    """
    return (
        BackendPatternConfig(torch.addmm)
        .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
        .set_dtype_configs(dtype_configs)
        ._set_input_type_to_index({"bias": 0, "input": 1, "weight": 2})
    )


def pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the tensorrt backend.

    Example:
        >>> patterns = {c.pattern for c in pattern_configs()}
        >>> torch.addmm in patterns, torch.cat in patterns
        (True, True)
    """
    weighted, other = [WEIGHTED], [NON_WEIGHTED]
    binary_ops = (operator.add, torch.add, operator.mul, torch.mul)
    return [
        *conv_configs(weighted),
        addmm_config([GEMM]),
        *linear_configs([GEMM]),
        *binary_op_configs(other, ops=binary_ops),
        *matmul_configs(other),
        *cat_configs(other),
        *share_qparams_op_configs(other),
        *tensor_info_op_configs(other),
    ]
