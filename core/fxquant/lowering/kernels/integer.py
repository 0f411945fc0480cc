"""Kernels that work on the integers themselves, shared by every backend's lowering rules."""

from __future__ import annotations

import torch
from torch import nn

from fxquant.lowering import QParams
from fxquant.numerics import qdq

__all__ = ["IntegerClamp"]


class IntegerClamp(nn.Module):
    """relu, relu6 or hardtanh on the integers: a clamp to ``[low, high]`` (no upper bound
    when ``high`` is None). Exact where input and output share qparams, as backends configure
    these ops. A conv, linear or add kernel that it alone follows absorbs it (``absorb``).

    Example:
        >>> IntegerClamp(3, 9)(torch.tensor([0, 5, 200], dtype=torch.uint8)).tolist()
        [3, 5, 9]
    """

    def __init__(self, low: int, high: int | None = None) -> None:
        super().__init__()
        self.low, self.high = low, high

    @classmethod
    def for_reals(cls, out: QParams, low: float, high: float) -> IntegerClamp:
        """The clamp to the integers ``out`` quantizes the reals ``low`` and ``high`` to.

        ``quantize(hardtanh(dequantize(q)))`` is ``q`` clamped between them.

        Example:
            >>> q = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=10)
            >>> clamp = IntegerClamp.for_reals(q, 0.0, 6.0)
            >>> clamp.low, clamp.high
            (10, 70)
        """
        assert out.scale is not None  # static qparams
        assert out.zero_point is not None
        bounds = qdq.quantize_per_tensor(
            torch.tensor([low, high]),
            out.scale,
            out.zero_point,
            out.quant_min,
            out.quant_max,
            out.dtype,
        )
        return cls(int(bounds[0]), int(bounds[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Clamp the integers of ``x``."""
        return torch.clamp(x, self.low, self.high)
