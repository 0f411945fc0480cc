"""The default QConfigMapping of the x86 backend: int8 where it is fast and accurate.

Like torchao's X86InductorQuantizer: conv (and its relu / add fusions), pooling
and the inputs of Linear are int8; LayerNorm, softmax, GELU and the residual
adds of transformers stay float. Attention's matmuls stay float too: eager
PyTorch has no batched int8 matmul on plain tensors, and dequantizing both
inputs and quantizing the output costs more than an int8 product would save.
Putting the others in int8 (torch.ao's x86 default) costs BERT-like encoders
about 17 dB of SQNR and buys no speed. An add
that a conv absorbs (``ConvAdd2d``, ``ConvAddReLU2d``: ResNet and MobileNetV2
blocks) is int8: oneDNN sums it in the conv's epilogue, which halves a ResNet's
latency against a float add between dequantize and quantize steps.
Weights: int8 symmetric per output channel; activations uint8 over 0..255.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.nn import intrinsic
from fxquant.patterns import reference_default_qconfig_mapping
from fxquant_onednn.qconfig import activation_qconfig
from torch import nn

__all__ = ["FLOAT_OPS", "default_qconfig_mapping"]

# ops kept float: their int8 versions cost accuracy in transformers and save no time
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


def default_qconfig_mapping(is_qat: bool) -> QConfigMapping:
    """Conv, pooling, Linear and matmul in int8; norms, softmax and residual adds float.

    Example:
        >>> import torch
        >>> mapping = default_qconfig_mapping(is_qat=False)
        >>> mapping.qconfig_for("", torch.nn.LayerNorm) is None
        True
    """
    mapping = reference_default_qconfig_mapping(is_qat)
    int8 = activation_qconfig(is_qat)
    mapping.set_global(int8)
    for op in FLOAT_OPS:
        mapping.set_object_type(op, None)
    # an entry for a fused class outranks its parts' entries: these adds are int8
    for fused in (intrinsic.ConvAdd2d, intrinsic.ConvAddReLU2d):
        mapping.set_object_type(fused, int8)
    return mapping
