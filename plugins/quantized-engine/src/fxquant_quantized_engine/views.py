"""Zero-copy views between plain uint8 and quint8 tensors, and the kernels' bound calls."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxquant_quantized_engine.engine import (
    _QUINT8,
    _Quiet,
    acquire_engine,
    release_engine,
)


@functools.lru_cache(maxsize=4096)
def _quint8_template(scale: float, zero_point: int) -> torch.Tensor:
    """An empty quint8 tensor with these qparams: views alias it (1.3 us less than a new one).

    Created outside inference mode: an inference tensor could not be ``set_`` later
    outside it. Never mutated itself, so kernels may share it across threads.
    """
    with torch.inference_mode(False):
        return torch._empty_affine_quantized([0], scale=scale, zero_point=zero_point, dtype=_QUINT8)


_UINT8_TEMPLATE = torch.empty(0, dtype=torch.uint8)


def as_quint8(values: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """View a uint8 tensor as a quint8 tensor with ``scale`` and ``zero_point`` (no copy).

    Call inside an ``EngineScope`` (creating a quint8 tensor warns once).

    Example:
        >>> from fxquant_quantized_engine import EngineScope
        >>> with EngineScope("fbgemm"):
        ...     q = as_quint8(torch.tensor([0, 10], dtype=torch.uint8), 0.5, 10)
        ...     q.dequantize().tolist()
        [-5.0, 0.0]
    """
    view = _quint8_template(scale, zero_point).detach()  # a new alias; the template stays empty
    return view.set_(
        values.untyped_storage(), values.storage_offset(), values.size(), values.stride()
    )


def as_uint8(quantized: torch.Tensor) -> torch.Tensor:
    """View a quint8 tensor's integers as a uint8 tensor (no copy, unlike ``int_repr``).

    Example:
        >>> from fxquant_quantized_engine import EngineScope
        >>> with EngineScope("fbgemm"):
        ...     q = as_quint8(torch.tensor([5], dtype=torch.uint8), 0.5, 3)
        >>> as_uint8(q).tolist()
        [5]
    """
    return _UINT8_TEMPLATE.detach().set_(
        quantized.untyped_storage(),
        quantized.storage_offset(),
        quantized.size(),
        quantized.stride(),
    )


@dataclass(frozen=True, slots=True)
class TensorQParams:
    """Per-tensor qparams of a uint8 activation, with the integer range it may use.

    Example:
        >>> TensorQParams(0.1, 3, 0, 127).narrow
        True
    """

    scale: float
    zero_point: int
    quant_min: int = 0
    quant_max: int = 255

    @property
    def narrow(self) -> bool:
        """Whether the range is narrower than uint8 (the kernel output must be clamped)."""
        return self.quant_min > 0 or self.quant_max < 255

    def finish(self, quantized: torch.Tensor) -> torch.Tensor:
        """The integers of a kernel's quint8 result, clamped to this range."""
        values = as_uint8(quantized)
        if self.narrow:
            values.clamp_(self.quant_min, self.quant_max)
        return values

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """Float -> this range's integers (torch's vectorized quantize, then a view).

        Call inside an ``EngineScope`` (creating a quint8 tensor warns once). The result
        holds the quint8 tensor it views, which a kernel it feeds takes without a new view.

        Example:
            >>> from fxquant_quantized_engine import EngineScope
            >>> with EngineScope("fbgemm"):
            ...     TensorQParams(0.5, 3).quantize(torch.tensor([1.0, 200.0])).tolist()
            [5, 255]
        """
        quantized = torch.quantize_per_tensor(x, self.scale, self.zero_point, _QUINT8)
        return _uint8_output(quantized, self)

    def dequantize(self, values: torch.Tensor) -> torch.Tensor:
        """This range's integers -> float32 (torch's vectorized dequantize of a quint8 view).

        Call inside an ``EngineScope``, like :meth:`quantize`.

        Example:
            >>> from fxquant_quantized_engine import EngineScope
            >>> values = torch.tensor([5, 255], dtype=torch.uint8)
            >>> with EngineScope("fbgemm"):
            ...     TensorQParams(0.5, 3).dequantize(values).tolist()
            [1.0, 126.0]
        """
        template = _quint8_template(self.scale, self.zero_point)
        return _quint8_input(values, template, self.scale, self.zero_point).dequantize()


