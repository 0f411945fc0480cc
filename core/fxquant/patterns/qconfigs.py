"""The default QConfigMapping of the ``reference`` backend.

One qconfig globally (uint8 activations, int8 per-channel weights), with the overrides
the reference patterns need to accept every op:

    sigmoid, hardsigmoid, softmax, tanh    fixed-qparams observers on the grids of
                                           :mod:`fxquant.patterns.fixed_qparams`
    conv_transpose 1d/2d/3d                per-tensor weights (a per-channel observer's
                                           axis 0 is the *input* channel of a transposed conv)
    layer_norm                             float weight (placeholder observer)

QAT uses fake-quantize versions of the same, so a model prepared with
``is_qat=True`` converts to the same reference model.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from fxquant.config import defaults
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.numerics import fake_quantize, observer
from fxquant.patterns.fixed_qparams import FixedQParams, fixed_qparams_ops

__all__ = [
    "fixed_qparams_qconfig",
    "mapping_with_overrides",
    "reference_default_qconfig_mapping",
]

_TRANSPOSED = (
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    F.conv_transpose1d,
    F.conv_transpose2d,
    F.conv_transpose3d,
)


def fixed_qparams_qconfig(grid: FixedQParams, is_qat: bool) -> QConfig:
    """A QConfig whose activation observer (or fake-quantize) always reports ``grid``.

    Example:
        >>> from fxquant.patterns.fixed_qparams import RANGE_0_TO_1
        >>> observer = fixed_qparams_qconfig(RANGE_0_TO_1, is_qat=False).activation()
        >>> float(observer.calculate_qparams()[0])
        0.00390625
    """
    fixed = observer.FixedQParamsObserver.with_args(
        scale=grid.scale,
        zero_point=grid.zero_point,
        dtype=grid.dtype,
        quant_min=grid.quant_min,
        quant_max=grid.quant_max,
    )
    if is_qat:
        activation: Any = fake_quantize.FixedQParamsFakeQuantize.with_args(observer=fixed)
        return QConfig(activation=activation, weight=fake_quantize.default_weight_fake_quant)
    return QConfig(activation=fixed, weight=observer.default_weight_observer)


def _global_qconfig(is_qat: bool) -> QConfig:

    if not is_qat:
        return defaults.default_per_channel_qconfig
    # per-channel weights in QAT too, so PTQ and QAT convert to the same kind of model
    return QConfig(
        activation=fake_quantize.default_fake_quant,
        weight=fake_quantize.default_per_channel_weight_fake_quant,
    )


def reference_default_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """A QConfigMapping that the ``reference`` backend accepts for every pattern it lists.

    Globally: uint8 activations (0..127) and int8 symmetric per-channel weights,
    as observers (PTQ) or fake-quantize modules (QAT); see the module docstring
    for the overrides.

    Args:
        is_qat: fake-quantize modules for quantization-aware training instead
            of observers.

    Example:
        >>> import torch
        >>> mapping = reference_default_qconfig_mapping()
        >>> scale, zero_point = mapping.qconfig_for("", torch.tanh).activation().calculate_qparams()
        >>> float(scale), int(zero_point)
        (0.0078125, 128)
    """
    base = _global_qconfig(is_qat)
    per_tensor_weight = (
        fake_quantize.default_weight_fake_quant if is_qat else observer.default_weight_observer
    )
    return mapping_with_overrides(base, per_tensor_weight, is_qat)


def mapping_with_overrides(base: QConfig, per_tensor_weight: Any, is_qat: bool) -> QConfigMapping:
    """A mapping with ``base`` globally and the overrides of the module docstring.

    Transposed convs get ``per_tensor_weight`` (with ``base``'s activation),
    layer norm a float weight, and fixed-qparams ops their exact grid; a
    backend with other global observers builds its default mapping with it.

    Args:
        base: the global QConfig.
        per_tensor_weight: the weight observer (or fake-quantize) constructor
            of transposed convs.
        is_qat: fake-quantize modules for the fixed-qparams ops.

    Example:
        >>> import torch
        >>> from fxquant.config import defaults
        >>> base = defaults.default_per_channel_qconfig
        >>> mapping = mapping_with_overrides(base, base.weight, is_qat=False)
        >>> mapping.qconfig_for("", torch.nn.LayerNorm).weight().dtype
        torch.float32
    """
    mapping = QConfigMapping().set_global(base)
    transposed = QConfig(activation=base.activation, weight=per_tensor_weight)
    for conv_transpose in _TRANSPOSED:
        mapping.set_object_type(conv_transpose, transposed)
    float_weight = QConfig(activation=base.activation, weight=observer.default_placeholder_observer)
    for layer_norm in (nn.LayerNorm, F.layer_norm):
        mapping.set_object_type(layer_norm, float_weight)
    by_grid: dict[FixedQParams, QConfig] = {}
    for op, grid in fixed_qparams_ops().items():
        # one QConfig per grid: ops on the same grid compare equal, as fusion requires
        qconfig = by_grid.setdefault(grid, fixed_qparams_qconfig(grid, is_qat))
        mapping.set_object_type(op, qconfig)
    return mapping
