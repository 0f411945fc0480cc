"""The generic dtype configs, and every generic pattern with them: the reference backend's set.

The reference backend has no kernels: convert leaves each quantized pattern
as ``dequantize -> float op -> quantize``. It accepts the dtypes any int8
backend might use, so a model prepared for it shows what *could* be
quantized; a real backend narrows this down.

    weighted ops (conv, linear)   uint8 or int8 activations, int8 weight, float bias
    linear, rnn                   + dynamic int8 and fp16 (activations quantized at run time)
    non-weighted ops              uint8 or int8 activations, + fp16 where PyTorch had it
    layer norm                    uint8/int8 activations, float weight and bias
    embedding                     weight-only uint8, int8 or 4-bit
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.patterns.binary import binary_op_configs, matmul_configs
from fxquant.patterns.conv import conv_configs
from fxquant.patterns.embedding import embedding_configs
from fxquant.patterns.fixed_qparams import fixed_qparams_op_configs
from fxquant.patterns.linear import linear_configs
from fxquant.patterns.misc import cat_configs, default_op_configs, tensor_info_op_configs
from fxquant.patterns.norm import bn_configs, ln_configs
from fxquant.patterns.rnn import rnn_configs
from fxquant.patterns.share_qparams import share_qparams_op_configs

__all__ = [
    "dynamic_dtype_configs",
    "fp16_dtype_configs",
    "layer_norm_dtype_configs",
    "non_weighted_dtype_configs",
    "reference_pattern_configs",
    "weight_only_dtype_configs",
    "weighted_dtype_configs",
]

_ACTIVATIONS = (torch.uint8, torch.int8)


def weighted_dtype_configs() -> list[DTypeConfig]:
    """Static int8 for weighted ops: uint8 or int8 activations, int8 weight, float bias.

    Example:
        >>> [c.input_dtype for c in weighted_dtype_configs()]
        [torch.uint8, torch.int8]
    """
    return _static(weight=torch.int8, bias=torch.float)


def _static(
    weight: torch.dtype | None = None, bias: torch.dtype | None = None
) -> list[DTypeConfig]:
    # one config per activation dtype: the static int8 backends take uint8 or int8 alike
    return [
        DTypeConfig(input_dtype=act, output_dtype=act, weight_dtype=weight, bias_dtype=bias)
        for act in _ACTIVATIONS
    ]


def non_weighted_dtype_configs() -> list[DTypeConfig]:
    """Static int8 for ops without weights: uint8 or int8 in and out.

    Example:
        >>> [c.output_dtype for c in non_weighted_dtype_configs()]
        [torch.uint8, torch.int8]
    """
    return _static()


def fp16_dtype_configs() -> list[DTypeConfig]:
    """Static fp16: activations, weight and bias in float16.

    Example:
        >>> fp16_dtype_configs()[0].weight_dtype
        torch.float16
    """
    half = torch.float16
    return [DTypeConfig(input_dtype=half, output_dtype=half, weight_dtype=half, bias_dtype=half)]


def dynamic_dtype_configs() -> list[DTypeConfig]:
    """Dynamic quantization: int8 (uint8 activations quantized at run time) and fp16 weights.

    Example:
        >>> [c.is_dynamic for c in dynamic_dtype_configs()]
        [True, True]
    """
    # (activation dtype, weight dtype): int8 weights with uint8 activations, or both fp16
    pairs = ((torch.uint8, torch.int8), (torch.float16, torch.float16))
    return [
        DTypeConfig(
            input_dtype=activation,
            output_dtype=torch.float,
            weight_dtype=weight,
            bias_dtype=torch.float,
            is_dynamic=True,
        )
        for activation, weight in pairs
    ]


def weight_only_dtype_configs() -> list[DTypeConfig]:
    """Weight-only: float activations, uint8, int8 or (where torch has it) 4-bit weights.

    Example:
        >>> weight_only_dtype_configs()[0].weight_dtype
        torch.uint8
    """
    weights = [torch.uint8, torch.int8]
    quint4x2 = getattr(torch, "quint4x2", None)  # deprecated with the other quantized dtypes
    if isinstance(quint4x2, torch.dtype):
        weights.append(quint4x2)
    return [
        DTypeConfig(input_dtype=torch.float, output_dtype=torch.float, weight_dtype=weight)
        for weight in weights
    ]


def layer_norm_dtype_configs() -> list[DTypeConfig]:
    """int8 activations with the affine weight and bias kept in float.

    Example:
        >>> layer_norm_dtype_configs()[0].weight_dtype
        torch.float32
    """
    return _static(weight=torch.float, bias=torch.float)


_Builder = Callable[[Sequence[DTypeConfig]], list[BackendPatternConfig]]


def _families() -> list[tuple[_Builder, list[DTypeConfig]]]:
    # each builder with the dtypes the module docstring's table gives its ops
    static = non_weighted_dtype_configs()
    with_fp16 = static + fp16_dtype_configs()
    return [
        (conv_configs, weighted_dtype_configs()),
        (linear_configs, weighted_dtype_configs() + dynamic_dtype_configs() + fp16_dtype_configs()),
        (binary_op_configs, with_fp16),
        (matmul_configs, static),
        (cat_configs, static),
        (default_op_configs, static),
        (fixed_qparams_op_configs, with_fp16),
        (share_qparams_op_configs, with_fp16),
        (tensor_info_op_configs, static),
        (bn_configs, static),
        (ln_configs, layer_norm_dtype_configs()),
        (rnn_configs, dynamic_dtype_configs()),
        (embedding_configs, weight_only_dtype_configs()),
    ]


def reference_pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the ``reference`` backend, with the generic int8 dtype configs.

    Covers every pattern of PyTorch's native (fbgemm/qnnpack) backend config,
    with the same observation types, plus int8 activations, fp16 and a few
    more ops (``torch.bmm``, ``torch.concat``, ``nn.GroupNorm``, ...).

    Example:
        >>> import torch
        >>> linear = next(c for c in reference_pattern_configs() if c.pattern is torch.nn.Linear)
        >>> len(linear.dtype_configs)
        5
    """
    return [config for build, dtype_configs in _families() for config in build(dtype_configs)]
