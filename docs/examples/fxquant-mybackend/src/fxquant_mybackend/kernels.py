"""mybackend's lowering rules and kernels: integer tensors in, integer tensors out.

A kernel replaces ``dequantize -> float op -> quantize`` in the reference model
(see the kernel protocol in fxquant's plugin guide). ``QLinear`` is a real one,
written in torch; replace its ``forward`` with your hardware's call.
"""

from __future__ import annotations

import torch
from fxquant.lowering import LoweringRule
from fxquant.nn import reference
from torch import nn


class QLinear(nn.Module):
    """uint8 x int8 -> uint8 linear, per-tensor or per-channel (axis 0) weights."""

    def __init__(self, module, x, out):
        super().__init__()
        qparams = module.get_weight_qparams()
        channels = module.weight.shape[0]
        scale = torch.as_tensor(qparams["scale"], dtype=torch.float32).reshape(-1)
        zero_point = torch.as_tensor(qparams["zero_point"], dtype=torch.float32).reshape(-1)
        self.register_buffer("weight", module.get_quantized_weight().detach().clone())
        self.register_buffer("weight_scale", scale.expand(channels).clone())
        self.register_buffer("weight_zero_point", zero_point.expand(channels).clone())
        bias = module.bias
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.x_scale, self.x_zero_point = float(x.scale), int(x.zero_point)
        self.out_scale, self.out_zero_point = float(out.scale), int(out.zero_point)
        self.out_min, self.out_max, self.out_dtype = out.quant_min, out.quant_max, out.dtype

    def forward(self, qx):
        """The integer sums, scaled once, then requantized to the output's qparams."""
        # float32 holds these integer sums exactly while in_features * 255 * 128 < 2**24
        # (about 500 features); past that its rounding stays far below one output step
        weight = self.weight.float() - self.weight_zero_point[:, None]
        sums = (qx.float() - self.x_zero_point) @ weight.t()
        y = sums * (self.x_scale * self.weight_scale)
        if self.bias is not None:
            y = y + self.bias
        q = torch.round(y / self.out_scale) + self.out_zero_point
        return q.clamp(self.out_min, self.out_max).to(self.out_dtype)


def build_qlinear(match):
    """The kernel for one reference Linear, or None to leave it in reference form."""
    x, out = match.inputs[0], match.output
    if x is None or out is None or x.is_dynamic or x.is_per_channel:
        return None  # float or dynamic input, or a float output (fused relu): decline
    return QLinear(match.modules[-1], x, out)


def lowering_rules():
    """One rule per kernel; ``tolerance`` (output steps) is what ``fxquant check`` allows."""
    return [LoweringRule(reference.Linear, build=build_qlinear, name="mybackend_qlinear")]
