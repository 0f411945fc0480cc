"""The default qconfig mapping of a backend on PyTorch's quint8 kernels (fbgemm, qnnpack).

Histogram observers on uint8 activations and symmetric per-channel int8 weights
(PTQ), moving-average fake-quantize on the same ranges (QAT); a transformer's
residual adds, LayerNorm, softmax, GELU and attention's matmuls float
(:data:`TRANSFORMER_FLOAT_OPS`). The engines differ only in the observer
arguments a plugin passes to :func:`engine_default_qconfig_mapping`.

An add that a conv absorbs (``ConvAdd2d``, ``ConvAddReLU2d``: ResNet and MobileNetV2
blocks) stays float by default too: :func:`conv_adds_int8` puts it in int8 for PTQ, as
onednn's default does, and the engine's conv and ``quantized::add`` then run it
(``conv_add.py``), as fast as the adds int8 on their own where the float adds cost a
ResNet-like model 1.2x its time. Not by default: the engines have no conv kernel
that sums a second tensor, so the conv's output is rounded to a uint8 grid the reference
model does not have; each block is within one output step of its reference, but the
zoo's ResNet loses against float over its reference (fbgemm 36.2 vs 37.5 dB with its
8-bit activations; qnnpack 41.3 vs 46.3), beyond the 1 dB a lowered model may
lose. Never for QAT: a conv + bn + add cannot fuse while the BatchNorm still trains.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigError
from fxquant.nn import intrinsic
from fxquant.patterns.qconfigs import mapping_with_overrides
from torch import nn

__all__ = [
    "TRANSFORMER_FLOAT_OPS",
    "conv_adds_int8",
    "engine_default_qconfig_mapping",
    "transformer_ops_int8",
]

# Kept float by default: a transformer's residual stream (the adds), LayerNorm,
# softmax, GELU and attention's matmuls, and the reshapes between its float-output
# linears and those matmuls. Their int8 forms requantize the residual stream and
# LayerNorm's outlier channels: all-MiniLM-L6-v2 fell to 0.51 (fbgemm) and 0.87
# (qnnpack) mean cosine to float, against 0.993 with these float (docs/guide/accuracy.md).
# The linears' inputs stay int8 (>= 90% of a BERT's Linear layers, all of them). A CNN
# keeps its convs, pooling, relu, sigmoid/hardsigmoid/tanh and multiplies int8; its
# residual adds run in float between the convs' dequantize and the next quantize step.
TRANSFORMER_FLOAT_OPS: tuple[Any, ...] = (
    nn.LayerNorm, F.layer_norm, operator.add, torch.add,
    nn.Softmax, F.softmax, torch.softmax, nn.GELU, F.gelu,
    torch.matmul, operator.matmul, torch.bmm,
    nn.Dropout, F.dropout, "view", "reshape", "permute", "transpose", "contiguous",
    torch.reshape, torch.permute, torch.transpose,
    # the head split of fxquant's own MultiheadAttention rewrite (flow/transformer.py)
    "narrow", "unflatten", "movedim", torch.narrow, torch.unflatten, torch.movedim,
    # indexing moves floats too (a BERT pooler's hidden_states[:, 0], before a Linear that
    # quantizes its own input); sdpa is attention's matmuls in one call; the scores'
    # scaling and a GELU written out (ALBERT's pow). None has an engine pattern: left to
    # the global qconfig, explain and strict mode reported each as skipped on the default
    # mapping
    operator.getitem, F.scaled_dot_product_attention, operator.truediv, torch.div,
    operator.pow, torch.pow,
)  # fmt: skip


def _engine_qconfigs(
    is_qat: bool, activation: Mapping[str, Any], weight: Mapping[str, Any]
) -> tuple[QConfig, Any]:
    # (global qconfig, per-tensor weight constructor of the transposed convs)
    from fxquant.numerics import observer as obs  # heavy: only when asked
    from fxquant.numerics.fake_quantize import FakeQuantize

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
    linear_activation: Mapping[str, Any] | None = None,
    linear_weight: Mapping[str, Any] | None = None,
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
        linear_activation: the observer (or fake-quantize) arguments of the
            inputs of Linear, when they differ (fbgemm: 8 bits where its other
            activations use 7); default the global ones.
        linear_weight: the weight arguments of Linear, when they differ (fbgemm with
            VNNI: 8 bits where its convs use 7); default ``weight``.

    The ops of :data:`TRANSFORMER_FLOAT_OPS` stay float (``None``), a CNN's residual
    adds too (:func:`conv_adds_int8` fuses them with their conv, in int8).

    Example:
        >>> import torch
        >>> mapping = engine_default_qconfig_mapping(
        ...     False, activation={"dtype": torch.uint8}, weight={"dtype": torch.int8}
        ... )
        >>> mapping.global_qconfig.weight().qscheme
        torch.per_channel_symmetric
        >>> mapping.qconfig_for("", torch.nn.LayerNorm) is None
        True
    """
    act = activation if qat_activation is None or not is_qat else qat_activation
    base, per_tensor = _engine_qconfigs(is_qat, act, weight)
    mapping = mapping_with_overrides(base, per_tensor, is_qat)
    if linear_activation is not None or linear_weight is not None:
        linear, _ = _engine_qconfigs(
            is_qat,
            act if linear_activation is None else linear_activation,
            weight if linear_weight is None else linear_weight,
        )
        # the fused class too: it outranks its parts, so linear + relu still fuse
        for op in (nn.Linear, F.linear, intrinsic.LinearReLU):
            mapping.set_object_type(op, linear)
    for op in TRANSFORMER_FLOAT_OPS:
        mapping.set_object_type(op, None)
    return mapping


