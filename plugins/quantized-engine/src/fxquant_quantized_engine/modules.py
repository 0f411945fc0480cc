"""The kernel modules around torch's quint8 ops: weighted, binary, cat, unary and clamp."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from fxquant.lowering import Dequantize, Quantize
from fxquant.lowering.kernels.cpu import symmetric_zero_padding
from fxquant.lowering.kernels.integer import IntegerClamp
from torch import nn

from fxquant_quantized_engine.engine import (
    EngineScope,
    _engine_id,
    _Quiet,
    acquire_engine,
    release_engine,
)
from fxquant_quantized_engine.float_output import float_output_call
from fxquant_quantized_engine.views import (
    TensorQParams,
    _clamped,
    _quint8_input,
    _quint8_template,
    _result,
    _run_on,
    _tensor_qparams,
    _uint8_output,
    _unary_call,
    weight_as_qint8,
)


def _absorb(kernel: Any, step: object) -> bool:
    """Epilogues of a uint8-output kernel (see ``LoweringRule``): a relu/relu6
    :class:`IntegerClamp` (clamped in place on the kernel's fresh result), then the
    dequantize step after it (the kernel returns floats)."""
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
            # binding makes quint8 templates of the input qparams: torch's deprecation
            # warning must stay inside here as it does inside the calls
            with _Quiet():
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
            >>> from fxquant.lowering import Quantize, QParams
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


class _TakesFeatures:
    """A linear kernel checks its input's last dim on every call: QNNPACK's GEMM reads as
    many features as the weight has, whatever the row holds (torch 2.13: a 16-feature
    linear given 12 or 20 features returned a result, silently)."""

    in_features: int

    def forward(self, *values: torch.Tensor) -> torch.Tensor:
        features = values[0].shape[-1]
        if features != self.in_features:
            msg = (
                f"{type(self).__name__} takes {self.in_features} input features (its "
                f"weight's), got an input of shape {tuple(values[0].shape)}"
            )
            raise RuntimeError(msg)
        return super().forward(*values)  # type: ignore[misc, no-any-return]  # the kernel's


class QuantizedLinear(_TakesFeatures, _Static):
    """Static int8 linear (optionally fused relu): uint8 in, uint8 out, or float out.

    ``out=None``: int8 in, float out, what the engines' linear patterns say
    (:mod:`fxquant_quantized_engine.float_output` runs it exactly). Where a quantized op
    reads the output, its quantize step is absorbed and the uint8-output kernel runs.

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
        out: TensorQParams | None,
        relu: bool = False,
    ) -> None:
        super().__init__(engine, reference)
        self.x, self.out, self.relu = x, out, relu  # type: ignore[assignment]  # None: float out
        self.in_features = int(self.weight.shape[1])

    def absorb(self, step: object) -> bool:
        """A float output takes the quantize step a quantized consumer put after it (and
        is then a uint8-output kernel); a uint8 output, what :meth:`_Static.absorb` takes.

        Example:
            >>> from fxquant.nn import reference
            >>> from fxquant.lowering import Quantize, QParams
            >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
            ...            "scale": 0.1, "zero_point": 0}
            >>> ref = reference.Linear.from_float(nn.Linear(4, 2), qparams)
            >>> kernel = QuantizedLinear("fbgemm", ref, TensorQParams(0.1, 0), None)
            >>> kernel(torch.zeros(3, 4, dtype=torch.uint8)).dtype
            torch.float32
            >>> kernel.absorb(Quantize(QParams(torch.uint8, 0, 255, 0.2, 3)))
            True
            >>> kernel(torch.zeros(3, 4, dtype=torch.uint8)).dtype
            torch.uint8
        """
        if self.out is not None:
            return _absorb(self, step)
        if not isinstance(step, Quantize):
            return False
        out = _tensor_qparams(step.qparams)
        if out is None:
            return False
        self.out, self._call = out, None
        return True

    def bind(self) -> Callable[..., torch.Tensor]:
        if self.out is not None:
            return super().bind()
        return float_output_call(
            self.engine,
            _engine_id(self.engine),
            self.packed(),
            self.x,
            float_input=self.float_input,
            relu=self.relu,
        )

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


