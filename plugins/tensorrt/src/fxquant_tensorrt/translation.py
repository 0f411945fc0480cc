"""fxquant's quantize/dequantize ops as ONNX QuantizeLinear/DequantizeLinear (onnxscript).

The custom translation table ``export_onnx`` hands to ``torch.onnx.export``: one
ONNX Q or DQ per fxquant op, never a decomposition (pytorch/pytorch#127167)::

    fxquant.quantize_per_tensor(x, s, zp, qmin, qmax, int8) -> QuantizeLinear(x, s, int8(zp))
    fxquant.dequantize_per_channel(q, s, zp, axis, ...)
        -> DequantizeLinear(q, float32(s), int8(zp), axis=axis)

A range narrower than the dtype's adds a Clip after the QuantizeLinear (exact;
the placement check reports it). The ``.tensor`` overloads reshape their 0-d
qparams to ONNX scalars.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ONNX_OPSET", "translation_table"]

ONNX_OPSET = 18
"""The opset written: the dynamo exporter's lowest; TensorRT 10 parses it."""

_OPS = torch.ops.fxquant


def _onnx_type(dtype: Any) -> int:
    # the exporter passes ScalarType arguments as onnx_ir DataType members (TensorProto ints)
    return int(dtype)


def _range_clip(op: Any, q: Any, quant_min: int, quant_max: int, dtype: Any) -> Any:
    """``q`` clamped to ``quant_min..quant_max`` when that is narrower than the dtype's range."""
    import onnx

    onnx_type = _onnx_type(dtype)
    ranges = {int(onnx.TensorProto.INT8): (-128, 127), int(onnx.TensorProto.UINT8): (0, 255)}
    full = ranges.get(onnx_type)
    if full is None or (quant_min, quant_max) == full:
        return q
    low = op.Cast(op.Constant(value_int=quant_min), to=onnx_type)
    high = op.Cast(op.Constant(value_int=quant_max), to=onnx_type)
    return op.Clip(q, low, high)


def _zero_point(op: Any, zero_point: int, dtype: Any) -> Any:
    return op.Cast(op.Constant(value_int=zero_point), to=_onnx_type(dtype))


def _out(op: Any, value: Any, out_dtype: Any) -> Any:
    import onnx

    if out_dtype is None or _onnx_type(out_dtype) == onnx.TensorProto.FLOAT:
        return value
    return op.Cast(value, to=_onnx_type(out_dtype))


def _scalar(op: Any, tensor: Any, to: int) -> Any:
    # a 0-d or one-element tensor as an ONNX scalar of type ``to`` (the .tensor overloads)
    return op.Cast(op.Reshape(tensor, op.Constant(value_ints=[])), to=to)


def translation_table() -> dict[Callable[..., Any], Callable[..., Any]]:
    """fxquant's quantize/dequantize ops -> functions that emit ONNX Q/DQ (opset 18).

    Example:
        >>> torch.ops.fxquant.dequantize_per_channel.default in translation_table()
        True
    """
    import onnx
    from onnxscript import opset18

    # untyped on purpose: onnxscript's per-op type stubs reject the exporter's symbolic values
    op: Any = opset18
    float32 = onnx.TensorProto.FLOAT

    def quantize_per_tensor(  # the op's schema
        x: Any, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype: Any
    ) -> Any:
        q = op.QuantizeLinear(x, op.Constant(value_float=scale), _zero_point(op, zero_point, dtype))
        return _range_clip(op, q, quant_min, quant_max, dtype)

    def quantize_per_tensor_tensor(  # the op's schema
        x: Any, scale: Any, zero_point: Any, quant_min: int, quant_max: int, dtype: Any
    ) -> Any:
        zp = _scalar(op, zero_point, _onnx_type(dtype))
        q = op.QuantizeLinear(x, _scalar(op, scale, float32), zp)
        return _range_clip(op, q, quant_min, quant_max, dtype)

    def dequantize_per_tensor(  # noqa: PLR0913, PLR0917  # the op's schema
        q: Any,
        scale: float,
        zero_point: int,
        quant_min: int,
        quant_max: int,
        dtype: Any,
        out_dtype: Any = None,
    ) -> Any:
        del quant_min, quant_max  # the integers are already in range
        scale_value = op.Constant(value_float=scale)
        value = op.DequantizeLinear(q, scale_value, _zero_point(op, zero_point, dtype))
        return _out(op, value, out_dtype)

    def dequantize_per_tensor_tensor(  # noqa: PLR0913, PLR0917  # the op's schema
        q: Any,
        scale: Any,
        zero_point: Any,
        quant_min: int,
        quant_max: int,
        dtype: Any,
        out_dtype: Any = None,
    ) -> Any:
        del quant_min, quant_max
        zp = _scalar(op, zero_point, _onnx_type(dtype))
        return _out(op, op.DequantizeLinear(q, _scalar(op, scale, float32), zp), out_dtype)

    def quantize_per_channel(  # noqa: PLR0913, PLR0917  # the op's schema
        x: Any, scales: Any, zero_points: Any, axis: int, quant_min: int, quant_max: int, dtype: Any
    ) -> Any:
        # per-channel scales are float64 buffers in fxquant: ONNX wants the output's float32
        zp = op.Cast(zero_points, to=_onnx_type(dtype))
        q = op.QuantizeLinear(x, op.Cast(scales, to=float32), zp, axis=axis)
        return _range_clip(op, q, quant_min, quant_max, dtype)

    def dequantize_per_channel(  # noqa: PLR0913, PLR0917  # the op's schema
        q: Any,
        scales: Any,
        zero_points: Any,
        axis: int,
        quant_min: int,
        quant_max: int,
        dtype: Any,
        out_dtype: Any = None,
    ) -> Any:
        del quant_min, quant_max
        zp = op.Cast(zero_points, to=_onnx_type(dtype))
        value = op.DequantizeLinear(q, op.Cast(scales, to=float32), zp, axis=axis)
        return _out(op, value, out_dtype)

    return {
        _OPS.quantize_per_tensor.default: quantize_per_tensor,
        _OPS.quantize_per_tensor.tensor: quantize_per_tensor_tensor,
        _OPS.dequantize_per_tensor.default: dequantize_per_tensor,
        _OPS.dequantize_per_tensor.tensor: dequantize_per_tensor_tensor,
        _OPS.quantize_per_channel.default: quantize_per_channel,
        _OPS.dequantize_per_channel.default: dequantize_per_channel,
    }
