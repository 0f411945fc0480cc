"""PyTorch's quint8-based int8 kernels (``torch.ops.quantized``) behind plain-integer modules.

The fbgemm and qnnpack engines only have kernels that take ``torch.quint8``
tensors, which PyTorch 2.13 deprecates. The modules here keep those tensors
inside: the lowered graph carries plain ``torch.uint8`` tensors, and each
kernel views them as quint8 for the call, then views the result back::

    uint8 --view--> quint8 --torch.ops.quantized.linear (engine E)--> quint8 --view--> uint8

Both views share storage (measured on a 131 kB activation, 1 thread: the view
costs 5-8 us, ``int_repr()`` 280 us and ``_make_per_tensor_quantized_tensor``
6-20 us, both copies), so a chain of kernels passes its activations without
a copy. Each call selects the module's engine and restores the previous one;
the deprecation warning torch raises (once per process) when a quint8 tensor
is created is filtered inside the kernel, by its exact message, so a lowered
model's forward never shows it. Prepacked weights are rebuilt from the integer
weight buffers after ``load_state_dict``, unpickling and ``copy.deepcopy``.

Per-call cost is what separates these kernels from torch.ao's modules (same ops),
so: each forward is a closure bound on first call (op, packed weight, qparams);
a kernel's uint8 output is remembered, weakly, with the quint8 result it views,
and a kernel it feeds takes that result instead of a new view; conv/linear/add
kernels ``absorb`` the relu/relu6 clamp and the dequantize that alone follow
them (clamped in place on their fresh result; ``r.dequantize()``), and
``absorb_input`` a float quantize that alone feeds them.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import nn

__all__ = [
    "DEPRECATION_MESSAGE",
    "ChannelQParams",
    "EngineScope",
    "IntegerClamp",
    "QuantizedBinary",
    "QuantizedCat",
    "QuantizedConv",
    "QuantizedConvTranspose",
    "QuantizedLinear",
    "QuantizedLinearDynamic",
    "QuantizedLinearFP16",
    "QuantizedOps",
    "QuantizedUnary",
    "Step",
    "TensorQParams",
    "as_quint8",
    "as_uint8",
    "weight_as_qint8",
]

# torch's deprecation warning for quint8/qint8 tensor creation (pytorch/pytorch#184982)
DEPRECATION_MESSAGE = r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized"

_QUINT8: torch.dtype = getattr(torch, "quint8")  # noqa: B009  # deprecated name, looked up once
_QINT8: torch.dtype = getattr(torch, "qint8")  # noqa: B009  # deprecated name, looked up once
_GET_ENGINE: Callable[[], int] = torch._C._get_qengine
_SET_ENGINE: Callable[[int], None] = torch._C._set_qengine


class _Quiet:
    """Filters torch's quantized-tensor deprecation warning (by its exact message).

    torch emits it with TORCH_WARN_ONCE (one call site, Quantizer.cpp): the first
    scope creates a quint8 tensor under the filter so the warning is spent there,
    and later scopes skip ``catch_warnings`` (2.4 us each) unless the user turned on
    ``torch.set_warn_always``, which makes it fire on every call.
    """

    spent = False

    def __enter__(self) -> None:
        self._catch: warnings.catch_warnings[None] | None = None
        if _Quiet.spent and not torch.is_warn_always_enabled():
            return
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("ignore", message=DEPRECATION_MESSAGE, category=UserWarning)
        if not _Quiet.spent:
            torch._empty_affine_quantized([0], scale=1.0, zero_point=0, dtype=_QUINT8)
            _Quiet.spent = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._catch is not None:
            self._catch.__exit__(kind, value, tb)


def _engine_id(name: str) -> int:
    previous = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = name
        return int(torch._C._get_qengine())
    finally:
        torch.backends.quantized.engine = previous


class EngineScope:
    """Selects a quantized engine for a block and restores the previous one.

    Also filters torch's quint8 deprecation warning inside the block.

    Example:
        >>> before = torch.backends.quantized.engine
        >>> with EngineScope("qnnpack"):
        ...     torch.backends.quantized.engine
        'qnnpack'
        >>> torch.backends.quantized.engine == before
        True
    """

    __slots__ = ("_id", "_previous", "_quiet", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._id = _engine_id(name)
        self._previous = self._id
        self._quiet = _Quiet()

    def __enter__(self) -> EngineScope:
        self._previous = int(torch._C._get_qengine())
        if self._previous != self._id:
            torch._C._set_qengine(self._id)
        self._quiet.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._quiet.__exit__(kind, value, tb)
        if self._previous != self._id:
            torch._C._set_qengine(self._previous)


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
            >>> with EngineScope("fbgemm"):
            ...     TensorQParams(0.5, 3).quantize(torch.tensor([1.0, 200.0])).tolist()
            [5, 255]
        """
        quantized = torch.quantize_per_tensor(x, self.scale, self.zero_point, _QUINT8)
        return _uint8_output(quantized, self)

    def dequantize(self, values: torch.Tensor) -> torch.Tensor:
        """This range's integers -> float32 (torch's vectorized dequantize of a quint8 view).

        Example:
            >>> TensorQParams(0.5, 3).dequantize(torch.tensor([5, 255], dtype=torch.uint8)).tolist()
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
        >>> with EngineScope("fbgemm"):
        ...     weight_as_qint8(w, torch.tensor([0.5]), torch.tensor([0])).dequantize().tolist()
        [[0.5, -1.0]]
    """
    if scale.numel() == 1:
        return torch._make_per_tensor_quantized_tensor(weight, float(scale), int(zero_point))
    return torch._make_per_channel_quantized_tensor(weight, scale.double(), zero_point.long(), 0)


