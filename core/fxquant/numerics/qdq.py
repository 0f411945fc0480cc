"""Quantize/dequantize on plain integer tensors: the kernels of ``torch.ops.fxquant.*``.

The reference model (``convert_to_reference_fx``) spells quantization with
these ops instead of ``torch.quint8`` tensors, so it keeps working once torch
drops its quantized dtypes and survives ``torch.export`` as opaque, pattern
matchable nodes::

    x (float32) -> fxquant.quantize_per_tensor -> q (uint8)
      -> fxquant.dequantize_per_tensor -> float32

Numerics are bit-identical to ``torch.quantize_per_tensor(...).int_repr()``
and ``.dequantize()`` (measured on torch 2.13, x86):

- per tensor, 8 bit: ``round(x * inv_scale + zp)`` with one float32 rounding of
  the fused multiply-add (FBGEMM's path); int32: float32 multiply, then add;
- per channel: float32 ``round(x * inv_scale + zp)`` (two roundings);
- ``inv_scale = 1.0f / float32(scale)``; dequantize per tensor in float32,
  per channel in float64 (torch keeps per-channel scales as doubles).

Each op has an overload taking ``scale``/``zero_point`` as Python numbers and a
``.tensor`` overload taking 0-d (or one-element) tensors, for graphs.

Per token (dynamic activations of XNNPACK's fully-connected kernels): one
asymmetric scale and zero point per row over the last dimension, chosen at run time
(``choose_qparams_per_token_asymmetric``: the row's range widened to cover 0, divided
by the 255 steps, floored at float32 eps; the zero point from the end whose rounding
error is smaller, clamped and rounded); quantize as XNNPACK does, in float32
(``round(x * float32(1 / scale) + zp)``, ties to even); dequantize in float64. The ops'
schemas (and the sets of them the flow and plugins test nodes against) are
declared in ``fxquant.lowering``; this module registers their kernels, one per op for every
device: on meta tensors (FakeTensor, ``torch.export``) the same code gives the shapes, and the
kernels that read a value (a tensor qparam, a tensor's range) skip the read there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fxquant import lowering as _lowering  # noqa: F401  # declares the ops given kernels here
from fxquant.dtypes import canonical_dtype, quant_range
from fxquant.dtypes import float32_value as _f32
from fxquant.errors import ConfigError, ConfigTypeError

__all__ = [
    "choose_qparams_per_tensor",
    "choose_qparams_per_token_asymmetric",
    "dequantize_per_channel",
    "dequantize_per_tensor",
    "dequantize_per_token",
    "qparams_for_range",
    "quantize_per_channel",
    "quantize_per_tensor",
    "quantize_per_token",
]

_FLOAT32_EPS = float(torch.finfo(torch.float32).eps)
_FBGEMM_SMALL_SCALE = _f32(6.1e-5)


def _check_range(quant_min: int, quant_max: int, dtype: torch.dtype) -> torch.dtype:
    plain = canonical_dtype(dtype)
    low, high = quant_range(plain)
    if not low <= quant_min < quant_max <= high:
        msg = (
            f"quant_min={quant_min!r}, quant_max={quant_max!r} do not fit dtype {dtype!r}; "
            f"expected {low} <= quant_min < quant_max <= {high}"
        )
        raise ConfigError(msg)
    return plain


def _float_input(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        msg = f"quantize expects a floating point input, got a tensor of dtype {x.dtype}"
        raise ConfigTypeError(msg)
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def _scalar(value: torch.Tensor, name: str) -> torch.Tensor:
    if value.numel() != 1:
        msg = f"{name} must hold one value for per-tensor ops, got shape {tuple(value.shape)}"
        raise ConfigError(msg)
    return value


# --- kernels (CompositeExplicitAutograd) -----------------------------------------------


def _quantize_per_tensor_impl(
    x: torch.Tensor,
    scale: float,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    plain = _check_range(quant_min, quant_max, dtype)
    x = _float_input(x)
    inv_scale = _f32(1.0 / _f32(scale))
    if plain == torch.int32:
        # torch's int32 path: float32 multiply, float32 add, then round, as per channel
        return _round_to_grid(x, inv_scale, zero_point, quant_min, quant_max, plain)
    # FBGEMM fuses x * inv_scale + zp (one rounding); float64 holds the
    # product exactly, so one cast to float32 rounds the same way.
    y = x.to(torch.float64).mul_(inv_scale).add_(zero_point).to(torch.float32).round_()
    return y.clamp_(quant_min, quant_max).to(plain)


def _with_tensor_qparams(kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The ``.tensor`` overload of a per-tensor kernel: one-element scale and zero point."""

    def run(
        x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        scale, zero_point = _scalar(scale, "scale"), _scalar(zero_point, "zero_point")
        if scale.is_meta or zero_point.is_meta:  # shapes only (FakeTensor): no value to read
            return kernel(x, 1.0, 0, *args, **kwargs)
        return kernel(x, float(scale.item()), int(zero_point.item()), *args, **kwargs)

    return run


def _dequantize_per_tensor_impl(  # noqa: PLR0913  # the op's schema
    q: torch.Tensor,
    scale: float,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    plain = _check_range(quant_min, quant_max, dtype)
    if plain == torch.int32:
        # int32 - zero_point may not fit float32 exactly: subtract as integers first
        y = (q.to(torch.int64) - zero_point).to(torch.float32).mul_(_f32(scale))
    else:
        # 8-bit integers and their differences are exact in float32: one pass fewer (4x faster)
        y = q.to(torch.float32).sub_(zero_point).mul_(_f32(scale))
    return y if out_dtype in (None, torch.float32) else y.to(out_dtype)


def _channel_view(values: torch.Tensor, x: torch.Tensor, axis: int, name: str) -> torch.Tensor:
    """Reshape per-channel ``values`` so they broadcast along ``axis`` of ``x``."""
    axis = axis % x.dim() if x.dim() else 0
    if values.dim() != 1 or (x.dim() and values.numel() != x.shape[axis]):
        msg = (
            f"{name} must be 1-d with one value per channel of axis {axis} "
            f"(size {x.shape[axis] if x.dim() else 0}), got shape {tuple(values.shape)}"
        )
        raise ConfigError(msg)
    shape = [1] * x.dim()
    shape[axis] = -1
    return values.reshape(shape)


def _zero_point_view(zero_points: torch.Tensor, x: torch.Tensor, axis: int) -> torch.Tensor:
    view = _channel_view(zero_points, x, axis, "zero_points")
    return view.to(torch.float32) if view.is_floating_point() else view.to(torch.int64)


def _quantize_per_channel_impl(  # noqa: PLR0913, PLR0917  # the op's schema
    x: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    plain = _check_range(quant_min, quant_max, dtype)
    x = _float_input(x)
    inv_scales = 1.0 / _channel_view(scales, x, axis, "scales").to(torch.float32)
    zps = _zero_point_view(zero_points, x, axis)
    return _round_to_grid(x, inv_scales, zps, quant_min, quant_max, plain)


def _round_to_grid(
    x: torch.Tensor,
    inv_scales: torch.Tensor | float,
    zps: torch.Tensor | int,
    quant_min: int,
    quant_max: int,
    plain: torch.dtype,
) -> torch.Tensor:
    """``clamp(round(x * inv_scales + zps))`` in float32, ties to even: the per-channel and
    per-token quantize ops (their scales already broadcast against ``x``), and the per-tensor
    one to int32."""
    y = x * inv_scales
    y.add_(zps).round_()
    if plain == torch.int32:  # int32 bounds are not float32 numbers: clamp in float64
        return y.to(torch.float64).clamp_(quant_min, quant_max).to(plain)
    # integers up to 2**16 and the rounded values are exact in float32: one buffer, no float64
    # copy (convert_fx quantizes every weight: ResNet-50's 25M)
    return y.clamp_(quant_min, quant_max).to(plain)


def _dequantize_per_channel_impl(  # noqa: PLR0913, PLR0917  # the op's schema
    q: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    _check_range(quant_min, quant_max, dtype)
    zps = _zero_point_view(zero_points, q, axis)
    scales = _channel_view(scales, q, axis, "scales")
    if zps.is_floating_point():
        # float zero points (per_channel_affine_float_qparams): torch stays in float32
        y = (q.to(torch.float32) - zps) * scales.to(torch.float32)
    else:
        y = (q.to(torch.int64) - zps).to(torch.float64) * scales.to(torch.float64)
    return y.to(out_dtype or torch.float32)


def _choose_qparams_per_tensor_impl(
    x: torch.Tensor, quant_min: int, quant_max: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_range(quant_min, quant_max, dtype)
    x = _float_input(x).detach()
    low, high = 0.0, 0.0  # no values: an empty tensor, or shapes only (FakeTensor)
    if not x.is_meta and x.numel() > 0:
        # amin + amax: 0.6x the time of torch 2.13's aminmax on CPU, the same exact values
        low, high = float(x.amin()), float(x.amax())
    scale, zero_point = qparams_for_range(low, high, quant_min, quant_max)
    return (
        torch.tensor(scale, dtype=torch.float64, device=x.device),
        torch.tensor(zero_point, dtype=torch.int64, device=x.device),
    )


def qparams_for_range(low: float, high: float, quant_min: int, quant_max: int) -> tuple[float, int]:
    """Dynamic quantization's ``(scale, zero_point)`` for a tensor whose range is ``[low, high]``.

    FBGEMM's ChooseQuantizationParams, as :func:`choose_qparams_per_tensor`
    computes it from the min and max of a tensor: the range always covers 0;
    the scale stays a double. For kernels that already have the range (a
    dynamic linear computes it once per call) and want the qparams as Python
    numbers, with no tensor made.

    Example:
        >>> qparams_for_range(-1.0, 3.0, 0, 255)
        (0.01568627450980392, 64)
    """
    low, high = min(low, 0.0), max(high, 0.0)
    steps = quant_max - quant_min
    scale = (high - low) / steps
    if _f32(scale) == 0.0 or _f32(1.0 / _f32(scale)) == float("inf"):
        scale = 0.1  # a reciprocal of inf would poison the kernels that precompute it
    if scale < _FBGEMM_SMALL_SCALE:
        # FBGEMM floors the scale and stretches min/max (float32 math) to match it
        amplifier = _f32(_FBGEMM_SMALL_SCALE / _f32(scale))
        scale = _FBGEMM_SMALL_SCALE
        if low == 0.0:
            high = _f32(_FBGEMM_SMALL_SCALE * steps)
        elif high == 0.0:
            low = _f32(-_FBGEMM_SMALL_SCALE * steps)
        else:
            low, high = _f32(low * amplifier), _f32(high * amplifier)
    # use the end whose terms are smaller: its rounding error is smaller
    from_min_error = abs(quant_min) - abs(low / scale)
    from_max_error = abs(quant_max) - abs(high / scale)
    if from_min_error < from_max_error:
        initial = quant_min - low / scale
    else:
        initial = quant_max - high / scale
    zero_point = min(max(initial, quant_min), quant_max)
    return scale, round(zero_point)


def _as_tokens(
    x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` as a matrix with one row per token (over its last dimension), and its per-token
    qparams flat: the per-token ops are the per-channel ones along axis 0 of that matrix."""
    rows = (*x.shape[:-1], 1)
    for values, name in ((scales, "scales"), (zero_points, "zero_points")):
        if x.dim() == 0 or values.numel() != math.prod(rows):
            msg = (
                f"{name} must hold one value per token (row over the last dimension) of an "
                f"input of shape {tuple(x.shape)}, i.e. shape {rows}; got shape "
                f"{tuple(values.shape)}"
            )
            raise ConfigError(msg)
    tokens = x.reshape(math.prod(rows), x.shape[-1])
    return tokens, scales.reshape(-1), zero_points.reshape(-1)


def _choose_qparams_per_token_asymmetric_impl(
    x: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    quant_min, quant_max = quant_range(canonical_dtype(dtype))
    x = _float_input(x).detach()
    if x.dim() == 0:
        msg = "choose_qparams_per_token_asymmetric needs an input with a token dimension, got 0-d"
        raise ConfigError(msg)
    rows = (*x.shape[:-1], 1)
    if x.shape[-1] == 0:
        return (
            torch.ones(rows, dtype=torch.float64, device=x.device),
            torch.zeros(rows, dtype=torch.int64, device=x.device),
        )
    # float32 throughout, as XNNPACK computes each row's qparams
    low = x.amin(-1, keepdim=True).clamp_(max=0.0)
    high = x.amax(-1, keepdim=True).clamp_(min=0.0)
    scale = ((high - low) / float(quant_max - quant_min)).clamp_(min=_FLOAT32_EPS)
    low_steps, high_steps = low / scale, high / scale
    # the end whose terms are smaller rounds with the smaller error
    use_low = (quant_min + low_steps) + (quant_max + high_steps) > 0
    zero_point = torch.where(use_low, quant_min - low_steps, quant_max - high_steps)
    zero_point = zero_point.clamp_(quant_min, quant_max).round_()
    return scale.to(torch.float64), zero_point.to(torch.int64)


def _quantize_per_token_impl(  # the op's schema
    x: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    tokens, scales, zero_points = _as_tokens(x, scales, zero_points)
    q = _quantize_per_channel_impl(tokens, scales, zero_points, 0, quant_min, quant_max, dtype)
    return q.reshape(x.shape)


def _dequantize_per_token_impl(  # noqa: PLR0913, PLR0917  # the op's schema
    q: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    output_dtype: torch.dtype,
) -> torch.Tensor:
    tokens, scales, zero_points = _as_tokens(q, scales, zero_points)
    # integer zero points, as quantized_decomposed's (a float one is truncated)
    zero_points = zero_points.to(torch.int64)
    y = _dequantize_per_channel_impl(
        tokens, scales, zero_points, 0, quant_min, quant_max, dtype, out_dtype=output_dtype
    )
    return y.reshape(q.shape)


def _register() -> torch.library.Library:
    # the schemas are declared by fxquant.lowering (imported above); this library adds kernels
    lib = torch.library.Library("fxquant", "IMPL")  # type: ignore[no-untyped-call]  # untyped
    kernels = {
        "quantize_per_tensor": _quantize_per_tensor_impl,
        "quantize_per_tensor.tensor": _with_tensor_qparams(_quantize_per_tensor_impl),
        "dequantize_per_tensor": _dequantize_per_tensor_impl,
        "dequantize_per_tensor.tensor": _with_tensor_qparams(_dequantize_per_tensor_impl),
        "quantize_per_channel": _quantize_per_channel_impl,
        "dequantize_per_channel": _dequantize_per_channel_impl,
        "choose_qparams_per_tensor": _choose_qparams_per_tensor_impl,
        "choose_qparams_per_token_asymmetric": _choose_qparams_per_token_asymmetric_impl,
        "quantize_per_token": _quantize_per_token_impl,
        "dequantize_per_token": _dequantize_per_token_impl,
    }
    for name, kernel in kernels.items():
        lib.impl(name, kernel, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]  # untyped
    return lib


_LIB = _register()


# --- public Python wrappers ------------------------------------------------------------


def _run(op: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``op(*args, **kwargs)``, typed: ``torch.ops`` overloads are untyped."""
    result: torch.Tensor = op(*args, **kwargs)
    return result


def _as_tensor(value: float | torch.Tensor) -> torch.Tensor:
    # a tensor passes through untouched: as_tensor would add a copy node to exported graphs
    return value if isinstance(value, torch.Tensor) else torch.tensor(value)


def _per_tensor(
    op: Any,
    x: torch.Tensor,
    scale: float | torch.Tensor,
    zero_point: int | torch.Tensor,
    *rest: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """Run a per-tensor op: its ``.tensor`` overload when a qparam is a tensor (a graph's
    values), its default one for Python numbers."""
    if isinstance(scale, torch.Tensor) or isinstance(zero_point, torch.Tensor):
        return _run(op.tensor, x, _as_tensor(scale), _as_tensor(zero_point), *rest, **kwargs)
    return _run(op.default, x, float(scale), int(zero_point), *rest, **kwargs)


def quantize_per_tensor(
    x: torch.Tensor,
    scale: float | torch.Tensor,
    zero_point: int | torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Quantize ``x`` to a plain integer tensor with one scale and zero point.

    Args:
        x: float tensor (float16/bfloat16/float64 are converted to float32 first).
        scale: a float, or a one-element tensor (then the ``.tensor`` overload runs).
        zero_point: an int, or a one-element tensor.
        quant_min: smallest integer kept.
        quant_max: largest integer kept.
        dtype: ``torch.uint8``/``int8``/``int32`` (``torch.quint8`` etc. mean the same).

    Returns:
        ``clamp(round(x / scale + zero_point), quant_min, quant_max)`` as ``dtype``,
        bit-identical to ``torch.quantize_per_tensor(...).int_repr()``.

    Raises:
        ConfigError: when ``[quant_min, quant_max]`` does not fit ``dtype``.

    Example:
        >>> quantize_per_tensor(torch.tensor([0.0, 0.5, 9.0]), 0.1, 3, 0, 255, torch.uint8)
        tensor([ 3,  8, 93], dtype=torch.uint8)
    """
    op = torch.ops.fxquant.quantize_per_tensor
    return _per_tensor(op, x, scale, zero_point, quant_min, quant_max, canonical_dtype(dtype))


def dequantize_per_tensor(  # noqa: PLR0913  # the op's schema
    q: torch.Tensor,
    scale: float | torch.Tensor,
    zero_point: int | torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Map integers back to floats: ``(q - zero_point) * scale``, computed in float32.

    Args:
        q: integer tensor produced by :func:`quantize_per_tensor`.
        scale: a float, or a one-element tensor.
        zero_point: an int, or a one-element tensor.
        quant_min: smallest integer of the quantized range (checked against ``dtype``).
        quant_max: largest integer of the quantized range.
        dtype: the integer dtype ``q`` was quantized to.
        out_dtype: float dtype of the result.

    Returns:
        A float tensor equal to torch's ``dequantize()`` of the same quantized tensor.

    Example:
        >>> q = torch.tensor([3, 8, 93], dtype=torch.uint8)
        >>> dequantize_per_tensor(q, 0.1, 3, 0, 255, torch.uint8)
        tensor([0.0000, 0.5000, 9.0000])
    """
    op, plain = torch.ops.fxquant.dequantize_per_tensor, canonical_dtype(dtype)
    return _per_tensor(op, q, scale, zero_point, quant_min, quant_max, plain, out_dtype=out_dtype)


def quantize_per_channel(  # noqa: PLR0913, PLR0917  # the op's schema: one argument per qparam
    x: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Quantize ``x`` with one scale and zero point per slice along ``axis``.

    Bit-identical to ``torch.quantize_per_channel(...).int_repr()``, also with
    float zero points (``per_channel_affine_float_qparams``, embeddings).

    Example:
        >>> x = torch.tensor([[1.0, -1.0], [2.0, 4.0]])
        >>> quantize_per_channel(
        ...     x, torch.tensor([0.1, 0.5]), torch.tensor([0, 0]), 0, -128, 127, torch.int8
        ... )
        tensor([[ 10, -10],
                [  4,   8]], dtype=torch.int8)
    """
    op = torch.ops.fxquant.quantize_per_channel.default
    return _run(op, x, scales, zero_points, axis, quant_min, quant_max, canonical_dtype(dtype))


def dequantize_per_channel(  # noqa: PLR0913, PLR0917  # the op's schema: one argument per qparam
    q: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Map per-channel integers back to floats: ``(q - zero_points) * scales`` along ``axis``.

    Example:
        >>> q = torch.tensor([[10, -10], [4, 8]], dtype=torch.int8)
        >>> dequantize_per_channel(
        ...     q, torch.tensor([0.1, 0.5]), torch.tensor([0, 0]), 0, -128, 127, torch.int8
        ... )
        tensor([[ 1., -1.],
                [ 2.,  4.]])
    """
    op, plain = torch.ops.fxquant.dequantize_per_channel.default, canonical_dtype(dtype)
    return _run(op, q, scales, zero_points, axis, quant_min, quant_max, plain, out_dtype=out_dtype)


def choose_qparams_per_tensor(
    x: torch.Tensor, quant_min: int, quant_max: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point for dynamic quantization of ``x``, chosen as torch's kernels do.

    Matches ``torch.quantize_per_tensor_dynamic`` (FBGEMM's choice): the range
    is widened to cover 0, the scale is a float64 ``(max - min) / (qmax - qmin)``
    floored at ``6.1e-5``, and the zero point is rounded and clamped. For
    ``reduce_range=True`` semantics pass the halved range (``0, 127``).

    Returns:
        ``(scale, zero_point)`` as 0-d float64 and int64 tensors.

    Example:
        >>> scale, zero_point = choose_qparams_per_tensor(
        ...     torch.tensor([-1.0, 3.0]), 0, 255, torch.uint8
        ... )
        >>> round(float(scale), 6), int(zero_point)
        (0.015686, 64)
    """
    # qparams are not differentiable: detached, the op's outputs do not require grad either
    scale, zero_point = torch.ops.fxquant.choose_qparams_per_tensor.default(
        x.detach(), quant_min, quant_max, canonical_dtype(dtype)
    )
    return scale, zero_point


def choose_qparams_per_token_asymmetric(
    x: torch.Tensor, dtype: torch.dtype = torch.int8
) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric scale and zero point of each token (row over the last dimension) of ``x``.

    Dynamic per-token quantization's first step, as XNNPACK's dynamic
    fully-connected kernels choose them for their int8 input: each row's range
    widened to cover 0, ``scale = (max - min) / (quant_max - quant_min)`` in
    float32 (at least float32 eps), the zero point rounded and clamped to the
    dtype's full range. ``torch.ops.fxquant.choose_qparams_per_token_asymmetric``
    has ``quantized_decomposed``'s schema.

    Args:
        x: float tensor with at least one dimension.
        dtype: the integer dtype (``torch.int8``), whose full range is used.

    Returns:
        ``(scales, zero_points)`` of shape ``x.shape[:-1] + (1,)``, float64 and int64.

    Example:
        >>> scales, zero_points = choose_qparams_per_token_asymmetric(
        ...     torch.tensor([[-1.0, 3.0], [0.0, 2.55]])
        ... )
        >>> [round(float(s), 5) for s in scales.flatten()], zero_points.flatten().tolist()
        ([0.01569, 0.01], [-64, -128])
    """
    scales, zero_points = torch.ops.fxquant.choose_qparams_per_token_asymmetric.default(
        x.detach(), canonical_dtype(dtype)
    )
    return scales, zero_points


def quantize_per_token(  # the op's schema: one argument per qparam
    x: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Quantize each token (row over the last dimension) of ``x`` with its own qparams.

    ``clamp(round(x * float32(1 / scale) + zero_point), quant_min, quant_max)``
    in float32, ties to even, as XNNPACK quantizes a dynamic fully-connected input.

    Example:
        >>> x = torch.tensor([[-1.0, 3.0], [0.0, 2.55]])
        >>> quantize_per_token(x, *choose_qparams_per_token_asymmetric(x), -128, 127, torch.int8)
        tensor([[-128,  127],
                [-128,  127]], dtype=torch.int8)
    """
    op = torch.ops.fxquant.quantize_per_token.default
    return _run(op, x, scales, zero_points, quant_min, quant_max, canonical_dtype(dtype))


def dequantize_per_token(  # noqa: PLR0913, PLR0917  # the op's schema: one argument per qparam
    q: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    output_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Map per-token integers back to floats: ``(q - zero_point) * scale`` of each row.

    Example:
        >>> q = torch.tensor([[-128, 127]], dtype=torch.int8)
        >>> dequantize_per_token(
        ...     q, torch.tensor([[0.01]]), torch.tensor([[-128]]), -128, 127, torch.int8
        ... )
        tensor([[0.0000, 2.5500]])
    """
    op, plain = torch.ops.fxquant.dequantize_per_token.default, canonical_dtype(dtype)
    return _run(op, q, scales, zero_points, quant_min, quant_max, plain, output_dtype)
