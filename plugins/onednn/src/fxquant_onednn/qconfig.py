"""The default QConfigMapping of the onednn backend.

uint8 activations over the full 0..255 range (oneDNN computes u8 x s8 without
the int16 saturation of pre-VNNI kernels on VNNI CPUs, the x86 baseline it targets),
int8 weights symmetric per output channel (the only weights oneDNN takes), and
the reference mapping's overrides for fixed-qparams ops, transposed convs and
layer norm. Activations: HistogramObserver for PTQ (it clips outliers, which
min/max does not), moving-average min/max fake-quantize for QAT.
"""

from __future__ import annotations

from fxquant import fake_quantize, observer
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.patterns import reference_default_qconfig_mapping
from torch import nn

__all__ = ["activation_qconfig", "default_qconfig_mapping"]


def activation_qconfig(is_qat: bool, *, reduce_range: bool = False) -> QConfig:
    """uint8 activations and per-channel symmetric int8 weights.

    Example:
        >>> activation_qconfig(is_qat=False).activation().quant_max
        255
    """
    if is_qat:
        activation = fake_quantize.FakeQuantize.with_args(
            observer=observer.MovingAverageMinMaxObserver,
            quant_min=0,
            quant_max=127 if reduce_range else 255,
        )
        return QConfig(
            activation=activation, weight=fake_quantize.default_per_channel_weight_fake_quant
        )
    histogram = observer.HistogramObserver.with_args(reduce_range=reduce_range)
    return QConfig(activation=histogram, weight=observer.default_per_channel_weight_observer)


def default_qconfig_mapping(is_qat: bool) -> QConfigMapping:
    """Every op the backend quantizes, with the qconfig above.

    Example:
        >>> mapping = default_qconfig_mapping(is_qat=False)
        >>> mapping.global_qconfig.activation().quant_max
        255
    """
    mapping = reference_default_qconfig_mapping(is_qat)
    base = activation_qconfig(is_qat)
    mapping.set_global(base)
    per_tensor = (
        fake_quantize.default_weight_fake_quant if is_qat else observer.default_weight_observer
    )
    for conv_transpose in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d):
        mapping.set_object_type(conv_transpose, QConfig(base.activation, per_tensor))
    float_weight = QConfig(base.activation, observer.default_placeholder_observer)
    mapping.set_object_type(nn.LayerNorm, float_weight)
    return mapping