def _run_on(engine: int, op: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    """``op(*args)`` with the quantized engine ``engine`` (its id) selected, then restored.

    The kernels' hot path: the switch costs 0.1 us where a ``with EngineScope`` block
    costs 1 us (measured, 1 thread). Views need no engine and never warn, so only the op
    runs here; the deprecation filter is entered only when it can still fire (see
    :class:`_Quiet`).
    """
    previous = _GET_ENGINE()
    if previous != engine:
        _SET_ENGINE(engine)
    try:
        if _Quiet.spent and not torch.is_warn_always_enabled():
            return op(*args)
        with _Quiet():
            return op(*args)
    finally:
        if previous != engine:
            _SET_ENGINE(previous)


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


def _absorb(kernel: Any, step: object) -> bool:
    """Epilogues of a uint8-output kernel (see ``LoweringRule``): a relu/relu6
    :class:`IntegerClamp` (clamped in place on the kernel's fresh result), then the
    dequantize step after it (the kernel returns floats)."""
    from fxquant.registry.hookspecs import Dequantize

    if kernel.float_output:
        return False
    if isinstance(step, IntegerClamp):
        low, high = step.low, 255 if step.high is None else step.high
        if kernel.clamp is not None:
            low, high = max(low, kernel.clamp[0]), min(high, kernel.clamp[1])
        kernel.clamp, kernel._call = (low, high), None
        return True
    if isinstance(step, Dequantize):
        q, out = _tensor_qparams(step.qparams), kernel.out
        if q is None or (q.scale, q.zero_point) != (out.scale, out.zero_point):
            return False
        kernel.float_output, kernel._call = True, None
        return True
    return False


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
    ``boundaries``: float input and output (:meth:`_Static.absorb_input`, ``absorb``).
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
        previous = _GET_ENGINE()
        if previous != engine:
            _SET_ENGINE(engine)
        try:
            if _Quiet.spent and not torch.is_warn_always_enabled():
                result = op(quantized, packed, scale, zero_point)
            else:
                with _Quiet():
                    result = op(quantized, packed, scale, zero_point)
        finally:
            if previous != engine:
                _SET_ENGINE(previous)
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
        previous = _GET_ENGINE()
        if previous != engine:
            _SET_ENGINE(engine)
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
            if previous != engine:
                _SET_ENGINE(previous)
        return _result(result, out, float_output)

    return call


class _Bound(nn.Module):
    """Base of the kernels whose forward is a closure over their op and qparams.

    :meth:`bind` builds it on the first call; it is never part of the state: pickling,
    ``copy.deepcopy`` and ``load_state_dict`` drop it, and the next call builds it again
    (from the buffers and the qparams as they are then).
    """

    def __init__(self, engine: str) -> None:
        super().__init__()
        self.engine = engine
        self._call: Callable[..., torch.Tensor] | None = None

    def bind(self) -> Callable[..., torch.Tensor]:
        """The forward with everything it needs bound."""
        raise NotImplementedError

    def forward(self, *values: torch.Tensor) -> torch.Tensor:
        call = self._call
        if call is None:
            call = self._call = self.bind()
        return call(*values)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_call"] = None
        return state

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._call = None


class _Packed(_Bound):
    """Base of the weighted kernels: integer weight buffers, prepacked lazily per engine.

    The prepacked object is never part of the state either: the next forward after
    ``load_state_dict``, unpickling or ``copy.deepcopy`` packs the buffers again.
    """

    def __init__(self, engine: str) -> None:
        super().__init__(engine)
        self._packed: Any = None

    def pack(self) -> Any:
        raise NotImplementedError

    def packed(self) -> Any:
        if self._packed is None:
            with EngineScope(self.engine):
                self._packed = self.pack()
        return self._packed

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_packed"] = None
        return state

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._packed = None


class _Weighted(_Packed):
    """Holds an int8 weight, its scales and zero points, and a float bias."""

    weight: torch.Tensor
    weight_scale: torch.Tensor
    weight_zero_point: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, engine: str, reference: Any) -> None:
        super().__init__(engine)
        qparams = reference.get_weight_qparams()
        weight = reference.get_quantized_weight().detach()
        self.register_buffer("weight", weight.clone())
        self.register_buffer("weight_scale", torch.as_tensor(qparams["scale"]).reshape(-1).double())
        zero_point = torch.as_tensor(qparams["zero_point"]).reshape(-1).long()
        self.register_buffer("weight_zero_point", zero_point)
        bias = getattr(reference, "bias", None)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def qweight(self) -> torch.Tensor:
        return weight_as_qint8(self.weight, self.weight_scale, self.weight_zero_point)


class _Static(_Weighted):
    """A static kernel ``op(qx, packed, out qparams)``: uint8 in and out, or float at a boundary."""

    x: TensorQParams
    out: TensorQParams

    def __init__(self, engine: str, reference: Any) -> None:
        super().__init__(engine, reference)
        self.float_input = self.float_output = False
        self.clamp: tuple[int, int] | None = None  # an absorbed relu/relu6, on the integers

    def absorb(self, step: object) -> bool:
        """Take over what alone follows this kernel: a relu/relu6 clamp of its integers
        (in place on its fresh result), then the dequantize step (it then returns floats).

        Example:
            >>> from fxquant.nn import reference
            >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
            ...            "scale": 0.1, "zero_point": 0}
            >>> ref = reference.Linear.from_float(nn.Linear(4, 2), qparams)
            >>> q = TensorQParams(0.1, 0)
            >>> kernel = QuantizedLinear("fbgemm", ref, q, q)
            >>> kernel.absorb(IntegerClamp(0, 60))
            True
        """
        return _absorb(self, step)

    def absorb_input(self, step: object) -> bool:
        """Take over the quantize step that alone feeds this kernel from float values.

        For the lowering, like :meth:`absorb` on the input side: ``True`` means the
        kernel now takes the float tensor and quantizes it itself, with torch's
        vectorized kernel straight to quint8 (float32 arithmetic: within one step of the
        reference; no uint8 tensor, no view: 40 us less than the float32 boundary step
        on the benchmark MLP's 32x512 input, measured, 1 thread). ``step`` is a
        ``Quantize`` with this kernel's input qparams.

        Example:
            >>> from fxquant.nn import reference
            >>> from fxquant.registry.hookspecs import Quantize, QParams
            >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
            ...            "scale": 0.1, "zero_point": 0}
            >>> ref = reference.Linear.from_float(nn.Linear(4, 2), qparams)
            >>> q = TensorQParams(0.1, 0)
            >>> kernel = QuantizedLinear("fbgemm", ref, q, q)
            >>> kernel.absorb_input(Quantize(QParams(torch.uint8, 0, 255, 0.1, 0)))
            True
            >>> kernel(torch.zeros(3, 4)).dtype
            torch.uint8
        """
        from fxquant.registry.hookspecs import Quantize

        if self.float_input or not isinstance(step, Quantize):
            return False
        if _tensor_qparams(step.qparams) != self.x:
            return False
        self.float_input, self._call = True, None
        return True

    def op(self) -> Callable[..., torch.Tensor]:
        raise NotImplementedError

    def bind(self) -> Callable[..., torch.Tensor]:
        boundaries = (self.float_input, self.float_output)
        qparams = (self.x, _clamped(self.out, self.clamp))
        return _unary_call(_engine_id(self.engine), self.op(), self.packed(), qparams, boundaries)