def weight_as_qint8(
    weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor
) -> torch.Tensor:
    """An int8 weight with per-tensor (one element) or per-channel (axis 0) qparams, as qint8.

    Example:
        >>> w = torch.tensor([[1, -2]], dtype=torch.int8)
        >>> from fxquant_quantized_engine import EngineScope
        >>> with EngineScope("fbgemm"):
        ...     weight_as_qint8(w, torch.tensor([0.5]), torch.tensor([0])).dequantize().tolist()
        [[0.5, -1.0]]
    """
    if scale.numel() == 1:
        return torch._make_per_tensor_quantized_tensor(weight, float(scale), int(zero_point))
    return torch._make_per_channel_quantized_tensor(weight, scale.double(), zero_point.long(), 0)


def _run_on(engine: int, op: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """``op(*args)`` holding the quantized engine ``engine`` (its id), see ``engine.py``.

    The kernels' hot path: a ``with EngineScope`` block costs more than the two calls.
    Kernels of one engine run concurrently; another engine's wait, so no thread's
    kernel runs on an engine another thread selected. Views need no engine and
    never warn, so only the op runs here; the deprecation filter is entered only when it
    can still fire (see :class:`_Quiet`).
    """
    acquire_engine(engine)
    try:
        if _Quiet.spent and not torch.is_warn_always_enabled():
            return op(*args)
        with _Quiet():
            return op(*args)
    finally:
        release_engine()


class _Held(weakref.ref):  # type: ignore[type-arg]  # a weak reference to a uint8 tensor
    """A kernel's uint8 output (weakly) and the quint8 result it views (strongly).

    A kernel fed directly by another takes that result instead of making a new view: a
    view made and dropped around a real-sized op costs 3-4 us (measured: MobileNetV2's
    14x14 depthwise conv, 1 thread), the lookup 0.2 us. Kept in :data:`_HOLDERS` by the
    output's ``id`` and dropped when the output dies: nothing is stored on the tensor, so
    its copies, pickles and ``torch.save`` never see a quint8 tensor.
    """

    __slots__ = ("key", "result", "scale", "zero_point")
    key: int
    result: torch.Tensor
    scale: float
    zero_point: int


_HOLDERS: dict[int, _Held] = {}


def _forget(ref: _Held) -> None:
    if _HOLDERS.get(ref.key) is ref:
        del _HOLDERS[ref.key]


def _hold(values: torch.Tensor, result: torch.Tensor, scale: float, zero_point: int) -> None:
    """Record that ``values`` views ``result`` (with these qparams) while it lives."""
    ref = _Held(values, _forget)
    ref.key, ref.result, ref.scale, ref.zero_point = id(values), result, scale, zero_point
    _HOLDERS[ref.key] = ref


def _held(values: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor | None:
    """The quint8 result ``values`` views with these qparams, when it is a kernel output
    whose memory, shape and strides are still the result's (an in-place resize breaks it)."""
    ref = _HOLDERS.get(id(values))
    if ref is None or ref() is not values or (ref.scale, ref.zero_point) != (scale, zero_point):
        return None
    result: torch.Tensor = ref.result
    return result if _views(values, result) else None


def _quint8_input(
    values: torch.Tensor, template: torch.Tensor, scale: float, zero_point: int
) -> torch.Tensor:
    """``values`` as quint8 with these qparams: the result it views when it is one, else a view.

    The held result is taken only when it still has the memory, shape, strides and qparams
    of ``values`` (an in-place resize or a deepcopy of ``values`` breaks the match). Only
    kernels whose op never modifies its input take it.
    """
    held = _held(values, scale, zero_point)
    if held is not None:
        return held
    return template.detach().set_(  # as_quint8 with its template looked up once
        values.untyped_storage(), values.storage_offset(), values.size(), values.stride()
    )


def _views(values: torch.Tensor, quantized: torch.Tensor) -> bool:
    """Whether ``values`` has exactly ``quantized``'s memory, shape and strides."""
    return (
        quantized.data_ptr() == values.data_ptr()
        and quantized.shape == values.shape
        and quantized.stride() == values.stride()
    )


def _uint8_output(result: torch.Tensor, out: TensorQParams) -> torch.Tensor:
    """A kernel's quint8 result as uint8 integers in ``out``'s range, holding the result."""
    values = out.finish(result)
    _hold(values, result, out.scale, out.zero_point)
    return values


def _result(result: torch.Tensor, out: TensorQParams, float_output: bool) -> torch.Tensor:
    """A kernel's quint8 result as its output: uint8 integers, or floats after a dequantize."""
    if not float_output:
        return _uint8_output(result, out)
    if out.narrow:
        out.finish(result)  # clamps the integers the result shares
    return result.dequantize()


def _clamped(out: TensorQParams, clamp: tuple[int, int] | None) -> TensorQParams:
    """``out`` with its integer range narrowed to an absorbed clamp."""
    if clamp is None:
        return out
    low, high = max(out.quant_min, clamp[0]), min(out.quant_max, clamp[1])
    return TensorQParams(out.scale, out.zero_point, low, high)


def _unary_call(
    engine: int,
    op: Callable[..., torch.Tensor],
    packed: Any,
    qparams: tuple[TensorQParams, TensorQParams],
    boundaries: tuple[bool, bool] = (False, False),
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The forward of a prepacked kernel ``op(qx, packed, scale, zero_point)``, everything bound.

    The hottest path of the quint8 engines (53 convs in MobileNetV2), so the helpers
    :func:`_held`, :func:`_run_on` and :func:`_hold` are written out: their calls cost
    1.5 us per conv inside a forward (measured, 1 thread).
    ``boundaries``: float input and output (a kernel's ``absorb_input`` and ``absorb``).
    """
    x, out = qparams
    if any(boundaries):
        return _boundary_call(engine, op, packed, qparams, boundaries)
    template, x_scale, x_zero_point = _quint8_template(x.scale, x.zero_point), x.scale, x.zero_point
    scale, zero_point, narrow, low, high = (
        out.scale, out.zero_point, out.narrow, out.quant_min, out.quant_max
    )  # fmt: skip

    def call(values: torch.Tensor) -> torch.Tensor:
        held = _HOLDERS.get(id(values))  # _held, written out
        if (
            held is not None
            and held() is values
            and held.scale == x_scale
            and held.zero_point == x_zero_point
            and (quantized := held.result).data_ptr() == values.data_ptr()
            and quantized.shape == values.shape
            and quantized.stride() == values.stride()
        ):
            pass
        else:
            quantized = template.detach().set_(
                values.untyped_storage(), values.storage_offset(), values.size(), values.stride()
            )
        acquire_engine(engine)  # see engine.py: one engine at a time
        try:
            if _Quiet.spent and not torch.is_warn_always_enabled():
                result = op(quantized, packed, scale, zero_point)
            else:
                with _Quiet():
                    result = op(quantized, packed, scale, zero_point)
        finally:
            release_engine()
        integers = _UINT8_TEMPLATE.detach().set_(
            result.untyped_storage(), result.storage_offset(), result.size(), result.stride()
        )
        if narrow:
            integers.clamp_(low, high)
        held = _Held(integers, _forget)  # _hold, written out
        held.key, held.result, held.scale, held.zero_point = id(integers), result, scale, zero_point
        _HOLDERS[held.key] = held
        return integers

    return call


def _boundary_call(
    engine: int,
    op: Callable[..., torch.Tensor],
    packed: Any,
    qparams: tuple[TensorQParams, TensorQParams],
    boundaries: tuple[bool, bool],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """:func:`_unary_call` taking a float input and/or giving a float output.

    The input is quantized by torch's vectorized kernel straight to quint8 (float32
    arithmetic: within one step of the float64 boundary, bit-equal on most inputs) and
    the output dequantized from the quint8 result: no uint8 view on that side.
    """
    x, out = qparams
    float_input, float_output = boundaries
    template = _quint8_template(x.scale, x.zero_point)

    def call(values: torch.Tensor) -> torch.Tensor:
        acquire_engine(engine)  # see engine.py: one engine at a time
        try:
            with _Quiet():  # quantize_per_tensor creates a quint8 tensor too
                if not float_input:
                    quantized = _quint8_input(values, template, x.scale, x.zero_point)
                elif x.narrow:  # clamped to the range on the uint8 view it holds
                    quantized = _quint8_input(x.quantize(values), template, x.scale, x.zero_point)
                else:
                    quantized = torch.quantize_per_tensor(
                        values.float(), x.scale, x.zero_point, _QUINT8
                    )  # float(): the reference quantizes float16/float64 as float32 too
                result = op(quantized, packed, out.scale, out.zero_point)
        finally:
            release_engine()
        return _result(result, out, float_output)

    return call


def _tensor_qparams(qparams: Any) -> TensorQParams | None:
    """A LoweringMatch QParams as TensorQParams, or None when not static per-tensor uint8."""
    if qparams is None or qparams.is_dynamic or qparams.is_per_channel:
        return None
    if qparams.dtype != torch.uint8:
        return None
    return TensorQParams(
        float(qparams.scale),
        int(qparams.zero_point),
        int(qparams.quant_min),
        int(qparams.quant_max),
    )