def conv_adds_int8(mapping: QConfigMapping) -> QConfigMapping:
    """``mapping`` with the adds a conv absorbs int8 (``ConvAdd2d``, ``ConvAddReLU2d``; in place).

    PTQ only (module docstring): the fused classes get the global qconfig, which
    outranks their parts' entries (the add's ``None``); a transformer's adds stay float.

    Raises:
        ConfigError: for a QAT mapping (a conv + bn + add cannot fuse while training).

    Example:
        >>> import torch
        >>> from fxquant.nn import intrinsic
        >>> mapping = engine_default_qconfig_mapping(
        ...     False, activation={"dtype": torch.uint8}, weight={"dtype": torch.int8}
        ... )
        >>> conv_adds_int8(mapping).qconfig_for("", intrinsic.ConvAdd2d) is not None
        True
        >>> mapping.qconfig_for("", torch.add) is None
        True
    """
    from fxquant.numerics.fake_quantize import FakeQuantizeBase  # heavy: only when asked

    base = mapping.global_qconfig
    if base is None:
        return mapping
    if isinstance(base.activation(), FakeQuantizeBase):
        msg = (
            "conv_adds_int8(mapping): got a QAT mapping (fake-quantize activations); expected "
            "a PTQ one: a conv + bn + add cannot fuse while the BatchNorm trains"
        )
        raise ConfigError(msg)
    for fused in (intrinsic.ConvAdd2d, intrinsic.ConvAddReLU2d):
        mapping.set_object_type(fused, base)
    return mapping


def transformer_ops_int8(mapping: QConfigMapping) -> QConfigMapping:
    """``mapping`` with the ops of :data:`TRANSFORMER_FLOAT_OPS` int8 again (in place).

    For CNNs whose residual adds should run on the engines' add kernel, and for tests
    of those kernels: each op gets the global qconfig, as the engine's default would
    without the float ops (LayerNorm a float weight, softmax its fixed grid).

    Example:
        >>> import torch
        >>> mapping = engine_default_qconfig_mapping(
        ...     False, activation={"dtype": torch.uint8}, weight={"dtype": torch.int8}
        ... )
        >>> transformer_ops_int8(mapping).qconfig_for("", torch.add) is not None
        True
        >>> mapping.qconfig_for("", torch.nn.LayerNorm).weight().dtype
        torch.float32
    """
    from fxquant.numerics import observer  # heavy: only when asked
    from fxquant.numerics.fake_quantize import FakeQuantizeBase
    from fxquant.patterns.fixed_qparams import fixed_qparams_ops
    from fxquant.patterns.qconfigs import fixed_qparams_qconfig

    base = mapping.global_qconfig
    if base is None:
        return mapping
    is_qat = isinstance(base.activation(), FakeQuantizeBase)
    grids = fixed_qparams_ops()
    for op in TRANSFORMER_FLOAT_OPS:
        qconfig = base
        if op in (nn.LayerNorm, F.layer_norm):
            qconfig = QConfig(base.activation, observer.default_placeholder_observer)
        elif op in grids:
            qconfig = fixed_qparams_qconfig(grids[op], is_qat)
        mapping.set_object_type(op, qconfig)
    return mapping