class QuantizedLinear(_Static):
    """Static int8 linear (optionally fused relu): uint8 in, uint8 out.

    Example:
        >>> from fxquant.nn import reference
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.1, "zero_point": 0}
        >>> ref = reference.Linear.from_float(nn.Linear(4, 2), qparams)
        >>> kernel = QuantizedLinear("fbgemm", ref, TensorQParams(0.1, 0), TensorQParams(0.2, 0))
        >>> kernel(torch.zeros(3, 4, dtype=torch.uint8)).dtype
        torch.uint8
    """

    def __init__(
        self,
        engine: str,
        reference: Any,
        x: TensorQParams,
        out: TensorQParams,
        relu: bool = False,
    ) -> None:
        super().__init__(engine, reference)
        self.x, self.out, self.relu = x, out, relu

    def pack(self) -> Any:
        return torch.ops.quantized.linear_prepack(self.qweight(), self.bias)

    def op(self) -> Callable[..., torch.Tensor]:
        return _quantized_op("linear_relu" if self.relu else "linear")


_CONV_PREPACK = {
    1: "conv1d_prepack",
    2: "conv2d_prepack",
    3: "conv3d_prepack",
}
_CONV_OPS = {  # (plain, with relu) per spatial rank
    1: ("conv1d", "conv1d_relu"),
    2: ("conv2d.new", "conv2d_relu.new"),
    3: ("conv3d.new", "conv3d_relu.new"),
}


def _quantized_op(name: str) -> Callable[..., torch.Tensor]:
    """``torch.ops.quantized.NAME`` as one overload (``.default`` unless named): a packet
    resolves its overload on every call (add has five)."""
    packet, _, overload = name.partition(".")
    op = getattr(torch.ops.quantized, packet)
    return getattr(op, overload or "default")  # type: ignore[no-any-return]  # torch.ops is untyped


class QuantizedConv(_Static):
    """Static int8 conv1d/2d/3d (optionally fused relu): uint8 in, uint8 out.

    Example:
        >>> from fxquant.nn import reference
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.1, "zero_point": 0}
        >>> ref = reference.Conv2d.from_float(nn.Conv2d(2, 2, 1), qparams)
        >>> kernel = QuantizedConv("fbgemm", ref, TensorQParams(0.1, 0), TensorQParams(0.2, 0))
        >>> kernel(torch.zeros(1, 2, 3, 3, dtype=torch.uint8)).shape
        torch.Size([1, 2, 3, 3])
    """

    def __init__(
        self,
        engine: str,
        reference: Any,
        x: TensorQParams,
        out: TensorQParams,
        relu: bool = False,
    ) -> None:
        super().__init__(engine, reference)
        self.dims = reference.weight.dim() - 2
        self.conv_args = (
            list(reference.stride),
            list(reference.padding),
            list(reference.dilation),
            int(reference.groups),
        )
        self.x, self.out, self.relu = x, out, relu

    def pack(self) -> Any:
        prepack = getattr(torch.ops.quantized, _CONV_PREPACK[self.dims])
        return prepack(self.qweight(), self.bias, *self.conv_args)

    def op(self) -> Callable[..., torch.Tensor]:
        return _quantized_op(_CONV_OPS[self.dims][int(self.relu)])


class QuantizedConvTranspose(_Static):
    """Static int8 transposed conv 1d/2d/3d (per-tensor weights): uint8 in, uint8 out.

    Example:
        >>> from fxquant.nn import reference
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.1, "zero_point": 0}
        >>> float_conv = nn.ConvTranspose2d(2, 2, 2, stride=2)
        >>> ref = reference.ConvTranspose2d.from_float(float_conv, qparams)
        >>> q = TensorQParams(0.1, 0)
        >>> kernel = QuantizedConvTranspose("fbgemm", ref, q, TensorQParams(0.2, 0))
        >>> kernel(torch.zeros(1, 2, 3, 3, dtype=torch.uint8)).shape
        torch.Size([1, 2, 6, 6])
    """

    def __init__(self, engine: str, reference: Any, x: TensorQParams, out: TensorQParams) -> None:
        super().__init__(engine, reference)
        self.dims = reference.weight.dim() - 2
        self.conv_args = (
            list(reference.stride),
            list(reference.padding),
            list(reference.output_padding),
            list(reference.dilation),
            int(reference.groups),
        )
        self.x, self.out = x, out

    def pack(self) -> Any:
        prepack = getattr(torch.ops.quantized, f"conv_transpose{self.dims}d_prepack")
        return prepack(self.qweight(), self.bias, *self.conv_args)

    def op(self) -> Callable[..., torch.Tensor]:
        return _quantized_op(f"conv_transpose{self.dims}d")


