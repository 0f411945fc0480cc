"""The default QConfigMapping of the ``reference`` backend.

One qconfig globally (uint8 activations, int8 per-channel weights), with the overrides
the reference patterns need to accept every op:

    sigmoid, hardsigmoid, softmax, tanh    fixed-qparams observers on the grids of
                                           :mod:`fxquant.patterns.fixed_qparams`
    conv_transpose 1d/2d/3d                per-tensor weights (a per-channel observer's
                                           axis 0 is the *input* channel of a transposed conv)
    layer_norm                             float weight (placeholder observer)
    embedding, embedding_bag               QAT: weight-only, per-row fake-quantize
                                           (:func:`embedding_qat_qconfig`); PTQ: None

QAT uses fake-quantize versions of the same, so a model prepared with
``is_qat=True`` converts to the same reference model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxquant.config import defaults
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigError
from fxquant.numerics import fake_quantize, observer
from fxquant.patterns.fixed_qparams import FixedQParams, fixed_qparams_ops

__all__ = [
    "EMBEDDING_OPS",
    "embedding_qat_qconfig",
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


EMBEDDING_OPS: tuple[Any, ...] = (nn.Embedding, nn.EmbeddingBag, F.embedding)
"""The lookups whose only quantized tensor is their table (weight-only patterns)."""


def embedding_qat_qconfig(dtype: torch.dtype = torch.uint8) -> QConfig:
    """Weight-only QAT for embeddings: float activations, a per-row fake-quantized table.

    An embedding's input is indices and its output float rows, so a global QAT qconfig
    (uint8 activations) does not fit its patterns. ``torch.uint8``: torch.ao's
    ``default_embedding_qat_qconfig`` (float zero points, 0..255); ``torch.int8``:
    symmetric -127..127 rows, for backends whose embedding patterns take int8 tables
    (oneDNN's, ExecuTorch's ``embedding_byte``).

    Example:
        >>> import torch
        >>> embedding_qat_qconfig().weight().qscheme
        torch.per_channel_affine_float_qparams
        >>> embedding_qat_qconfig(torch.int8).weight().quant_min
        -127
    """
    if dtype == torch.uint8:
        return defaults.default_embedding_qat_qconfig
    if dtype != torch.int8:
        msg = f"embedding_qat_qconfig(dtype={dtype!r}): expected torch.uint8 or torch.int8"
        raise ConfigError(msg)
    weight = fake_quantize.FakeQuantize.with_args(
        observer=observer.MovingAveragePerChannelMinMaxObserver,
        qscheme=torch.per_channel_symmetric,
        dtype=torch.int8,
        quant_min=-127,
        quant_max=127,
        ch_axis=0,
        averaging_constant=1,  # the table's current rows, as torch.ao's embedding fake-quant
    )
    return QConfig(activation=defaults.default_embedding_qat_qconfig.activation, weight=weight)


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
    if not is_qat:
        base = defaults.default_per_channel_qconfig
        return mapping_with_overrides(base, observer.default_weight_observer, is_qat)
    # per-channel weights in QAT too, so PTQ and QAT convert to the same kind of model
    weight = fake_quantize.default_per_channel_weight_fake_quant
    base = QConfig(activation=fake_quantize.default_fake_quant, weight=weight)
    return mapping_with_overrides(base, fake_quantize.default_weight_fake_quant, is_qat)


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
    # the QAT swap builds qat.Embedding from the qconfig; PTQ leaves the tables float, as
    # torch.ao's default does, and says so: the global activation qconfig does not fit a
    # lookup, and given it, explain and strict mode reported each table as skipped
    for lookup in EMBEDDING_OPS:
        mapping.set_object_type(lookup, embedding_qat_qconfig() if is_qat else None)
    return mapping
