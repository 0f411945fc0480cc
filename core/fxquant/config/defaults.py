"""The default QConfigs PyTorch users know, built from fxquant's observers.

Every entry is ``QConfig(activation=..., weight=...)`` with the same observers,
dtypes and ranges as torch.ao's namesake, written with plain dtypes
(``torch.uint8``/``torch.int8``) instead of ``torch.quint8``/``torch.qint8``.

Example:
    >>> from fxquant.config.defaults import default_qconfig
    >>> default_qconfig.weight().dtype
    torch.int8
"""

from __future__ import annotations

import torch

from fxquant.config.qconfig import QConfig
from fxquant.numerics.fake_quantize import (
    FusedMovingAvgObsFakeQuantize,
    default_dynamic_fake_quant,
    default_embedding_fake_quant,
    default_fake_quant,
    default_fused_act_fake_quant,
    default_fused_wt_fake_quant,
    default_weight_fake_quant,
    fused_per_channel_wt_fake_quant_range_neg_127_to_127,
    fused_wt_fake_quant_range_neg_127_to_127,
)
from fxquant.numerics.observer import (
    HistogramObserver,
    MovingAverageMinMaxObserver,
    NoopObserver,
    PlaceholderObserver,
    default_debug_observer,
    default_dynamic_quant_observer,
    default_float_qparams_observer,
    default_observer,
    default_per_channel_weight_observer,
    default_placeholder_observer,
    default_reuse_input_observer,
    default_weight_observer,
    per_channel_weight_observer_range_neg_127_to_127,
    weight_observer_range_neg_127_to_127,
)

__all__ = [
    "bfloat16_static_qconfig",
    "default_activation_only_qconfig",
    "default_debug_qconfig",
    "default_dynamic_qat_qconfig",
    "default_dynamic_qconfig",
    "default_embedding_qat_qconfig",
    "default_per_channel_qconfig",
    "default_per_channel_symmetric_qnnpack_qat_qconfig",
    "default_per_channel_symmetric_qnnpack_qconfig",
    "default_qat_qconfig",
    "default_qat_qconfig_v2",
    "default_qconfig",
    "default_reuse_input_qconfig",
    "default_symmetric_qnnpack_qat_qconfig",
    "default_symmetric_qnnpack_qconfig",
    "default_weight_only_qconfig",
    "float16_dynamic_qconfig",
    "float16_static_qconfig",
    "float_qparams_weight_only_qconfig",
    "per_channel_dynamic_qconfig",
]

default_qconfig = QConfig(activation=default_observer, weight=default_weight_observer)
"""Static PTQ: uint8 activations (0..127), int8 symmetric per-tensor weights."""

default_debug_qconfig = QConfig(activation=default_debug_observer, weight=default_weight_observer)
"""Records activations for debugging."""

default_per_channel_qconfig = QConfig(
    activation=default_observer, weight=default_per_channel_weight_observer
)
"""Static PTQ with int8 symmetric per-channel weights."""

default_dynamic_qconfig = QConfig(
    activation=default_dynamic_quant_observer, weight=default_weight_observer
)
"""Dynamic quantization: activations quantized at run time, int8 weights."""

float16_dynamic_qconfig = QConfig(
    activation=PlaceholderObserver.with_args(dtype=torch.float16, is_dynamic=True),
    weight=PlaceholderObserver.with_args(dtype=torch.float16),
)
"""float16 weights, dynamic float16 activations."""

float16_static_qconfig = QConfig(
    activation=PlaceholderObserver.with_args(dtype=torch.float16),
    weight=PlaceholderObserver.with_args(dtype=torch.float16),
)
"""float16 activations and weights."""

bfloat16_static_qconfig = QConfig(
    activation=PlaceholderObserver.with_args(dtype=torch.bfloat16),
    weight=PlaceholderObserver.with_args(dtype=torch.bfloat16),
)
"""A bfloat16 float side: the op's inputs and output rounded to bfloat16 (a backend's
``DTypeConfig(input_dtype=torch.bfloat16, output_dtype=torch.bfloat16)`` accepts it)."""

per_channel_dynamic_qconfig = QConfig(
    activation=default_dynamic_quant_observer, weight=default_per_channel_weight_observer
)
"""Dynamic quantization with int8 per-channel weights."""

float_qparams_weight_only_qconfig = QConfig(
    activation=default_placeholder_observer, weight=default_float_qparams_observer
)
"""Weight-only (embeddings): per-row uint8 weights with float zero points."""

default_qat_qconfig = QConfig(activation=default_fake_quant, weight=default_weight_fake_quant)
"""QAT: fake-quantized uint8 activations and int8 weights."""

default_dynamic_qat_qconfig = QConfig(
    activation=default_dynamic_fake_quant, weight=default_weight_fake_quant
)
"""QAT for dynamic quantization."""

default_weight_only_qconfig = QConfig(
    activation=torch.nn.Identity, weight=default_weight_fake_quant
)
"""Fake-quantizes weights only."""

default_activation_only_qconfig = QConfig(activation=default_fake_quant, weight=torch.nn.Identity)
"""Fake-quantizes activations only."""

default_qat_qconfig_v2 = QConfig(
    activation=default_fused_act_fake_quant, weight=default_fused_wt_fake_quant
)
"""QAT with the fused observer + fake-quant modules."""

default_reuse_input_qconfig = QConfig(activation=default_reuse_input_observer, weight=NoopObserver)
"""For ops like reshape whose output reuses the input's observer."""

default_symmetric_qnnpack_qconfig = QConfig(
    activation=HistogramObserver.with_args(dtype=torch.int8, reduce_range=False, eps=2**-12),
    weight=weight_observer_range_neg_127_to_127,
)
"""QNNPACK/XNNPACK symmetric: int8 activations, weights in -127..127, eps 2**-12."""

default_per_channel_symmetric_qnnpack_qconfig = QConfig(
    activation=HistogramObserver.with_args(dtype=torch.int8, reduce_range=False, eps=2**-12),
    weight=per_channel_weight_observer_range_neg_127_to_127,
)
"""As :data:`default_symmetric_qnnpack_qconfig` with per-channel weights."""

# both QAT qnnpack qconfigs: int8 activations with qnnpack's smallest scale, 2**-12
_symmetric_qnnpack_qat_activation = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver,
    quant_min=-128,
    quant_max=127,
    dtype=torch.int8,
    reduce_range=False,
    eps=2**-12,
)

default_symmetric_qnnpack_qat_qconfig = QConfig(
    activation=_symmetric_qnnpack_qat_activation,
    weight=fused_wt_fake_quant_range_neg_127_to_127,
)
"""QAT version of :data:`default_symmetric_qnnpack_qconfig`."""

default_per_channel_symmetric_qnnpack_qat_qconfig = QConfig(
    activation=_symmetric_qnnpack_qat_activation,
    weight=fused_per_channel_wt_fake_quant_range_neg_127_to_127,
)
"""QAT version of :data:`default_per_channel_symmetric_qnnpack_qconfig`."""

default_embedding_qat_qconfig = QConfig(
    activation=NoopObserver.with_args(dtype=torch.float32), weight=default_embedding_fake_quant
)
"""QAT for embeddings: float activations, per-row fake-quantized weights."""