def build_conv_transpose(engine: str) -> Callable[[Any], nn.Module | None]:
    """A rule builder for reference transposed convs: per-tensor weights -> the quint8 kernel.

    Per-channel weights (not supported by the engines' transposed kernels) are replayed
    in float by the reference module itself.

    Example:
        >>> callable(build_conv_transpose("fbgemm"))
        True
    """

    def build(match: Any) -> nn.Module | None:
        reference = match.module
        qx, out = _tensor_qparams(match.inputs[0]), _tensor_qparams(match.output)
        if qx is None or out is None:
            return None
        if torch.as_tensor(reference.get_weight_qparams()["scale"]).numel() == 1:
            return QuantizedConvTranspose(engine, reference, qx, out)
        step = Step("module", 0, (("input", 0),), {})
        return QuantizedOps(engine, [step], [qx], out, native=False, modules=[reference])

    return build


class QuantizedLinearDynamic(_Weighted):
    """Dynamic int8 linear: float in, float out; activations quantized per call by the kernel.

    ``reduce_range`` is True when the dynamic activation range is 7 bits (0..127).

    Example:
        >>> from fxquant.nn import reference
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.1, "zero_point": 0}
        >>> ref = reference.Linear.from_float(nn.Linear(4, 2), qparams)
        >>> QuantizedLinearDynamic("fbgemm", ref)(torch.zeros(3, 4)).dtype
        torch.float32
    """

    def __init__(self, engine: str, reference: Any, reduce_range: bool = False) -> None:
        super().__init__(engine, reference)
        self.reduce_range = reduce_range

    def pack(self) -> Any:
        return torch.ops.quantized.linear_prepack(self.qweight(), self.bias)

    def bind(self) -> Callable[..., torch.Tensor]:
        engine, op = _engine_id(self.engine), _quantized_op("linear_dynamic")
        packed, reduce_range = self.packed(), self.reduce_range

        def call(x: torch.Tensor) -> torch.Tensor:
            return _run_on(engine, op, x, packed, reduce_range)

        return call


class QuantizedLinearFP16(_Packed):
    """Linear with an fp16 weight (fbgemm's fp16 GEMM): float in, float out.

    Attributes:
        weight: the weight, rounded to fp16 and kept as float32 (the prepack input).

    Example:
        >>> from fxquant.nn import reference
        >>> fp16 = {"qscheme": None, "dtype": torch.float16}
        >>> ref = reference.Linear.from_float(nn.Linear(4, 2), fp16)
        >>> QuantizedLinearFP16("fbgemm", ref)(torch.zeros(3, 4)).shape
        torch.Size([3, 2])
    """

    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, engine: str, reference: Any) -> None:
        super().__init__(engine)
        self.register_buffer("weight", reference.get_quantized_weight().detach().float().clone())
        bias = getattr(reference, "bias", None)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def pack(self) -> Any:
        return torch.ops.quantized.linear_prepack_fp16(self.weight, self.bias)

    def bind(self) -> Callable[..., torch.Tensor]:
        engine, op = _engine_id(self.engine), _quantized_op("linear_dynamic_fp16")
        packed = self.packed()

        def call(x: torch.Tensor) -> torch.Tensor:
            return _run_on(engine, op, x, packed)

        return call


