"""Where the engines' integer arithmetic leaves the reference: bias rounding, int32 overflow.

QNNPACK adds the bias in its int32 accumulator, rounded to the accumulator's step
``x_scale * weight_scale[c]``; the reference model adds it in float. The two agree within
one output step while that rounding, ``|b - round(b / a) * a|`` over the output scale, stays
within half a step (the requantization's own rounding is the other half). A channel whose
weight scale is huge makes ``a`` coarser than the output's step: after a few QAT steps on a
channel that saw no signal, a BN-folded MobileNetV2 conv had weight scales near 1e4 and its
bias vanished in the rounding (the lowered conv 160 steps from its reference). FBGEMM adds
a float bias: it has no such rounding.

Both engines scale the int32 accumulator to output steps and convert that to int32
before clamping: at 2**31 steps or more the conversion gives the lowest int32, so an
output the reference saturates at 255 comes out 0. The same collapsed BN channel gets
there (a ResNet-50 conv after two QAT steps: weight scale 1.2e5, 156,383 output steps per
accumulator unit); :func:`requantize_overflow_reason` declines such a layer.

FBGEMM's depthwise conv adds pairs of uint8 x int8 products in int16 with saturation on
every CPU, VNNI and AMX too (its other GEMMs use VNNI's int32 sums there): 8-bit weights on
inputs above 127 come out 13-33 steps off (:func:`depthwise_saturation_reason`).
"""

from __future__ import annotations

from typing import Any

import torch
from fxquant.lowering.kernels import cpu

from fxquant_quantized_engine.views import TensorQParams

__all__ = ["bias_rounding_reason", "depthwise_saturation_reason", "requantize_overflow_reason"]

_HALF_STEP = 0.5
_INT16_MAX = 32767
_INT32_STEPS = 2.0**31  # the float-to-int32 conversion's limit, in output steps
_BN_ADVICE = (
    "A weight scale this far above the output's is usually a channel whose BN-folded "
    "weights grew during QAT: train with a lower learning rate, or freeze the BatchNorm "
    "statistics earlier (freeze_bn_stats)"
)


def bias_rounding_reason(
    engine: str, reference: Any, x: TensorQParams, out: TensorQParams | None
) -> str | None:
    """Why ``engine``'s integer bias would put this layer over one step from its reference.

    Args:
        engine: ``"qnnpack"`` rounds its bias; any other engine gives None.
        reference: the reference Linear / Conv (its bias and weight qparams).
        x: the input's qparams; ``out``: the output's (None: a float output, no step).

    Example:
        >>> from fxquant.nn import reference as ref
        >>> qparams = {"qscheme": torch.per_tensor_symmetric, "dtype": torch.int8,
        ...            "scale": 1e4, "zero_point": 0}
        >>> linear = ref.Linear.from_float(torch.nn.Linear(2, 2), qparams)
        >>> x = out = TensorQParams(0.01, 0, 0, 255)
        >>> bias_rounding_reason("qnnpack", linear, x, out)[:44]
        'QNNPACK rounds the bias to int32 steps of 10'
    """
    bias = getattr(reference, "bias", None)
    if engine != "qnnpack" or out is None or not isinstance(bias, torch.Tensor):
        return None
    scale = torch.as_tensor(reference.get_weight_qparams()["scale"], dtype=torch.float64)
    step = x.scale * scale.reshape(-1)  # the accumulator's step, per output channel
    b = bias.detach().to(torch.float64)
    error = (b - torch.round(b / step) * step).abs() / out.scale
    worst = int(error.argmax())
    if float(error[worst]) <= _HALF_STEP:
        return None
    size = float(step[worst if step.numel() > 1 else 0])
    return (
        f"QNNPACK rounds the bias to int32 steps of {size:.3g} (input scale x weight scale; "
        f"output channel {worst}), {float(error[worst]):.1f} output steps from its float "
        f"value (output scale {out.scale:.3g}): the layer runs as its reference (float) "
        f"module. {_BN_ADVICE}"
    )