def explicit_padding(conv: Any) -> list[int] | str:
    """``conv``'s padding as the quint8 conv kernels take it, or why it cannot
    (:func:`fxquant.lowering.kernels.cpu.symmetric_zero_padding`).

    Example:
        >>> explicit_padding(nn.Conv2d(1, 1, 3, padding="same", dilation=2))
        [2, 2]
        >>> explicit_padding(nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"))
        "padding_mode 'reflect': only zero padding in the quint8 conv kernels"
    """
    return symmetric_zero_padding(conv, "the quint8 conv kernels")


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
        padding = explicit_padding(reference)
        if isinstance(padding, str):
            msg = f"QuantizedConv: {padding}"  # the rules decline such a conv first
            raise ValueError(msg)
        self.conv_args = (
            list(reference.stride),
            padding,
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


class QuantizedLinearDynamic(_TakesFeatures, _Weighted):
    """Dynamic int8 linear: float in, float out; activations quantized per call by the kernel.

    ``reduce_range`` is True when the dynamic activation range is 7 bits (0..127).
    ``split``: on fbgemm without VNNI, weights beyond +-64 with 8-bit activations
    saturate (``fxquant.lowering.kernels.cpu``); the weight runs as two exact GEMMs, its high
    half (``w >> 1``, twice the scale) and its lowest bit: two GEMMs' time.

    Example:
        >>> from fxquant.nn import reference
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.1, "zero_point": 0}
        >>> ref = reference.Linear.from_float(nn.Linear(4, 2), qparams)
        >>> QuantizedLinearDynamic("fbgemm", ref)(torch.zeros(3, 4)).dtype
        torch.float32
    """

    def __init__(
        self, engine: str, reference: Any, reduce_range: bool = False, *, split: bool = False
    ) -> None:
        super().__init__(engine, reference)
        self.reduce_range = reduce_range
        self.in_features = int(self.weight.shape[1])
        # symmetric weights only: w = 2 * (w >> 1) + (w & 1) keeps a zero point of 0
        self.split = split and not bool(self.weight_zero_point.any())

    def pack(self) -> Any:
        if not self.split:
            return torch.ops.quantized.linear_prepack(self.qweight(), self.bias)
        # FBGEMM without VNNI saturates on weights beyond +-64 (fxquant.lowering.kernels.cpu): the
        # high half (within +-64, twice the scale) and the lowest bit, each exact
        high, low = torch.bitwise_right_shift(self.weight, 1), torch.bitwise_and(self.weight, 1)
        zero_point = self.weight_zero_point
        return (
            torch.ops.quantized.linear_prepack(
                weight_as_qint8(high, self.weight_scale * 2, zero_point), self.bias
            ),
            torch.ops.quantized.linear_prepack(
                weight_as_qint8(low, self.weight_scale, zero_point), None
            ),
        )

    def bind(self) -> Callable[..., torch.Tensor]:
        engine, op = _engine_id(self.engine), _quantized_op("linear_dynamic")
        packed, reduce_range = self.packed(), self.reduce_range

        if self.split:  # both calls quantize x with the same qparams: the halves add up
            high, low = packed

            def call_split(x: torch.Tensor) -> torch.Tensor:
                result: torch.Tensor = _run_on(engine, op, x, high, reduce_range)
                return result.add_(_run_on(engine, op, x, low, reduce_range))

            return call_split

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
            acquire_engine(engine)  # see engine.py: one engine at a time
            try:
                if _Quiet.spent and not torch.is_warn_always_enabled():
                    result = op(qa, qb, scale, zero_point)
                else:
                    with _Quiet():
                        result = op(qa, qb, scale, zero_point)
            finally:
                release_engine()
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
