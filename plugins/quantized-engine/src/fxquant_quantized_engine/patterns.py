"""The patterns of a backend on PyTorch's quint8 kernels (fbgemm, qnnpack).

Both engines run the same ``torch.ops.quantized`` kernels on uint8 activations
and int8 weights, so their backends differ only in a few numbers: the
activation and weight constraints, the dynamic linear dtypes (fp16 or not) and
the observer ranges (``qconfig.py``). A plugin states those and calls
:func:`engine_pattern_configs`:

    conv                            uint8 activations, int8 weight, float bias
    conv2d (+ bn) + add (+ relu)    the same (``ConvAdd2d``, ``ConvAddReLU2d``)
    linear                          uint8 in, float out, int8 weight, float bias
    linear, rnn                     + the dynamic dtype configs given
    every other op                  uint8 in and out (fixed-qparams ops: their exact grid)
    layer norm                      uint8 activations, float weight and bias
    embedding                       weight-only uint8 / int8 / 4-bit
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.patterns.binary import binary_op_configs, matmul_configs
from fxquant.patterns.conv import conv_configs
from fxquant.patterns.conv_add import conv_add_configs
from fxquant.patterns.embedding import embedding_configs
from fxquant.patterns.fixed_qparams import fixed_qparams_op_configs
from fxquant.patterns.generic import weight_only_dtype_configs
from fxquant.patterns.linear import linear_configs
from fxquant.patterns.misc import cat_configs, default_op_configs, tensor_info_op_configs
from fxquant.patterns.norm import bn_configs, ln_configs
from fxquant.patterns.rnn import rnn_configs
from fxquant.patterns.share_qparams import share_qparams_op_configs

__all__ = ["engine_pattern_configs"]

_Builder = Callable[[Sequence[DTypeConfig]], list[BackendPatternConfig]]
_Dtype = DTypeWithConstraints | torch.dtype


def engine_pattern_configs(
    activation: _Dtype,
    weight: _Dtype,
    dynamic: Sequence[DTypeConfig],
    *,
    fixed_activation: _Dtype | None = None,
) -> list[BackendPatternConfig]:
    """Every pattern of a quint8-engine backend, from what differs between engines.

    Args:
        activation: the uint8 activation dtype (with the engine's constraints).
        weight: the int8 weight dtype of conv and linear.
        dynamic: the dynamic dtype configs of linear and the rnns.
        fixed_activation: the activation of fixed-qparams ops (sigmoid, ...),
            whose builder adds the exact grid; default ``activation``.

    Example:
        >>> configs = engine_pattern_configs(torch.uint8, torch.int8, [])
        >>> any(c.pattern is torch.relu for c in configs)
        True
    """
    static = [DTypeConfig(input_dtype=activation, output_dtype=activation)]
    fixed = fixed_activation if fixed_activation is not None else activation
    weighted = DTypeConfig(
        input_dtype=activation, output_dtype=activation, weight_dtype=weight, bias_dtype=torch.float
    )
    # the engines' linear returns float32 to the reference model too: int8 in, float out
    # (float_output.py runs it); a quantized consumer's quantize step is absorbed
    linear = DTypeConfig(
        input_dtype=activation,
        output_dtype=torch.float,
        weight_dtype=weight,
        bias_dtype=torch.float,
    )
    layer_norm = DTypeConfig(
        input_dtype=activation,
        output_dtype=activation,
        weight_dtype=torch.float,
        bias_dtype=torch.float,
    )
    families: list[tuple[_Builder, list[DTypeConfig]]] = [
        (conv_configs, [weighted]),
        (conv_add_configs, [weighted]),  # conv + add (+ relu): conv_add.py runs it
        (linear_configs, [linear, *dynamic]),
        (binary_op_configs, static),
        (matmul_configs, static),
        (cat_configs, static),
        (default_op_configs, static),
        (fixed_qparams_op_configs, [DTypeConfig(input_dtype=fixed, output_dtype=fixed)]),
        (share_qparams_op_configs, static),
        (tensor_info_op_configs, static),
        (bn_configs, static),
        (ln_configs, [layer_norm]),
        (rnn_configs, list(dynamic)),
        (embedding_configs, weight_only_dtype_configs()),
    ]
    return [config for build, dtype_configs in families for config in build(dtype_configs)]