class QuantizedBinary(_Bound):
    """quantized add or mul of two uint8 tensors (optionally fused relu).

    Example:
        >>> q = TensorQParams(0.1, 0)
        >>> kernel = QuantizedBinary("fbgemm", "add", (q, q), TensorQParams(0.2, 0))
        >>> ten = torch.full((2,), 10, dtype=torch.uint8)
        >>> kernel(ten, ten).tolist()
        [10, 10]
    """

    def __init__(
        self,
        engine: str,
        op: str,
        inputs: tuple[TensorQParams, TensorQParams],
        out: TensorQParams,
        relu: bool = False,
    ) -> None:
        super().__init__(engine)
        self.op_name, self.inputs, self.out, self.relu = op, inputs, out, relu
        self.float_output = False
        self.clamp: tuple[int, int] | None = None  # an absorbed relu/relu6, on the integers

    def absorb(self, step: object) -> bool:
        """Take over a relu/relu6 clamp, then the dequantize step, that alone follow it.

        Example:
            >>> q = TensorQParams(0.1, 0)
            >>> QuantizedBinary("fbgemm", "add", (q, q), q).absorb(IntegerClamp(0, 60))
            True
        """
        return _absorb(self, step)

    def bind(self) -> Callable[..., torch.Tensor]:
        engine = _engine_id(self.engine)
        op = _quantized_op(f"{self.op_name}_relu" if self.relu else self.op_name)
        (first, first_scale, first_zero), (second, second_scale, second_zero) = (
            (_quint8_template(q.scale, q.zero_point), q.scale, q.zero_point) for q in self.inputs
        )
        out, float_output = _clamped(self.out, self.clamp), self.float_output

        scale, zero_point = out.scale, out.zero_point

        def call(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            qa = _quint8_input(a, first, first_scale, first_zero)
            qb = _quint8_input(b, second, second_scale, second_zero)
            previous = _GET_ENGINE()  # _run_on, written out (10 adds in MobileNetV2)
            if previous != engine:
                _SET_ENGINE(engine)
            try:
                if _Quiet.spent and not torch.is_warn_always_enabled():
                    result = op(qa, qb, scale, zero_point)
                else:
                    with _Quiet():
                        result = op(qa, qb, scale, zero_point)
            finally:
                if previous != engine:
                    _SET_ENGINE(previous)
            return _result(result, out, float_output)

        return call


class QuantizedCat(_Bound):
    """quantized cat of uint8 tensors along ``dim``, requantized to the output's qparams.

    Example:
        >>> q = TensorQParams(0.1, 0)
        >>> kernel = QuantizedCat("fbgemm", (q, q), TensorQParams(0.1, 0), dim=0)
        >>> kernel(torch.ones(1, dtype=torch.uint8), torch.ones(1, dtype=torch.uint8)).tolist()
        [1, 1]
    """

    def __init__(
        self, engine: str, inputs: Sequence[TensorQParams], out: TensorQParams, dim: int
    ) -> None:
        super().__init__(engine)
        self.all_inputs, self.out, self.dim = tuple(inputs), out, dim

    def bind(self) -> Callable[..., torch.Tensor]:
        engine, op, dim, out = _engine_id(self.engine), _quantized_op("cat"), self.dim, self.out
        inputs = [
            (_quint8_template(q.scale, q.zero_point), q.scale, q.zero_point)
            for q in self.all_inputs
        ]

        def call(*values: torch.Tensor) -> torch.Tensor:
            quantized = [_quint8_input(v, *q) for v, q in zip(values, inputs, strict=True)]
            return _uint8_output(
                _run_on(engine, op, quantized, dim, out.scale, out.zero_point), out
            )

        return call


class QuantizedUnary(_Bound):
    """An elementwise quantized op with its own output qparams, ``op(qx, scale, zero_point)``.

    For ops whose float path would cost a dequantize and a quantize around the float op
    (hardswish: 150 us of MobileNetV2's head at batch 1 in float, measured, 1 thread).

    Example:
        >>> q = TensorQParams(0.1, 0)
        >>> kernel = QuantizedUnary("fbgemm", "hardswish", q, q)
        >>> kernel(torch.tensor([0, 30], dtype=torch.uint8)).tolist()
        [0, 30]
    """

    def __init__(self, engine: str, op: str, x: TensorQParams, out: TensorQParams) -> None:
        super().__init__(engine)
        self.op_name, self.x, self.out = op, x, out

    def bind(self) -> Callable[..., torch.Tensor]:
        engine, op, x, out = _engine_id(self.engine), _quantized_op(self.op_name), self.x, self.out
        template = _quint8_template(x.scale, x.zero_point)

        def call(values: torch.Tensor) -> torch.Tensor:
            quantized = _quint8_input(values, template, x.scale, x.zero_point)
            return _uint8_output(_run_on(engine, op, quantized, out.scale, out.zero_point), out)

        return call


@dataclass(frozen=True, slots=True)
class ChannelQParams:
    """Per-channel qparams of an integer input (a functional op's weight), dequantized in float.

    Example:
        >>> q = ChannelQParams(torch.tensor([0.5]), torch.tensor([0]), 0, -128, 127, torch.int8)
        >>> q.dequantize(torch.tensor([[2]], dtype=torch.int8)).tolist()
        [[1.0]]
    """

    scales: torch.Tensor
    zero_points: torch.Tensor
    axis: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype

    def dequantize(self, values: torch.Tensor) -> torch.Tensor:
        """The float values of ``values``."""
        from fxquant import qdq  # the flow's own per-channel dequantize

        return qdq.dequantize_per_channel(
            values,
            self.scales,
            self.zero_points,
            self.axis,
            self.quant_min,
            self.quant_max,
            self.dtype,
        )


@dataclass(frozen=True, slots=True)
class Step:
    """One op of a matched pattern, replayed by :class:`QuantizedOps`.

    ``target`` is a function, a method name (``kind == "method"``) or the index of a
    submodule (``kind == "module"``). In ``args``/``kwargs`` an ``("input", i)``
    reference stands for the kernel's i-th argument and ``("step", j)`` for the
    result of step j.

    Example:
        >>> Step("function", torch.sigmoid, (("input", 0),), {}).kind
        'function'
    """

    kind: str
    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _resolve(value: Any, inputs: Sequence[Any], results: Sequence[Any]) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] in ("input", "step"):
        return inputs[value[1]] if value[0] == "input" else results[value[1]]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, inputs, results) for v in value)
    return value


class QuantizedOps(nn.Module):
    """Replays a pattern's ops on quint8 tensors (``native``) or on float values.

    Integer mode (``integer=True``) runs ops that are exact on the integers themselves
    (reshapes, max pooling, relu as ``clamp_min(zero_point)``) on the uint8 tensors,
    when the output keeps the input's qparams: no quint8 view, no engine. Native mode
    runs ops that torch implements on quint8 tensors (average pooling, sigmoid, tanh,
    ...); a result whose qparams differ from the output's is requantized. Float mode
    dequantizes the inputs with torch's vectorized kernel, runs the float ops and
    quantizes the result: for ops with no int8 kernel.

    Example:
        >>> q = TensorQParams(1 / 256, 0)
        >>> steps = (Step("function", torch.sigmoid, (("input", 0),), {}),)
        >>> kernel = QuantizedOps("fbgemm", steps, (TensorQParams(0.1, 128),), q, native=True)
        >>> kernel(torch.tensor([128], dtype=torch.uint8)).tolist()
        [128]
    """

    def __init__(  # noqa: PLR0913, PLR0917  # the op list, its qparams and three switches
        self,
        engine: str,
        steps: Sequence[Step],
        inputs: Sequence[TensorQParams | ChannelQParams | None],
        out: TensorQParams,
        native: bool,
        modules: Sequence[nn.Module] = (),
        integer: bool = False,
    ) -> None:
        super().__init__()
        self.engine, self.steps, self.inputs, self.out = engine, tuple(steps), tuple(inputs), out
        self.native, self.integer = native, integer
        self.step_modules = nn.ModuleList(modules)
        self._single_step = self._single()
        # no in-place method (resize_...) among the steps: they may read a kernel's result
        self._reads_only = not any(
            step.kind == "method" and str(step.target).endswith("_") for step in self.steps
        )
        self._engine = _engine_id(engine)

    def _single(self) -> Step | None:
        """The one step when it takes input 0 first and constants after (the common case)."""
        if len(self.steps) != 1 or len(self.inputs) != 1:
            return None
        step = self.steps[0]
        consts = step.args[1:]
        if not step.args or step.args[0] != ("input", 0) or step.kwargs:
            return None
        refs = [a for a in consts if isinstance(a, tuple) and a[:1] in (("input",), ("step",))]
        return None if refs else step

    def _run(self, values: Sequence[Any]) -> Any:
        single = self._single_step
        if single is not None:  # no argument templates to resolve: saves ~10 us per call
            x, consts = values[0], single.args[1:]
            if single.kind == "module":  # the dict itself: ModuleList indexing costs 1 us
                return self.step_modules._modules[str(single.target)](x, *consts)
            if single.kind == "method":
                return getattr(x, single.target)(*consts)
            return single.target(x, *consts)
        results: list[Any] = []
        for step in self.steps:
            args = _resolve(step.args, values, results)
            kwargs = {k: _resolve(v, values, results) for k, v in step.kwargs.items()}
            if step.kind == "module":
                results.append(self.step_modules[step.target](*args, **kwargs))
            elif step.kind == "method":
                results.append(getattr(args[0], step.target)(*args[1:], **kwargs))
            else:
                results.append(step.target(*args, **kwargs))
        return results[-1]

    def _view(self, value: Any, qparams: TensorQParams | ChannelQParams | None) -> Any:
        if qparams is None:
            return value
        if isinstance(qparams, ChannelQParams):
            return qparams.dequantize(value)
        if self._reads_only:  # a kernel's result, as it holds it: no new view
            template = _quint8_template(qparams.scale, qparams.zero_point)
            quantized = _quint8_input(value, template, qparams.scale, qparams.zero_point)
        else:
            quantized = as_quint8(value, qparams.scale, qparams.zero_point)
        return quantized if self.native else quantized.dequantize()

    def forward(self, *values: Any) -> torch.Tensor:
        if self.integer:
            return self._run(values)  # type: ignore[no-any-return]  # the last step's tensor
        return _run_on(self._engine, self._run_quantized, values)

    def _run_quantized(self, values: Sequence[Any]) -> torch.Tensor:
        """The steps on quint8 views (or their floats), then the result in ``out``'s integers."""
        result = self._run([self._view(v, q) for v, q in zip(values, self.inputs, strict=True)])
        out = self.out
        if result.is_quantized:
            if result.q_scale() == out.scale and result.q_zero_point() == out.zero_point:
                return out.finish(result)  # no holder: the result may view an input
            result = result.dequantize()
        return out.quantize(result)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # torch's is untyped
        self._engine = _engine_id(self.engine)  # engine ids belong to the running torch


