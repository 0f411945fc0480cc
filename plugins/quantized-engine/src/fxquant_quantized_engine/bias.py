"""QNNPACK's integer bias: where rounding it costs more than half an output step.

QNNPACK adds the bias in its int32 accumulator, rounded to the accumulator's step
``x_scale * weight_scale[c]``; the reference model adds it in float. The two agree within
one output step while that rounding, ``|b - round(b / a) * a|`` over the output scale, stays
within half a step (the requantization's own rounding is the other half). A channel whose
weight scale is huge makes ``a`` coarser than the output's step: after a few QAT steps on a
channel that saw no signal, a BN-folded MobileNetV2 conv had weight scales near 1e4 and its
bias vanished in the rounding (the lowered conv 160 steps from its reference). FBGEMM adds
a float bias: it has no such rounding.
"""

from __future__ import annotations

from typing import Any

import torch

from fxquant_quantized_engine.views import TensorQParams

__all__ = ["bias_rounding_reason"]

_HALF_STEP = 0.5


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
        "module. A weight scale this far above the output's is usually a channel whose "
        "BN-folded weights grew during QAT: train with a lower learning rate, or freeze the "
        "BatchNorm statistics earlier (freeze_bn_stats)"
    )
