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

uint8 activations over the full 0..255 range, int8 weights symmetric per
output channel (the only weights oneDNN takes; per tensor for transposed
convs). Activations: HistogramObserver for PTQ (it clips outliers, which
min/max does not), moving-average min/max fake-quantize for QAT. QAT gives
embedding tables symmetric int8 rows (the weight-only dtype oneDNN's embedding
patterns take); PTQ leaves them float, as torch.ao's default does.

The weights' range depends on the CPU (``fxquant.lowering.kernels.cpu``, asked when the
mapping is built): -128..127 with VNNI or AMX, where oneDNN adds each u8 x s8
product in int32; 7 bits (-63..63) without, where it adds pairs of products in
int16 with saturation and 8-bit weights give wrong results (an AVX2 CPU: 10 dB
instead of 37 dB of SQNR on a linear stack). torch.ao's x86 default reduces the
activations to 7 bits instead (``reduce_range``), which leaves inputs beyond the
calibrated range (stored up to 255) to overflow, and is 0.3-2.4 dB less accurate
on the zoo's models (``fxquant.lowering.kernels.cpu``'s figures). 7-bit weights cost
accuracy, not speed. A user's own 8-bit-weight qconfig stays correct there: the
kernels decline it and the reference form runs it (``fxquant.explain`` says why).
``FXQUANT_CPU_VNNI=1`` / ``0`` overrides what the CPU says.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering.kernels import cpu
from fxquant.nn import intrinsic
from fxquant.numerics import fake_quantize, observer
from fxquant.patterns import reference_default_qconfig_mapping
from fxquant.patterns.qconfigs import EMBEDDING_OPS, embedding_qat_qconfig
from torch import nn

__all__ = [
    "FLOAT_OPS",
    "activation_qconfig",
    "default_qconfig_mapping",
    "dynamic_qconfig",
    "per_channel_weight",
]

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
    # the head split of fxquant's own MultiheadAttention rewrite (flow/transformer.py)
    "narrow", "unflatten", "movedim", torch.narrow, torch.unflatten, torch.movedim,
    # indexing moves floats too (a BERT pooler's hidden_states[:, 0], before a Linear that
    # quantizes its own input); sdpa is attention's matmuls in one call; the scores'
    # scaling and a GELU written out (ALBERT's pow, tanh, mul) are float math like the rest.
    # None of them has an int8 pattern here: left to the global qconfig, explain and strict
    # mode reported each as skipped on the default mapping
    operator.getitem, F.scaled_dot_product_attention, operator.truediv, torch.div,
    operator.pow, torch.pow,
)  # fmt: skip


def per_channel_weight(is_qat: bool, *, seven_bit: bool | None = None) -> Any:
    """The per-channel symmetric int8 weight observer (or fake-quantize) constructor.

    Args:
        is_qat: a fake-quantize module instead of an observer.
        seven_bit: weights in -63..63; default: on CPUs without VNNI, where oneDNN's
            u8 x s8 products saturate on larger ones (module docstring).

    Example:
        >>> per_channel_weight(is_qat=False, seven_bit=True)().quant_max
        63
        >>> per_channel_weight(is_qat=True, seven_bit=False)().quant_min
        -128
    """
    if seven_bit is None:
        seven_bit = not cpu.has_vnni()
    if not seven_bit:
        if is_qat:
            return fake_quantize.default_per_channel_weight_fake_quant
        return observer.default_per_channel_weight_observer
    low, high = cpu.SEVEN_BIT_WEIGHT
    if is_qat:
        return fake_quantize.FakeQuantize.with_args(
            observer=observer.MovingAveragePerChannelMinMaxObserver,
            quant_min=low,
            quant_max=high,
            dtype=torch.int8,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
        )
    return observer.PerChannelMinMaxObserver.with_args(
        dtype=torch.int8, qscheme=torch.per_channel_symmetric, quant_min=low, quant_max=high
    )


def activation_qconfig(
    is_qat: bool, *, reduce_range: bool = False, seven_bit_weights: bool | None = None
) -> QConfig:
    """uint8 activations and per-channel symmetric int8 weights.

    Args:
        is_qat: fake-quantize modules instead of observers.
        reduce_range: 7-bit activations (0..127).
        seven_bit_weights: weights in -63..63; default: on CPUs without VNNI.

    Example:
        >>> qconfig = activation_qconfig(is_qat=False, seven_bit_weights=True)
        >>> qconfig.activation().quant_max, qconfig.weight().quant_max
        (255, 63)
        >>> activation_qconfig(is_qat=True, reduce_range=True).activation().quant_max
        127
    """
    weight = per_channel_weight(is_qat, seven_bit=seven_bit_weights)
    if is_qat:
        activation = fake_quantize.FakeQuantize.with_args(
            observer=observer.MovingAverageMinMaxObserver,
            quant_min=0,
            quant_max=127 if reduce_range else 255,
        )
        return QConfig(activation=activation, weight=weight)
    histogram = observer.HistogramObserver.with_args(reduce_range=reduce_range)
    return QConfig(activation=histogram, weight=weight)


def dynamic_qconfig(*, seven_bit_weights: bool | None = None) -> QConfig:
    """Dynamic int8 linear: uint8 activations quantized per call, per-channel int8 weights.

    The weights are the default mapping's: 7 bits (-63..63) on CPUs without VNNI
    (module docstring). Dynamic linears with 8-bit weights and activations run
    exactly there too, as two 7-bit GEMMs (``DynamicQLinear``), at 2-3x the time.

    Args:
        seven_bit_weights: weights in -63..63; default: on CPUs without VNNI.

    Example:
        >>> qconfig = dynamic_qconfig(seven_bit_weights=True)
        >>> observer = qconfig.activation()
        >>> observer.is_dynamic, observer.quant_max, qconfig.weight().quant_max
        (True, 255, 63)
    """
    activation = observer.PlaceholderObserver.with_args(
        dtype=torch.uint8, quant_min=0, quant_max=255, is_dynamic=True
    )
    return QConfig(
        activation=activation, weight=per_channel_weight(False, seven_bit=seven_bit_weights)
    )


def default_qconfig_mapping(is_qat: bool) -> QConfigMapping:
    """Conv, pooling and Linear inputs in int8; norms, softmax, matmuls and residual adds float.

    Weights are 7-bit (-63..63) on CPUs without VNNI (module docstring).

    Example:
        >>> import torch
        >>> from fxquant.lowering.kernels import cpu
        >>> mapping = default_qconfig_mapping(is_qat=False)
        >>> mapping.qconfig_for("", torch.nn.LayerNorm) is None
        True
        >>> mapping.global_qconfig.activation().quant_max
        255
        >>> mapping.global_qconfig.weight().quant_max == (127 if cpu.has_vnni() else 63)
        True
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
    if is_qat:
        for lookup in EMBEDDING_OPS:
            mapping.set_object_type(lookup, embedding_qat_qconfig(torch.int8))
    else:
        # an entry for a fused class outranks its parts' entries: these adds are int8.
        # Not for QAT: conv + bn + add cannot fuse while the BatchNorm still trains
        for fused in (intrinsic.ConvAdd2d, intrinsic.ConvAddReLU2d):
            mapping.set_object_type(fused, int8)
    return mapping
