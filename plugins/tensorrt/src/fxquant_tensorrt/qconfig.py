"""The default QConfigMapping of the tensorrt backend: TensorRT's explicit-quantization numbers.

    activations     int8, symmetric (zero point 0), per tensor, -128..127
                    PTQ: HistogramObserver; QAT: moving-average min/max fake-quantize
    weights         int8, symmetric per output channel, -127..127 (NVIDIA's narrow range);
                    per tensor for transposed convs and addmm, whose weight's axis 0 is
                    not the output channel
    float           layer norm, softmax, GELU, sigmoid, tanh, hardswish, hardsigmoid,
                    SiLU, Mish, embedding, indexing, sdpa, division, pow
                    (:data:`FLOAT_OPS`): TensorRT runs them in float, so no Q/DQ goes
                    around them (``explain`` says ``qconfig_none``)
    float too       ``narrow`` and dropout (:data:`PASS_THROUGH_OPS`): each slice gets its
                    own Q/DQ after it; a dropout puts no Q/DQ on a float GEMM output

For transformers, :func:`transformer_qconfig_mapping` also keeps the adds and
attention matmuls float: a BERT's residual adds feed LayerNorm (float in
TensorRT too), and int8 Q/DQ on that residual stream costs ~10 dB of SQNR.

TensorRT has no zero point: with an asymmetric qconfig, prepare leaves the node
float with reason ``zero_point`` (the patterns ask for symmetric observers).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from torch import nn

__all__ = [
    "FLOAT_OPS",
    "PASS_THROUGH_OPS",
    "default_qconfig_mapping",
    "transformer_qconfig_mapping",
]

_ACTIVATION: dict[str, Any] = {
    "dtype": torch.int8,
    "qscheme": torch.per_tensor_symmetric,
    "quant_min": -128,
    "quant_max": 127,
}
_WEIGHT: dict[str, Any] = {"dtype": torch.int8, "quant_min": -127, "quant_max": 127}

FLOAT_OPS: tuple[Any, ...] = (
    nn.LayerNorm, F.layer_norm, nn.Softmax, F.softmax, torch.softmax, nn.GELU, F.gelu,
    nn.Sigmoid, torch.sigmoid, F.sigmoid, "sigmoid", nn.Tanh, torch.tanh, F.tanh, "tanh",
    nn.Hardswish, F.hardswish, nn.Hardsigmoid, F.hardsigmoid,
    nn.SiLU, F.silu, nn.Mish, F.mish, nn.Embedding, F.embedding,
    # indexing moves floats (a BERT pooler's hidden_states[:, 0], before a Linear that
    # quantizes its own input); sdpa is attention's matmuls in one call; eager attention's
    # scores / sqrt(d) and a GELU written out (ALBERT's pow) are float math like the rest
    operator.getitem, F.scaled_dot_product_attention, operator.truediv, torch.div, "div",
    operator.pow, torch.pow, "pow",
)  # fmt: skip
"""Ops the default mapping leaves float: TensorRT has no int8 kernel that fuses them, and no
tensorrt pattern takes them. Left to the global qconfig, ``explain`` called them skipped and
``strict=True`` refused them (a MobileNetV3's hardsigmoid, BERT's pooler slice and eager
attention's division), where ``qconfig_none`` is what happens."""

PASS_THROUGH_OPS: tuple[Any, ...] = ("narrow", torch.narrow, nn.Dropout, F.dropout)
"""Left float by the default mapping too, though TensorRT could carry int8 through them.

A slice: the Q/DQ goes after each slice, so the query, key and value cut from one packed
projection (MultiheadAttention's ``in_proj``, whose GEMM returns float) get a scale each.
A dropout is the identity at inference (the ONNX export has none): an int8 one would put a
Q/DQ on the float output of the Linear before it (the residual branch of a stock
``nn.TransformerEncoderLayer``), which costs accuracy and fuses nothing."""

_PER_TENSOR_WEIGHT_OPS: tuple[Any, ...] = (
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    F.conv_transpose1d,
    F.conv_transpose2d,
    F.conv_transpose3d,
    torch.addmm,
)


def _qconfigs(is_qat: bool) -> tuple[QConfig, QConfig]:
    # (global qconfig, the same with per-tensor weights)
    from fxquant.numerics import observer as obs  # heavy: only when asked
    from fxquant.numerics.fake_quantize import FakeQuantize

    channel = {"qscheme": torch.per_channel_symmetric, "ch_axis": 0, **_WEIGHT}
    tensor = {"qscheme": torch.per_tensor_symmetric, **_WEIGHT}
    if is_qat:
        activation: Any = FakeQuantize.with_args(
            observer=obs.MovingAverageMinMaxObserver, **_ACTIVATION
        )
        per_channel: Any = FakeQuantize.with_args(
            observer=obs.MovingAveragePerChannelMinMaxObserver, **channel
        )
        per_tensor: Any = FakeQuantize.with_args(observer=obs.MovingAverageMinMaxObserver, **tensor)
    else:
        activation = obs.HistogramObserver.with_args(**_ACTIVATION)
        per_channel = obs.PerChannelMinMaxObserver.with_args(**channel)
        per_tensor = obs.MinMaxObserver.with_args(**tensor)
    return QConfig(activation=activation, weight=per_channel), QConfig(
        activation=activation, weight=per_tensor
    )


def default_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """The mapping ``fxquant.get_default_qconfig_mapping("tensorrt", is_qat)`` returns.

    Example:
        >>> qconfig = default_qconfig_mapping().global_qconfig
        >>> activation = qconfig.activation()
        >>> activation.dtype, activation.qscheme, qconfig.weight().qscheme
        (torch.int8, torch.per_tensor_symmetric, torch.per_channel_symmetric)
        >>> default_qconfig_mapping().qconfig_for("", torch.nn.LayerNorm) is None
        True
    """
    base, per_tensor = _qconfigs(is_qat)
    mapping = QConfigMapping().set_global(base)
    for op in _PER_TENSOR_WEIGHT_OPS:
        mapping.set_object_type(op, per_tensor)
    for op in (*FLOAT_OPS, *PASS_THROUGH_OPS):
        mapping.set_object_type(op, None)
    return mapping


def transformer_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """The default mapping with adds and matmuls float: GEMMs int8, the residual stream float.

    In a transformer the residual add feeds a LayerNorm, which TensorRT runs in
    float: int8 Q/DQ on its inputs buys no fusion and costs accuracy (BERT-base-like,
    measured: 23 dB SQNR against float with int8 adds, 33 dB without). The
    attention matmuls read softmax probabilities, which symmetric int8 wastes
    half its range on. Every Linear stays int8 (TensorRT's int8 GEMMs).

    Example:
        >>> import operator
        >>> transformer_qconfig_mapping().qconfig_for("", operator.add) is None
        True
    """
    mapping = default_qconfig_mapping(is_qat)
    for op in (operator.add, torch.add, torch.matmul, operator.matmul, torch.bmm):
        mapping.set_object_type(op, None)
    return mapping