class IntegerClamp(nn.Module):
    """relu (``high`` None) or relu6 on the integers: a clamp to ``[low, high]``.

    A conv, linear or add kernel that it alone follows absorbs it (see ``absorb``).

    Example:
        >>> IntegerClamp(3, 9)(torch.tensor([0, 5, 200], dtype=torch.uint8)).tolist()
        [3, 5, 9]
    """

    def __init__(self, low: int, high: int | None = None) -> None:
        super().__init__()
        self.low, self.high = low, high

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, self.low, self.high)


# ---------------------------------------------------------------- lowering rules
# Which reference pattern runs which kernel is the same for every quint8 engine: the
# plugins call ``lowering_rules(engine, their pattern configs)`` and state only the engine.

_NATIVE_FUNCTIONS: frozenset[Any] = frozenset(
    {
        torch.nn.functional.max_pool1d,
        torch.nn.functional.max_pool2d,
        torch.nn.functional.max_pool3d,
        torch.nn.functional.avg_pool1d,
        torch.nn.functional.avg_pool2d,
        torch.nn.functional.avg_pool3d,
        torch.nn.functional.adaptive_avg_pool1d,
        torch.nn.functional.adaptive_avg_pool2d,
        torch.nn.functional.adaptive_avg_pool3d,
        torch.nn.functional.relu,
        torch.nn.functional.dropout,
        torch.nn.functional.interpolate,
        torch.nn.functional.pixel_shuffle,
        torch.nn.functional.pixel_unshuffle,
        torch.relu,
        torch.flatten,
        torch.mean,
        torch.squeeze,
        torch.unsqueeze,
        torch.transpose,
        torch.chunk,
        torch.repeat_interleave,
        torch.sigmoid,
        torch.tanh,
        torch.nn.functional.hardsigmoid,
    }
)
_NATIVE_METHODS = frozenset(
    {
        "relu", "contiguous", "detach", "flatten", "mean", "permute", "repeat",
        "reshape", "resize_", "shape", "size", "squeeze", "transpose", "unsqueeze", "view",
        "chunk", "sigmoid", "tanh", "expand", "narrow",
    }
)  # fmt: skip
_NATIVE_MODULES: tuple[type[nn.Module], ...] = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.ReLU, nn.Identity,
    nn.Dropout, nn.Flatten, nn.Upsample, nn.PixelShuffle,
    nn.Sigmoid, nn.Tanh, nn.Hardsigmoid,
)  # fmt: skip


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


def _input_qparams(qparams: Any) -> TensorQParams | ChannelQParams | None:
    if qparams is not None and qparams.is_per_channel and not qparams.is_dynamic:
        return ChannelQParams(
            torch.as_tensor(qparams.scale).detach().clone(),
            torch.as_tensor(qparams.zero_point).detach().clone(),
            int(qparams.axis),
            int(qparams.quant_min),
            int(qparams.quant_max),
            qparams.dtype,
        )
    return _tensor_qparams(qparams)


def _is_native(kind: str, target: Any, module: nn.Module | None) -> bool:
    if kind == "module":
        return isinstance(module, _NATIVE_MODULES)
    if kind == "method":
        return target in _NATIVE_METHODS
    return target in _NATIVE_FUNCTIONS


def _template(value: Any, refs: dict[Any, Any], counter: list[int]) -> Any:
    """Node args -> Step args, numbering outside inputs in the order the flow passes them."""
    if isinstance(value, torch.fx.Node):
        if value in refs:
            return refs[value]
        counter[0] += 1
        return ("input", counter[0] - 1)
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v, refs, counter) for v in value)
    return value


