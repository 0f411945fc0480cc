"""What the executorch backend quantizes: the patterns XNNPACK runs on int8, with its constraints.

XNNPACK's quantized operators take signed int8 tensors (``qs8``): asymmetric
activations in -128..127 and symmetric weights in -127..127, one scale per
output channel (``qc8w``), float bias (XNNPACK requantizes it itself)::

    weighted ops (conv1d/2d incl. depthwise, conv-transpose1d/2d, linear; with bn/relu fusions)
                                     int8 activations, int8 weight, float bias
    linear                           + dynamic int8 (activations quantized per token at run
                                     time, float output: the default mapping)
    add, sub, mul (+ relu)           int8 in and out
    cat, pooling, relu/relu6/hardtanh/clamp, mean, reshapes, permutes, slices, pad,
    upsample, dropout                int8, the output on its input's grid (shared observer)
    batch norm, elu, leaky relu      int8, their own output observer
    embedding                        weight-only int8 (XNNPACK has none: the portable runtime)

The output of every op XNNPACK moves values through without arithmetic
(slice, view, permute, pooling by max, clamps, cat) *must* keep its input's
scale and zero point: XNNPACK serializes them as one tensor, and an
ExecuTorch program whose ``slice_copy`` has another output scale fails to
load (pytorch/executorch#21829). They share one observer here, so prepare
never gives them different qparams.

A scale below 2**-12 loses precision in XNNPACK's fixed-point requantization
(the bound torch's QNNPACK configs use), hence ``scale_min_lower_bound``.
Sigmoid, tanh, softmax, GELU, hardswish and layer norm run in float32 inside
the XNNPACK delegate (it has no int8 kernel for them in ExecuTorch 1.5): they
are not listed, so prepare leaves them float and reports ``no_pattern``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from fxquant.config.backend import (
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
)
from fxquant.nn.intrinsic import BNReLU3d
from fxquant.patterns.binary import binary_op_configs
from fxquant.patterns.builders import Pattern, op_config
from fxquant.patterns.conv import conv_configs
from fxquant.patterns.embedding import embedding_configs
from fxquant.patterns.linear import linear_configs
from fxquant.patterns.misc import cat_configs
from fxquant.patterns.norm import bn_configs
from fxquant.patterns.share_qparams import share_qparams_op_configs
from torch import nn

__all__ = [
    "ACTIVATION",
    "SCALE_MIN",
    "WEIGHT",
    "dynamic_dtype_config",
    "pattern_configs",
    "shared_qparams_ops",
    "static_dtype_config",
    "weighted_dtype_config",
]

SCALE_MIN = 2**-12
ACTIVATION = DTypeWithConstraints(
    dtype=torch.int8,
    quant_min_lower_bound=-128,
    quant_max_upper_bound=127,
    scale_min_lower_bound=SCALE_MIN,
)
"""XNNPACK's ``qs8`` activations: the full int8 range, any zero point."""
WEIGHT = DTypeWithConstraints(
    dtype=torch.int8,
    quant_min_lower_bound=-127,
    quant_max_upper_bound=127,
    scale_min_lower_bound=SCALE_MIN,
    zero_point_exact_match=0,
)
"""XNNPACK's ``qc8w``/``qs8`` weights: symmetric in -127..127.

XNNPACK ignores a weight zero point: an affine (``per_channel_affine``)
weight would run with its zero points dropped (measured: output off by half
its range), so prepare refuses it (reason ``zero_point``)."""


def weighted_dtype_config() -> DTypeConfig:
    """int8 activations, int8 weight, float bias: conv and linear.

    Example:
        >>> weighted_dtype_config().weight_dtype
        torch.int8
    """
    return DTypeConfig(
        input_dtype=ACTIVATION, output_dtype=ACTIVATION, weight_dtype=WEIGHT, bias_dtype=torch.float
    )


def static_dtype_config() -> DTypeConfig:
    """int8 in and out: every op without a weight.

    Example:
        >>> static_dtype_config().output_dtype
        torch.int8
    """
    return DTypeConfig(input_dtype=ACTIVATION, output_dtype=ACTIVATION)


def dynamic_dtype_config() -> DTypeConfig:
    """Dynamic int8 linear: activations quantized per call, float output.

    Example:
        >>> dynamic_dtype_config().is_dynamic
        True
    """
    return DTypeConfig(
        input_dtype=torch.int8,
        output_dtype=torch.float,
        weight_dtype=WEIGHT,
        bias_dtype=torch.float,
        is_dynamic=True,
    )


