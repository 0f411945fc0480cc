"""The default qconfig mapping of a backend on PyTorch's quint8 kernels (fbgemm, qnnpack).

Histogram observers on uint8 activations and symmetric per-channel int8 weights
(PTQ), moving-average fake-quantize on the same ranges (QAT); the engines differ
only in the observer arguments a plugin passes to
:func:`engine_default_qconfig_mapping`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.patterns.qconfigs import mapping_with_overrides

__all__ = ["engine_default_qconfig_mapping"]


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
        >>> import torch
        >>> mapping = engine_default_qconfig_mapping(
        ...     False, activation={"dtype": torch.uint8}, weight={"dtype": torch.int8}
        ... )
        >>> mapping.global_qconfig.weight().qscheme
        torch.per_channel_symmetric
    """
    act = activation if qat_activation is None or not is_qat else qat_activation
    base, per_tensor = _engine_qconfigs(is_qat, act, weight)
    return mapping_with_overrides(base, per_tensor, is_qat)