def requantize_overflow_reason(
    engine: str, reference: Any, x: TensorQParams, out: TensorQParams | None
) -> str | None:
    """Why ``engine``'s requantization of this layer could pass int32, or None.

    Only the positive side counts: a value below -2**31 steps also becomes the lowest
    int32, which clamps to the output's lowest integer, as the reference saturates it. The
    bound: each product at its largest over the input's integer range, in output steps,
    plus the bias and the output's zero point. Calibrated scales stay below 1e9 steps.

    Args:
        engine: ``"fbgemm"`` or ``"qnnpack"`` (both convert the scaled sum to int32).
        reference: the reference Linear / Conv / ConvTranspose (its int8 weight, qparams
            and bias).
        x: the input's qparams; ``out``: the output's (None: a float output, no conversion).

    Example:
        >>> from fxquant.nn import reference as ref
        >>> qparams = {"qscheme": torch.per_tensor_symmetric, "dtype": torch.int8,
        ...            "scale": 1e8, "zero_point": 0}
        >>> grown = torch.nn.Linear(2, 2)
        >>> _ = torch.nn.init.constant_(grown.weight, 5e9)  # 50 steps of 1e8
        >>> linear = ref.Linear.from_float(grown, qparams)
        >>> x = out = TensorQParams(0.01, 0, 0, 255)
        >>> requantize_overflow_reason("fbgemm", linear, x, out)[:33]
        "fbgemm's requantization of output"
    """
    if out is None:
        return None
    qparams = reference.get_weight_qparams()
    weight = reference.get_quantized_weight()
    weight = weight.int_repr() if weight.is_quantized else weight
    zero_point = torch.as_tensor(qparams["zero_point"], dtype=torch.float64).reshape(-1, 1)
    weights = _per_output_channel(reference, weight.to(torch.float64)) - zero_point
    # each product at its largest: the input's highest integer for a positive weight
    high, low = x.quant_max - x.zero_point, x.quant_min - x.zero_point
    largest = torch.where(weights > 0, weights * high, weights * low).sum(1)
    scale = torch.as_tensor(qparams["scale"], dtype=torch.float64).reshape(-1)
    steps = largest * x.scale * scale / out.scale + out.zero_point
    bias = getattr(reference, "bias", None)
    if isinstance(bias, torch.Tensor):
        steps = steps + bias.detach().to(torch.float64) / out.scale
    worst = int(steps.argmax())
    if float(steps[worst]) < _INT32_STEPS:
        return None
    multiplier = x.scale * float(scale[worst if scale.numel() > 1 else 0]) / out.scale
    return (
        f"{engine}'s requantization of output channel {worst} can reach "
        f"{float(steps[worst]):.3g} output steps ({multiplier:.3g} per accumulator unit: "
        f"input scale x weight scale / output scale), past int32: the kernel converts "
        "such a value to the lowest int32 and outputs 0 where the reference saturates. "
        f"The layer runs as its reference (float) module. {_BN_ADVICE}"
    )


def _per_output_channel(reference: Any, weight: torch.Tensor) -> torch.Tensor:
    """One row per output channel: the weights that feed it. A transposed conv's weight is
    ``(in, out / groups, *kernel)``; each output channel reads its group's inputs, every
    tap (an upper bound where the stride skips taps)."""
    if not isinstance(reference, torch.nn.modules.conv._ConvTransposeNd):
        return weight.flatten(1)
    groups = reference.groups
    grouped = weight.reshape(groups, weight.shape[0] // groups, weight.shape[1], -1)
    return grouped.permute(0, 2, 1, 3).reshape(groups * weight.shape[1], -1)


def depthwise_saturation_reason(reference: Any, weight: torch.Tensor, x: Any) -> str | None:
    """Why FBGEMM's depthwise kernel would saturate on this conv, or None.

    Its depthwise path (one input channel per group, a kernel of more than one tap;
    measured on torch 2.13's fbgemm) sums pairs of products in int16 on every CPU: exact
    while two of the largest input integer times the largest |weight| fit in 32767.

    Args:
        reference: the reference conv (its groups and weight shape).
        weight: its int8 weight, as plain integers.
        x: the input's qparams (``quant_max``: the largest integer a kernel stores).

    Example:
        >>> from fxquant.nn import reference as ref
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.01, "zero_point": 0}
        >>> conv = ref.Conv2d.from_float(torch.nn.Conv2d(8, 8, 3, groups=8), qparams)
        >>> x = TensorQParams(0.1, 0, 0, 255)
        >>> depthwise_saturation_reason(conv, torch.full((8, 1, 3, 3), 127), x)[:31]
        "FBGEMM's depthwise conv adds pa"
    """
    groups = int(getattr(reference, "groups", 1))
    taps = weight[0, 0].numel() if weight.dim() > 2 else 1
    if groups == 1 or weight.shape[1] != 1 or taps == 1:
        return None
    largest = int(weight.abs().max()) if weight.numel() else 0
    if 2 * int(x.quant_max) * largest <= _INT16_MAX:
        return None
    low, high = cpu.SEVEN_BIT_WEIGHT
    return (
        "FBGEMM's depthwise conv adds pairs of uint8 x int8 products in int16 with "
        "saturation on every CPU (VNNI too): exact while 2 x the largest input integer "
        f"({int(x.quant_max)}) x the largest |weight| ({largest}) <= {_INT16_MAX}. The conv runs "
        f"as its reference (float) module; quantize its weights to {low}..{high} "
        f"(quant_min={low}, quant_max={high}, as the fbgemm default mapping does) or its "
        "input to 0..127"
    )
