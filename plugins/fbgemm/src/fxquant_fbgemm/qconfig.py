"""The default QConfigMapping of the fbgemm backend.

PTQ: histogram observers on 7-bit activations (``reduce_range``: fbgemm's
uint8 x int8 products saturate int16 pairs on full-range inputs, and its
depthwise conv loses 57-74 steps there) and symmetric per-channel int8
weights (fbgemm's conv and linear take per-channel scales). QAT: moving-average
fake-quantize on the same ranges. Fixed-qparams ops (sigmoid, tanh, ...) get
their exact grids; transposed convs per-tensor weights; layer norm float weights.
"""

from __future__ import annotations

from typing import Any

import torch
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.fake_quantize import FakeQuantize
from fxquant.observer import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    default_placeholder_observer,
)
from fxquant.patterns import fixed_qparams_ops
from fxquant.patterns.qconfigs import fixed_qparams_qconfig
from torch import nn
from torch.nn import functional as F

_ACTIVATION: dict[str, Any] = {"dtype": torch.uint8, "reduce_range": True}
_WEIGHT: dict[str, Any] = {"dtype": torch.int8, "quant_min": -128, "quant_max": 127}
_TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_TRANSPOSED_F = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)


def _qconfigs(is_qat: bool) -> tuple[QConfig, QConfig]:
    """(global qconfig, per-tensor-weight qconfig)."""
    symmetric = {"qscheme": "per_channel_symmetric", **_WEIGHT}
    tensor = {"qscheme": "per_tensor_symmetric", **_WEIGHT}
    if is_qat:
        activation: Any = FakeQuantize.with_args(
            observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=127, dtype=torch.uint8
        )
        weight: Any = FakeQuantize.with_args(
            observer=MovingAveragePerChannelMinMaxObserver, ch_axis=0, **symmetric
        )
        weight_tensor: Any = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, **tensor)
    else:
        activation = HistogramObserver.with_args(**_ACTIVATION)
        weight = PerChannelMinMaxObserver.with_args(ch_axis=0, **symmetric)
        weight_tensor = MinMaxObserver.with_args(**tensor)
    return QConfig(activation=activation, weight=weight), QConfig(
        activation=activation, weight=weight_tensor
    )


def default_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """The mapping ``fxquant.get_default_qconfig_mapping("fbgemm", is_qat)`` returns.

    Example:
        >>> qconfig = default_qconfig_mapping().global_qconfig
        >>> qconfig.activation().quant_max, qconfig.weight().qscheme
        (127, torch.per_channel_symmetric)
    """
    base, per_tensor = _qconfigs(is_qat)
    mapping = QConfigMapping().set_global(base)
    for op in (*_TRANSPOSED, *_TRANSPOSED_F):
        mapping.set_object_type(op, per_tensor)
    float_weight = QConfig(activation=base.activation, weight=default_placeholder_observer)
    for layer_norm in (nn.LayerNorm, F.layer_norm):
        mapping.set_object_type(layer_norm, float_weight)
    by_grid: dict[Any, QConfig] = {}
    for op, grid in fixed_qparams_ops().items():
        mapping.set_object_type(op, by_grid.setdefault(grid, fixed_qparams_qconfig(grid, is_qat)))
    return mapping
