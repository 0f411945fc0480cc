"""Patterns and default qconfigs of a backend on PyTorch's quint8 kernels (fbgemm, qnnpack).

Both engines run the same ``torch.ops.quantized`` kernels on uint8 activations
and int8 weights, so their backends differ only in a few numbers: the
activation and weight constraints, the dynamic linear dtypes (fp16 or not) and
the observer ranges. A plugin states those and calls
:func:`engine_pattern_configs` and :func:`engine_default_qconfig_mapping`:

    weighted ops (conv, linear)     uint8 activations, int8 weight, float bias
    linear, rnn                     + the dynamic dtype configs given
    every other op                  uint8 in and out (fixed-qparams ops: their exact grid)
    layer norm                      uint8 activations, float weight and bias
    embedding                       weight-only uint8 / int8 / 4-bit
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.patterns.binary import binary_op_configs, matmul_configs
from fxquant.patterns.conv import conv_configs
from fxquant.patterns.embedding import embedding_configs
from fxquant.patterns.fixed_qparams import fixed_qparams_op_configs
from fxquant.patterns.linear import linear_configs
from fxquant.patterns.misc import cat_configs, default_op_configs, tensor_info_op_configs
from fxquant.patterns.norm import bn_configs, ln_configs
from fxquant.patterns.qconfigs import mapping_with_overrides
from fxquant.patterns.reference import weight_only_dtype_configs
from fxquant.patterns.rnn import rnn_configs
from fxquant.patterns.share_qparams import share_qparams_op_configs

__all__ = ["engine_default_qconfig_mapping", "engine_pattern_configs"]

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
    layer_norm = DTypeConfig(
        input_dtype=activation,
        output_dtype=activation,
        weight_dtype=torch.float,
        bias_dtype=torch.float,
    )
    families: list[tuple[_Builder, list[DTypeConfig]]] = [
        (conv_configs, [weighted]),
        (linear_configs, [weighted, *dynamic]),
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


def _engine_qconfigs(
    is_qat: bool, activation: Mapping[str, Any], weight: Mapping[str, Any]
) -> tuple[QConfig, Any]:
    # (global qconfig, per-tensor weight constructor of the transposed convs)
    from fxquant import observer as obs  # heavy: only when asked
    from fxquant.fake_quantize import FakeQuantize

    channel = {"qscheme": "per_channel_symmetric", **weight}
    tensor = {"qscheme": "per_tensor_symmetric", **weight}
    if is_qat:
        act: Any = FakeQuantize.with_args(observer=obs.MovingAverageMinMaxObserver, **activation)
        per_channel: Any = FakeQuantize.with_args(
            observer=obs.MovingAveragePerChannelMinMaxObserver, ch_axis=0, **channel
        )
        per_tensor: Any = FakeQuantize.with_args(observer=obs.MovingAverageMinMaxObserver, **tensor)
    else:
        act = obs.HistogramObserver.with_args(**activation)
        per_channel = obs.PerChannelMinMaxObserver.with_args(ch_axis=0, **channel)
        per_tensor = obs.MinMaxObserver.with_args(**tensor)
    return QConfig(activation=act, weight=per_channel), per_tensor


def engine_default_qconfig_mapping(
    is_qat: bool,
    *,
    activation: Mapping[str, Any],
    weight: Mapping[str, Any],
    qat_activation: Mapping[str, Any] | None = None,
) -> QConfigMapping:
    """The default mapping of a quint8-engine backend.

    Histogram observers on the activations and symmetric per-channel int8
    weights (PTQ), or moving-average fake-quantize on the same ranges (QAT);
    per-tensor weights for transposed convs (a per-channel observer's axis 0
    is their *input* channel), float weights for layer norm and the exact
    grid for fixed-qparams ops.

    Args:
        is_qat: fake-quantize modules instead of observers.
        activation: observer arguments of the activations (dtype, range, eps, ...).
        weight: observer arguments of the weights, without the qscheme.
        qat_activation: the fake-quantize activation arguments, when they
            differ from ``activation`` (default ``activation``).

    Example:
        >>> mapping = engine_default_qconfig_mapping(
        ...     False, activation={"dtype": torch.uint8}, weight={"dtype": torch.int8}
        ... )
        >>> mapping.global_qconfig.weight().qscheme
        torch.per_channel_symmetric
    """
    act = activation if qat_activation is None or not is_qat else qat_activation
    base, per_tensor = _engine_qconfigs(is_qat, act, weight)
    return mapping_with_overrides(base, per_tensor, is_qat)
