"""The quantize step at a float boundary of a lowered model, in fewer passes.

``fxquant.numerics.qdq.quantize_per_tensor`` is bit-identical to torch: it rounds the
fused multiply-add ``x * inv_scale + zero_point`` to float32 once, then to an integer
half to even, which plain tensor ops can only reproduce through float64 (seven passes
over the data). A lowered model only has to stay within one quantization step of the
reference model, so its boundaries use float32 arithmetic instead: one pass for the
affine map, one round, one clamp, one conversion. The round is the reference's, half
to even on the float32 value: values on a half step are common (a dequantized value
times an SE gate of 0.5, a mean of two), and rounding them all up moves a conv that
sums hundreds of them several of its steps from the reference. The conversion goes
through int32, written over the float32 values it converts (same size, one element per
element): torch 2.13 converts float32 to int32 and int32 to uint8 in 22 us on a
128x768 activation, float32 to uint8 directly in 39 us, and a new int32 tensor of a
batch-8 activation (3 MB) can cost a page fault per page. The results differ from the
reference only where the unfused multiply-add rounds across a half-integer, by one step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fxquant.dtypes import canonical_dtype

__all__ = ["quantize_per_tensor"]


def quantize_per_tensor(  # the qdq op's schema
    x: Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype: torch.dtype
) -> Tensor:
    """``clamp(round(x / scale) + zero_point)`` as ``dtype``, within one step of the reference op.

    Args:
        x: float tensor.
        scale: the quantization step.
        zero_point: the integer that stands for 0.0.
        quant_min: smallest integer kept.
        quant_max: largest integer kept.
        dtype: ``torch.uint8`` or ``torch.int8`` (``quint8``/``qint8`` mean the same).

    Example:
        >>> quantize_per_tensor(torch.tensor([0.0, 0.52, 9.0]), 0.1, 3, 0, 255, torch.uint8)
        tensor([ 3,  8, 93], dtype=torch.uint8)
    """
    plain = canonical_dtype(dtype)
    x = x.float()  # no copy for float32; no branch on x, so the step traces and exports
    # x * (1 / scale) + zero_point rounded to float32 first, then to an integer half to
    # even: the reference op's two roundings, so a value on (or within float32 rounding of)
    # a half step goes the same way in both
    y = torch.add(torch.tensor(float(zero_point)), x, alpha=1.0 / scale).round_()
    return _to_integers(y.clamp_(quant_min, quant_max), plain)


def _to_integers(y: Tensor, dtype: torch.dtype) -> Tensor:
    """``y.to(dtype)`` (truncating) for a fresh float32 ``y`` in ``dtype``'s range, via int32
    written in place: ``y`` is a temporary the caller made, read once per element."""
    as_int32 = y.view(torch.int32)
    as_int32.copy_(y)
    return as_int32.to(dtype)
