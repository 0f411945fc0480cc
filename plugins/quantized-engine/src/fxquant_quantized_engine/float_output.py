"""Int8 in, float out linear on the quint8 engines: what the reference model computes.

A transformer's Linear outputs feed the residual stream and LayerNorm; rounding them
to uint8 is most of what int8 costs a BERT. The patterns therefore say
int8 in, float out for linear, and the kernel must return exactly that: the int32
accumulator times the input and weight scales, plus the bias, in float32. Neither
engine's ``quantized::linear`` does (it returns quint8), but each has a kernel that
computes it exactly:

    fbgemm    ``quantized::linear_with_input_q_dq_qweight_dq_output_fp32(x, scale,
              zero_point, packed)``: quantizes the float input with the given qparams
              (to 0..255), multiplies in int8, returns float32
    qnnpack   ``quantized::linear_dynamic(x, packed)``: quantizes its float input with
              qparams chosen from the input's min and max, returns float32. Two rows
              appended to the input, the float values of the integers 0 and 255, make
              that range the static one, so it quantizes exactly as the reference does
              (possible for a 0..255 input range only; the rows cost one copy of the
              input, which the clamp to the range needs anyway)

Both take a float input: an integer input (a kernel chain) is dequantized first
(exact: the integers' float values quantize back to themselves). A narrower range
than 0..255 (fbgemm's 7-bit activations) is enforced by clamping the float input
to it first, which quantizes as the reference's clamped integers do. Where a
quantized op reads the output, the kernel takes that quantize step in (``absorb``)
and runs the uint8-output kernel instead, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fxquant_quantized_engine.views import TensorQParams, _run_on

__all__ = ["float_output_call", "float_output_reason"]

_FULL_RANGE = (0, 255)


def float_output_reason(engine: str, x: TensorQParams) -> str | None:
    """Why ``engine`` cannot run an int8-in, float-out linear on input ``x``, or None.

    Example:
        >>> float_output_reason("fbgemm", TensorQParams(0.1, 0, 0, 127)) is None
        True
        >>> float_output_reason("qnnpack", TensorQParams(0.1, 0, 0, 127))[:40]
        "QNNPACK's int8-in, float-out linear (its"
    """
    if engine == "fbgemm" or (x.quant_min, x.quant_max) == _FULL_RANGE:
        return None
    return (
        "QNNPACK's int8-in, float-out linear (its dynamic kernel, given the static range) "
        f"needs inputs in 0..255, not {x.quant_min}..{x.quant_max}"
    )


def _float_range(x: TensorQParams) -> tuple[float, float]:
    return x.scale * (x.quant_min - x.zero_point), x.scale * (x.quant_max - x.zero_point)


def float_output_call(
    engine: str, engine_id: int, packed: Any, x: TensorQParams, *, float_input: bool, relu: bool
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The forward of an int8-in, float-out linear (module docstring), everything bound.

    Args:
        engine: the engine's name (``"fbgemm"`` or ``"qnnpack"``).
        engine_id: its id (``engine._engine_id``).
        packed: the prepacked weight and bias.
        x: the input's qparams.
        float_input: the input is float (its quantize step absorbed), else uint8.
        relu: a fused relu after the bias.

    Example:
        >>> from fxquant_quantized_engine import EngineScope, weight_as_qint8
        >>> from fxquant_quantized_engine.engine import _engine_id
        >>> with EngineScope("qnnpack"):
        ...     w = weight_as_qint8(torch.tensor([[2, -1]], dtype=torch.int8),
        ...                         torch.tensor([0.5]), torch.tensor([0]))
        ...     packed = torch.ops.quantized.linear_prepack(w, None)
        >>> call = float_output_call("qnnpack", _engine_id("qnnpack"), packed,
        ...                          TensorQParams(0.1, 10), float_input=True, relu=False)
        >>> call(torch.tensor([[1.0, 0.5]])).tolist()  # (2 * 1.0 - 0.5) * 0.5
        [[0.75]]
    """
    low, high = _float_range(x)
    narrow = x.narrow

    def as_float(values: torch.Tensor) -> torch.Tensor:
        if float_input:
            return values.float()
        return x.dequantize(values)

    if engine == "fbgemm":
        name = "linear_with_input_q_dq_qweight_dq_relu_output_fp32" if relu else None
        op = getattr(
            torch.ops.quantized, name or "linear_with_input_q_dq_qweight_dq_output_fp32"
        ).default

        def fused(values: torch.Tensor) -> torch.Tensor:
            floats = as_float(values).detach()  # as in ranged: no gradient through int8
            if narrow and float_input:  # integers are within the range already
                floats = floats.clamp(low, high)
            if floats.dim() == 1:  # nn.Linear takes a vector; FBGEMM's op needs 2-d
                return op(floats[None], x.scale, x.zero_point, packed)[0]  # type: ignore[no-any-return]
            return op(floats, x.scale, x.zero_point, packed)  # type: ignore[no-any-return]

        return lambda values: _run_on(engine_id, fused, values)

    dynamic = getattr(
        torch.ops.quantized, "linear_relu_dynamic" if relu else "linear_dynamic"
    ).default

    def ranged(values: torch.Tensor) -> torch.Tensor:
        # detached: a float op's output that requires grad (an unquantized BatchNorm or
        # LayerNorm before it, called outside no_grad) failed clamp(out=) (the int8 kernel
        # has no gradient either)
        floats = as_float(values).detach()
        features = floats.shape[-1]
        flat = floats.reshape(-1, features)
        rows = flat.shape[0]
        padded = torch.empty(rows + 2, features)
        torch.clamp(flat, low, high, out=padded[:rows])
        padded[rows].fill_(low)  # the static range, so the dynamic qparams are the static ones
        padded[rows + 1].fill_(high)
        result = dynamic(padded, packed, False)[:rows]
        return result.reshape(*floats.shape[:-1], result.shape[-1])  # type: ignore[no-any-return]

    return lambda values: _run_on(engine_id, ranged, values)
