"""The default QConfigMapping of the qnnpack backend.

PTQ: histogram observers on full-range uint8 activations (QNNPACK does not
saturate like fbgemm, so the 8th bit is kept) with ``eps = 2**-12`` so no scale
falls under the kernels' lower bound, and symmetric per-channel int8 weights in
-127..127 (QNNPACK's conv and linear take per-channel scales; the symmetric
range keeps the weight zero point at 0). QAT: moving-average fake-quantize on
the same ranges. Fixed-qparams ops (sigmoid, tanh, ...) get
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

_EPS = 2**-12
_ACTIVATION: dict[str, Any] = {"dtype": torch.uint8, "quant_min": 0, "quant_max": 255, "eps": _EPS}
_WEIGHT: dict[str, Any] = {"dtype": torch.int8, "quant_min": -127, "quant_max": 127, "eps": _EPS}
_TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_TRANSPOSED_F = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)


def _qconfigs(is_qat: bool) -> tuple[QConfig, QConfig]:
    """(global qconfig, per-tensor-weight qconfig)."""
    symmetric = {"qscheme": "per_channel_symmetric", **_WEIGHT}
    tensor = {"qscheme": "per_tensor_symmetric", **_WEIGHT}
    if is_qat:
        activation: Any = FakeQuantize.with_args(
            observer=MovingAverageMinMaxObserver, **_ACTIVATION
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
    """The mapping ``fxquant.get_default_qconfig_mapping("qnnpack", is_qat)`` returns.

    Example:
        >>> qconfig = default_qconfig_mapping().global_qconfig
        >>> qconfig.activation().quant_max, qconfig.weight().qscheme
        (255, torch.per_channel_symmetric)
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
