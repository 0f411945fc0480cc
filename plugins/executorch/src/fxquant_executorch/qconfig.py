"""The default QConfigMapping of the executorch backend: what XNNPACK runs fast and accurately.

PTQ: histogram observers on int8 activations over the full -128..127 range
(XNNPACK's ``qs8`` is asymmetric: the zero point follows the data), with
``eps = 2**-12`` so no scale falls under the backend's bound; symmetric
per-output-channel int8 weights in -127..127 (XNNPACK's ``qc8w``: zero point
0, one scale per channel). The same choice as ExecuTorch's own
``XNNPACKQuantizer`` with ``get_symmetric_quantization_config(is_per_channel=True)``,
so the two produce the same kind of program.

Overrides: transposed convs take per-tensor symmetric weights (a per-channel
observer's axis 0 is their *input* channel), embeddings weight-only int8
per row (looked up in the int8 table by the portable runtime's
``embedding_byte``), ELU stays float (XNNPACK has none). Ops the backend does not list
(sigmoid, softmax, GELU, layer norm, matmuls...) stay float: XNNPACK runs them
in float32 between its int8 nodes.

QAT: moving-average fake-quantize on the same ranges, so a QAT model converts
to the same kind of program.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from torch import nn

__all__ = [
    "default_qconfig_mapping",
    "dynamic_qconfig",
    "dynamic_qconfig_mapping",
    "global_qconfig",
]

_EPS = 2**-12
_ACTIVATION: dict[str, Any] = {
    "dtype": torch.int8,
    "quant_min": -128,
    "quant_max": 127,
    "qscheme": torch.per_tensor_affine,
    "eps": _EPS,
}
_WEIGHT: dict[str, Any] = {"dtype": torch.int8, "quant_min": -127, "quant_max": 127, "eps": _EPS}
_TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, F.conv_transpose1d, F.conv_transpose2d)


def _qconfigs(is_qat: bool) -> tuple[QConfig, QConfig, QConfig]:
    """(global, transposed conv, embedding) qconfigs."""
    from fxquant import fake_quantize as fq
    from fxquant import observer as obs

    per_channel = {"qscheme": torch.per_channel_symmetric, "ch_axis": 0, **_WEIGHT}
    per_tensor = {"qscheme": torch.per_tensor_symmetric, **_WEIGHT}
    if is_qat:
        act: Any = fq.FakeQuantize.with_args(
            observer=obs.MovingAverageMinMaxObserver, **_ACTIVATION
        )
        weight: Any = fq.FakeQuantize.with_args(
            observer=obs.MovingAveragePerChannelMinMaxObserver, **per_channel
        )
        tensor_weight: Any = fq.FakeQuantize.with_args(
            observer=obs.MovingAverageMinMaxObserver, **per_tensor
        )
    else:
        act = obs.HistogramObserver.with_args(**_ACTIVATION)
        weight = obs.PerChannelMinMaxObserver.with_args(**per_channel)
        tensor_weight = obs.MinMaxObserver.with_args(**per_tensor)
    embedding = QConfig(
        activation=obs.PlaceholderObserver.with_args(dtype=torch.float),
        weight=obs.PerChannelMinMaxObserver.with_args(**per_channel),
    )
    return (
        QConfig(activation=act, weight=weight),
        QConfig(activation=act, weight=tensor_weight),
        embedding,
    )


def global_qconfig(is_qat: bool = False) -> QConfig:
    """The qconfig of every op but transposed convs and embeddings.

    Example:
        >>> observer = global_qconfig().activation()
        >>> observer.dtype, observer.quant_min, observer.quant_max
        (torch.int8, -128, 127)
    """
    return _qconfigs(is_qat)[0]


def default_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """The mapping ``fxquant.get_default_qconfig_mapping("executorch", is_qat)`` returns.

    Example:
        >>> weight = default_qconfig_mapping().global_qconfig.weight()
        >>> weight.qscheme, weight.quant_min, weight.quant_max
        (torch.per_channel_symmetric, -127, 127)
    """
    base, transposed, embedding = _qconfigs(is_qat)
    mapping = QConfigMapping().set_global(base)
    # XNNPACK has no ELU (its config is disabled in ExecuTorch 1.5): int8 would only add
    # quantize/dequantize steps around the portable runtime's float kernel
    overrides: list[tuple[tuple[Any, ...], QConfig | None]] = [
        (_TRANSPOSED, transposed),
        ((nn.Embedding, nn.EmbeddingBag, F.embedding), embedding),
        ((nn.ELU, F.elu), None),
    ]
    for ops, qconfig in overrides:
        for op in ops:
            mapping.set_object_type(op, qconfig)
    return mapping


def dynamic_qconfig() -> QConfig:
    """Dynamic int8 linear: activations quantized per call, symmetric per-channel int8 weights.

    XNNPACK runs it as one node (its ``choose_qparams`` included) with no
    calibration at all; the output stays float.

    Example:
        >>> dynamic_qconfig().activation().is_dynamic
        True
    """
    from fxquant import observer as obs

    per_channel = {"qscheme": torch.per_channel_symmetric, "ch_axis": 0, **_WEIGHT}
    return QConfig(
        activation=obs.PlaceholderObserver.with_args(
            dtype=torch.int8, quant_min=-128, quant_max=127, is_dynamic=True
        ),
        weight=obs.PerChannelMinMaxObserver.with_args(**per_channel),
    )


def dynamic_qconfig_mapping() -> QConfigMapping:
    """Dynamic int8 for every linear layer, everything else float (no calibration needed).

    Example:
        >>> dynamic_qconfig_mapping().object_type_qconfigs[torch.nn.Linear].activation().dtype
        torch.int8
    """
    mapping = QConfigMapping()
    for op in (nn.Linear, F.linear):
        mapping.set_object_type(op, dynamic_qconfig())
    return mapping
