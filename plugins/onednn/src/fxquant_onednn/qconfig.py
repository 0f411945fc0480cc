"""The default QConfigMapping of the onednn backend (x86 uses it too): int8 where it is fast
and accurate.

Like torchao's X86InductorQuantizer: conv (and its relu / add fusions), pooling
and the inputs of Linear are int8; LayerNorm, softmax, GELU and the residual
adds of transformers stay float. Putting those in int8 (torch.ao's x86 default)
costs BERT-like encoders about 17 dB of SQNR and buys no speed: oneDNN has no
plain-tensor int8 kernel for them, so each would run between a dequantize and a
quantize step. Attention's matmuls and the reshapes around them stay float too:
eager PyTorch has no batched int8 matmul on plain tensors, and dequantizing both
inputs and quantizing the output costs more than an int8 product would save.
The linears then return floats (their kernels take the dequantize step, a GELU
and the next quantize step as post ops).

An add that a conv absorbs (``ConvAdd2d``, ``ConvAddReLU2d``: ResNet and
MobileNetV2 blocks) is int8 for PTQ: oneDNN sums it in the conv's epilogue,
which halves a ResNet's latency against a float add between dequantize and
quantize steps. The QAT mapping keeps those adds float too: a conv + bn + add
cannot fuse while the BatchNorm still trains.

uint8 activations over the full 0..255 range (oneDNN computes u8 x s8 without
the int16 saturation of pre-VNNI kernels), int8 weights symmetric per output
channel (the only weights oneDNN takes; per tensor for transposed convs).
Activations: HistogramObserver for PTQ (it clips outliers, which min/max does
not), moving-average min/max fake-quantize for QAT.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from fxquant import fake_quantize, observer
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.nn import intrinsic
from fxquant.patterns import reference_default_qconfig_mapping
from torch import nn

__all__ = ["FLOAT_OPS", "activation_qconfig", "default_qconfig_mapping"]

# ops kept float: int8 versions cost accuracy in transformers and save no time
FLOAT_OPS: tuple[Any, ...] = (
    nn.LayerNorm, F.layer_norm, operator.add, torch.add, operator.mul, torch.mul,
    nn.Softmax, F.softmax, torch.softmax, nn.GELU, F.gelu, nn.Tanh, torch.tanh,
    nn.Sigmoid, torch.sigmoid, nn.Hardsigmoid, F.hardsigmoid,
    torch.matmul, operator.matmul, torch.bmm,
    # a dropout is a no-op at inference, and attention's reshapes move floats between the
    # linears (whose kernels return floats) and the float matmuls
    nn.Dropout, F.dropout, "view", "reshape", "permute", "transpose", "contiguous",
    torch.reshape, torch.permute, torch.transpose,
)  # fmt: skip


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
    """Conv, pooling and Linear inputs in int8; norms, softmax, matmuls and residual adds float.

    Example:
        >>> import torch
        >>> mapping = default_qconfig_mapping(is_qat=False)
        >>> mapping.qconfig_for("", torch.nn.LayerNorm) is None
        True
        >>> mapping.global_qconfig.activation().quant_max
        255
    """
    mapping = reference_default_qconfig_mapping(is_qat)
    int8 = activation_qconfig(is_qat)
    mapping.set_global(int8)
    per_tensor = (
        fake_quantize.default_weight_fake_quant if is_qat else observer.default_weight_observer
    )
    for conv_transpose in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d):
        mapping.set_object_type(conv_transpose, QConfig(int8.activation, per_tensor))
    for op in FLOAT_OPS:
        mapping.set_object_type(op, None)
    if not is_qat:
        # an entry for a fused class outranks its parts' entries: these adds are int8.
        # Not for QAT: conv + bn + add cannot fuse while the BatchNorm still trains
        for fused in (intrinsic.ConvAdd2d, intrinsic.ConvAddReLU2d):
            mapping.set_object_type(fused, int8)
    return mapping
