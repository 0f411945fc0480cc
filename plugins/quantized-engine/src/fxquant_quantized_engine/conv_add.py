"""Conv + add (+ relu) on the quint8 engines: the int8 conv, then ``quantized::add``.

The engines have no conv kernel that sums a second tensor (torch's
``quantized::conv2d_add`` is oneDNN's alone), so a fused ``ConvAdd2d`` /
``ConvAddReLU2d`` runs as two kernels: the engine's conv into an intermediate
uint8 grid, then the engine's ``quantized::add`` (``add_relu``) into the output's.

The reference model never rounds the conv's own output, so the intermediate grid
is chosen to lose nothing the output could show: it covers exactly the conv
values ``c`` for which ``c + x2`` can land inside the output's range,
``[out_min - x2_max, out_max - x2_min]`` (a ``c`` beyond it clamps the sum to the
same end of the output range either way). Its step is the output's plus the
added tensor's, so the result is within one output step of the reference where
the added tensor's range is no wider than the output's (a ResNet block's
identity; half an intermediate step plus one output step in general).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxquant_quantized_engine.modules import QuantizedBinary, QuantizedConv
from fxquant_quantized_engine.views import TensorQParams

__all__ = ["QuantizedConvAdd", "intermediate_qparams"]


def _real_range(q: TensorQParams) -> tuple[float, float]:
    return (q.quant_min - q.zero_point) * q.scale, (q.quant_max - q.zero_point) * q.scale


def intermediate_qparams(extra: TensorQParams, out: TensorQParams) -> TensorQParams:
    """The uint8 grid of the conv's output inside conv + add (module docstring).

    Example:
        >>> mid = intermediate_qparams(TensorQParams(0.1, 0), TensorQParams(0.1, 0))
        >>> round(mid.scale, 6), mid.zero_point
        (0.2, 128)
    """
    out_low, out_high = _real_range(out)
    extra_low, extra_high = _real_range(extra)
    low, high = min(out_low - extra_high, 0.0), max(out_high - extra_low, 0.0)
    scale = max((high - low) / 255, 1e-8)
    zero_point = min(255, max(0, round(-low / scale)))
    return TensorQParams(scale, zero_point)


class QuantizedConvAdd(nn.Module):
    """``add(conv(x1), x2)`` (then relu) on uint8 tensors: the engine's conv and add kernels.

    Args:
        engine: ``"fbgemm"`` or ``"qnnpack"``.
        reference: the reference ``Conv2d`` of the fused module.
        qparams: the conv input's, the added tensor's and the output's qparams.
        relu: ``ConvAddReLU2d`` (``quantized::add_relu``).

    Example:
        >>> from fxquant.nn import reference
        >>> weight = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...           "scale": 0.1, "zero_point": 0}
        >>> ref = reference.Conv2d.from_float(nn.Conv2d(2, 2, 1), weight)
        >>> q = TensorQParams(0.1, 0)
        >>> kernel = QuantizedConvAdd("qnnpack", ref, (q, q, TensorQParams(0.2, 0)))
        >>> x = torch.zeros(1, 2, 3, 3, dtype=torch.uint8)
        >>> kernel(x, x).shape
        torch.Size([1, 2, 3, 3])
    """

    def __init__(
        self,
        engine: str,
        reference: Any,
        qparams: tuple[TensorQParams, TensorQParams, TensorQParams],
        relu: bool = False,
    ) -> None:
        super().__init__()
        x, extra, out = qparams
        mid = intermediate_qparams(extra, out)
        self.conv = QuantizedConv(engine, reference, x, mid)
        self.add = QuantizedBinary(engine, "add", (mid, extra), out, relu=relu)

    def absorb(self, step: object) -> bool:
        """Take over a relu/relu6 clamp, then the dequantize step, that alone follow it.

        Example:
            >>> from fxquant.lowering.kernels.integer import IntegerClamp
            >>> from fxquant.nn import reference
            >>> weight = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
            ...           "scale": 0.1, "zero_point": 0}
            >>> ref = reference.Conv2d.from_float(nn.Conv2d(2, 2, 1), weight)
            >>> q = TensorQParams(0.1, 0)
            >>> QuantizedConvAdd("fbgemm", ref, (q, q, q)).absorb(IntegerClamp(0, 60))
            True
        """
        return self.add.absorb(step)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """Convolve ``x1`` into the intermediate grid, add ``x2`` into the output's."""
        # the add takes the quint8 result the conv's output views: no new view (views.py)
        return self.add(self.conv(x1), x2)