def _steps(match: Any) -> tuple[list[Step], list[nn.Module], bool]:
    """The matched nodes as Steps, the modules they call, and whether all run on quint8."""
    refs: dict[Any, Any] = {}
    counter = [0]
    steps: list[Step] = []
    modules: list[nn.Module] = []
    native = True
    for index, (node, module) in enumerate(zip(match.nodes, match.modules, strict=True)):
        args = _template(tuple(node.args), refs, counter)
        kwargs = {k: _template(v, refs, counter) for k, v in node.kwargs.items()}
        kind = {"call_module": "module", "call_method": "method"}.get(node.op, "function")
        target: Any = node.target
        if kind == "module":
            modules.append(module)
            target = len(modules) - 1
        native = native and _is_native(kind, node.target, module)
        steps.append(Step(kind, target, args, kwargs))
        refs[node] = ("step", index)
    return steps, modules, native


_VIEW_METHODS = frozenset(
    {"contiguous", "detach", "flatten", "permute", "reshape", "squeeze", "transpose",
     "unsqueeze", "view", "expand", "narrow", "repeat"}
)  # fmt: skip
_INTEGER_FUNCTIONS: frozenset[Any] = frozenset(
    {
        torch.flatten, torch.squeeze, torch.unsqueeze, torch.transpose,
        torch.nn.functional.max_pool1d, torch.nn.functional.max_pool2d,
        torch.nn.functional.max_pool3d,
    }
)  # fmt: skip
_INTEGER_MODULES: tuple[type[nn.Module], ...] = (
    nn.Flatten, nn.Identity, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
)  # fmt: skip
_RELUS: frozenset[Any] = frozenset({torch.relu, torch.nn.functional.relu, "relu"})
_MAX_POOLS: tuple[type[nn.Module], ...] = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)
_MAX_POOL_FUNCTIONS: frozenset[Any] = frozenset(
    {torch.nn.functional.max_pool1d, torch.nn.functional.max_pool2d, torch.nn.functional.max_pool3d}
)


def max_pool_integers(
    x: torch.Tensor, pool: Callable[..., torch.Tensor], *args: Any, **kwargs: Any
) -> torch.Tensor:
    """Max pooling of uint8 values through a quint8 view (no copy; max ignores qparams).

    torch 2.13's uint8 max pooling refuses channels_last inputs of 32x32 and more
    ("input_depth * input_height * input_width <= int max"), and the conv kernels
    return channels_last; the quint8 kernel pools them natively.

    Example:
        >>> x = torch.arange(16, dtype=torch.uint8).reshape(1, 1, 4, 4)
        >>> max_pool_integers(x, torch.nn.functional.max_pool2d, 2).flatten().tolist()
        [5, 7, 13, 15]
    """
    if x.dtype != torch.uint8:
        return pool(x, *args, **kwargs)
    with _Quiet():
        return as_uint8(pool(as_quint8(x, 1.0, 0), *args, **kwargs))


def _integer_step(step: Step, module: nn.Module | None, out: TensorQParams) -> Step | None:
    """``step`` as an op on the integers (same qparams in and out), or None.

    relu is ``clamp_min(zero_point)`` and relu6 a clamp to the integers of 0 and 6:
    exact, where QNNPACK's quint8 relu6 is off by up to 119 steps (torch 2.13).
    """
    zero_point = out.zero_point
    six = min(out.quant_max, round(6.0 / out.scale) + zero_point)
    relu6 = isinstance(module, nn.ReLU6) or step.target is torch.nn.functional.relu6
    if relu6 and not step.kwargs.get("inplace", False):
        return Step("function", torch.clamp, (step.args[0], zero_point, six), {})
    if step.kind == "module":
        if isinstance(module, nn.ReLU):
            return Step("function", torch.clamp_min, (*step.args, zero_point), {})
        if isinstance(module, _MAX_POOLS):
            return Step("function", max_pool_integers, (step.args[0], module), {})
        return step if isinstance(module, _INTEGER_MODULES) else None
    if step.target in _RELUS and not step.kwargs.get("inplace", False):
        return Step("function", torch.clamp_min, (step.args[0], zero_point), {})
    if step.kind == "method":
        return step if step.target in _VIEW_METHODS else None
    if step.target in _MAX_POOL_FUNCTIONS:
        pooled = (step.args[0], step.target, *step.args[1:])
        return Step("function", max_pool_integers, pooled, dict(step.kwargs))
    return step if step.target in _INTEGER_FUNCTIONS else None


def _integer_steps(
    steps: Sequence[Step],
    modules: Sequence[nn.Module],
    inputs: Sequence[Any],
    out: TensorQParams,
) -> list[Step] | None:
    """The steps run on the integers when that is exact, else None."""
    if len(inputs) != 1 or inputs[0] != out:
        return None  # requantization needed: not a pure integer op
    found = []
    for step in steps:
        module = modules[step.target] if step.kind == "module" else None
        integer = _integer_step(step, module, out)
        if integer is None:
            return None
        found.append(integer)
    return found


def build_ops(engine: str) -> Callable[[Any], nn.Module | None]:
    """A rule builder for non-weighted patterns: add/mul/cat kernels, else replayed ops.

    Example:
        >>> callable(build_ops("fbgemm"))
        True
    """

    def build(match: Any) -> nn.Module | None:
        out = _tensor_qparams(match.output)
        if out is None:
            return None
        inputs = [_input_qparams(q) for q in match.inputs]
        if any(q is None and p is not None for q, p in zip(inputs, match.inputs, strict=True)):
            return None  # an int8 activation or a dynamic input: no quint8 kernel takes it
        tensors = [q for q in inputs if not isinstance(q, ChannelQParams)]
        kernel = _special(engine, match, tensors, out) if len(tensors) == len(inputs) else None
        if kernel is not None:
            return kernel
        steps, modules, native = _steps(match)
        integer = _integer_steps(steps, modules, inputs, out)
        if integer is not None:
            clamp = _integer_clamp(integer)
            if clamp is not None:
                return clamp
            return QuantizedOps(engine, integer, inputs, out, True, modules, integer=True)
        native = native and len(tensors) == len(inputs)
        return QuantizedOps(engine, steps, inputs, out, native=native, modules=modules)

    return build