def shared_qparams_ops() -> tuple[Pattern, ...]:
    """Ops whose output keeps the input's grid (XNNPACK serializes both as one tensor).

    Example:
        >>> operator.getitem in shared_qparams_ops() and "view" in shared_qparams_ops()
        True
    """
    modules = (
        nn.AdaptiveAvgPool1d,
        nn.AdaptiveAvgPool2d,
        nn.AvgPool1d,
        nn.AvgPool2d,
        nn.ConstantPad1d,
        nn.ConstantPad2d,
        nn.Dropout,
        nn.Flatten,
        nn.Hardtanh,
        nn.Identity,
        nn.MaxPool1d,
        nn.MaxPool2d,
        nn.ReLU,
        nn.ReLU6,
        nn.Upsample,
        nn.UpsamplingBilinear2d,
        nn.UpsamplingNearest2d,
        nn.ZeroPad2d,
    )
    functions = (
        F.adaptive_avg_pool1d,
        F.adaptive_avg_pool2d,
        F.avg_pool1d,
        F.avg_pool2d,
        F.dropout,
        F.hardtanh,
        F.hardtanh_,
        F.interpolate,
        F.max_pool1d,
        F.max_pool2d,
        F.pad,
        F.relu,
        F.relu6,
        operator.getitem,
        torch.chunk,
        torch.clamp,
        torch.flatten,
        torch.mean,
        torch.movedim,
        torch.narrow,
        torch.permute,
        torch.permute_copy,
        torch.relu,
        torch.select,
        torch.split,
        torch.squeeze,
        torch.transpose,
        torch.unflatten,
        torch.unsqueeze,
    )
    methods = (
        "chunk",
        "clamp",
        "contiguous",
        "flatten",
        "mean",
        "movedim",
        "narrow",
        "permute",
        "relu",
        "relu_",
        "reshape",
        "select",
        "split",
        "squeeze",
        "squeeze_",
        "transpose",
        "unflatten",
        "unsqueeze",
        "view",
    )
    return (*modules, *functions, *methods)


def _own_observer_ops() -> tuple[Pattern, ...]:
    # change the range of their input: their output gets its own observer
    return (nn.ELU, nn.LeakyReLU, F.elu, F.leaky_relu, F.leaky_relu_, "leaky_relu")


def pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the executorch backend.

    Covers every pattern of torch's ``get_executorch_backend_config()``
    (tested) with XNNPACK's int8 constraints, plus the slices, splits,
    upsampling and subtraction XNNPACK also runs on int8.

    Example:
        >>> configs = pattern_configs()
        >>> any(c.pattern is torch.nn.Conv2d for c in configs)
        True
        >>> any(c.pattern is torch.nn.Conv3d for c in configs)  # XNNPACK: 1-d and 2-d only
        False
    """
    weighted = [weighted_dtype_config()]
    static = [static_dtype_config()]
    observed = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    binary = (operator.add, torch.add, operator.sub, torch.sub, operator.mul, torch.mul)
    configs: list[BackendPatternConfig] = [
        *conv_configs(weighted, dims=(1, 2)),
        *linear_configs([*weighted, dynamic_dtype_config()]),
        *binary_op_configs(static, ops=binary),
        *cat_configs(static),
        *share_qparams_op_configs(static, ops=shared_qparams_ops()),
        *(op_config(op, static, observed) for op in _own_observer_ops()),
        *_batch_norm_configs(static),
        *embedding_configs([_weight_only()]),
    ]
    return configs


def _batch_norm_configs(static: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    # 2-d only: XNNPACK folds a batch norm into the conv before it, or runs it as a
    # per-channel multiply-add; there is no 3-d path. Compared as objects: a pattern's
    # str holds its functions' addresses, which may contain "3d"
    three_d = {nn.BatchNorm3d, BNReLU3d}
    return [
        c
        for c in bn_configs(static)
        if three_d.isdisjoint(c.pattern if isinstance(c.pattern, tuple) else (c.pattern,))
    ]


def _weight_only() -> DTypeConfig:
    # XNNPACK has no embedding: the portable runtime's quantized_decomposed kernels run it
    return DTypeConfig(input_dtype=torch.float, output_dtype=torch.float, weight_dtype=torch.int8)