def _integer_clamp(steps: Sequence[Step]) -> IntegerClamp | None:
    """The integer steps as an :class:`IntegerClamp` when they are one relu or relu6."""
    if len(steps) != 1 or steps[0].args[:1] != (("input", 0),):
        return None
    step = steps[0]
    if step.target is torch.clamp_min and len(step.args) == 2:
        return IntegerClamp(int(step.args[1]))
    if step.target is torch.clamp and len(step.args) == 3:
        return IntegerClamp(int(step.args[1]), int(step.args[2]))
    return None


def _special(
    engine: str, match: Any, inputs: Sequence[TensorQParams | None], out: TensorQParams
) -> nn.Module | None:
    names = [_op_name(n, m) for n, m in zip(match.nodes, match.modules, strict=True)]
    tensors = [q for q in inputs if q is not None]
    if len(tensors) != len(inputs):
        return None
    relu = len(names) == 2 and names[1] == "relu"
    if names[0] in ("add", "iadd", "mul", "imul") and len(inputs) == 2 and len(names) <= 1 + relu:
        op = "mul" if "mul" in names[0] else "add"
        return QuantizedBinary(engine, op, (tensors[0], tensors[1]), out, relu=relu)
    if names == ["cat"] and len(inputs) >= 1:
        node = match.nodes[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        return QuantizedCat(engine, tensors, out, int(dim))
    if names == ["hardswish"] and len(inputs) == 1:
        return QuantizedUnary(engine, "hardswish", tensors[0], out)
    return None


def _op_name(node: Any, module: nn.Module | None) -> str:
    if node.op == "call_method":
        return str(node.target)
    if module is not None:
        return type(module).__name__.lower()
    return str(getattr(node.target, "__name__", ""))


def build_weighted(engine: str, relu: bool) -> Callable[[Any], nn.Module | None]:
    """A rule builder for reference linear/conv modules (plain, or fused with relu).

    Static uint8 -> :class:`QuantizedLinear` / :class:`QuantizedConv`; a dynamic input
    -> :class:`QuantizedLinearDynamic`; an fp16 weight -> :class:`QuantizedLinearFP16`.

    Example:
        >>> callable(build_weighted("qnnpack", relu=True))
        True
    """

    def build(match: Any) -> nn.Module | None:
        module = match.module
        reference = module[0] if relu else module
        weight_dtype = reference.get_weight_qparams().get("dtype")
        is_linear = isinstance(reference, nn.Linear)
        x = match.inputs[0] if match.inputs else None
        if weight_dtype == torch.float16 and is_linear and not relu and match.output is None:
            return QuantizedLinearFP16(engine, reference)
        if weight_dtype not in (torch.int8, _QINT8):
            return None
        if x is not None and x.is_dynamic and is_linear and not relu:
            narrow = int(x.quant_max) - int(x.quant_min) <= 127
            return QuantizedLinearDynamic(engine, reference, reduce_range=narrow)
        qx, out = _tensor_qparams(x), _tensor_qparams(match.output)
        if qx is None or out is None:
            return None
        kernel = QuantizedLinear if is_linear else QuantizedConv
        return kernel(engine, reference, qx, out, relu=relu)

    return build


_WEIGHTED: tuple[tuple[str, bool], ...] = (
    ("Linear", False), ("Conv1d", False), ("Conv2d", False), ("Conv3d", False),
    ("LinearReLU", True), ("ConvReLU1d", True), ("ConvReLU2d", True), ("ConvReLU3d", True),
)  # fmt: skip


def lowering_rules(engine: str, configs: Sequence[Any]) -> list[Any]:
    """One LoweringRule per reference pattern of ``configs``, running on ``engine``.

    Weighted modules (reference linear/conv, fused with relu or not) get the prepacked
    kernels; every other simple pattern gets :func:`build_ops` (add/mul/cat kernels, ops
    replayed on quint8 tensors, or the float fallback). Patterns that never appear in a
    reference model (float weighted modules, QAT modules, fusion inputs) get no rule.

    Example:
        >>> from fxquant.patterns import linear_configs
        >>> sorted(r.name for r in lowering_rules("fbgemm", linear_configs([])))[:2]
        ['fbgemm_conv1d', 'fbgemm_conv2d']
    """
    from fxquant.nn import intrinsic, reference
    from fxquant.registry.hookspecs import LoweringRule

    rules: dict[Any, Any] = {}
    for name, relu in _WEIGHTED:
        cls = getattr(intrinsic if relu else reference, name)
        rule = LoweringRule(
            cls, build=build_weighted(engine, relu), name=f"{engine}_{name.lower()}"
        )
        rules[rule.key] = rule
    for dims in (1, 2, 3):
        cls = getattr(reference, f"ConvTranspose{dims}d")
        name = f"{engine}_conv_transpose{dims}d"
        rule = LoweringRule(cls, build=build_conv_transpose(engine), name=name)
        rules[rule.key] = rule
    for config in configs:
        pattern = _reference_pattern(config)
        if pattern is None:
            continue
        rule = LoweringRule(pattern, build=build_ops(engine), name=f"{engine}_ops")
        rules.setdefault(rule.key, rule)
    return list(rules.values())


def _reference_pattern(config: Any) -> Any:
    """The pattern as it appears in the reference model, or None when it never does."""
    if config.pattern is None or config.reference_quantized_module is not None:
        return None  # complex-format patterns, and weighted modules (swapped at convert)
    if config.fused_module is not None:
        return config.fused_module  # e.g. (BatchNorm2d, ReLU) is BNReLU2d after fusion
    if config.fuser_method is not None or config.qat_module is not None:
        return None
    pattern = config.pattern
    parts = pattern if isinstance(pattern, tuple) else (pattern,)
    if any(isinstance(p, type) and p.__module__.startswith("fxquant.nn.qat") for p in parts):
        return None
    return pattern
