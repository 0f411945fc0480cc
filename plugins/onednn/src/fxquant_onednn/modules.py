"""oneDNN int8 kernel modules on plain uint8/int8 tensors (x86 lowers with them too).

Every module here takes and returns plain integer tensors (never ``quint8``):

    QLinear          torch.ops.onednn.qlinear_pointwise   uint8 x int8 -> uint8 (or float), relu/...
    DynamicQLinear   the same with the input quantized at run time (float in, float out)
    SharedInputDynamicQLinear  dynamic linears reading one input (q/k/v): quantized once
    Fp16Linear       torch.ops.onednn.linear_dynamic_fp16 (fp16 weight, float in and out)
    QConv            torch.ops.onednn.qconv{1,2,3}d_pointwise (+ ``.binary`` "sum" for conv + add)
    QAdd             int arithmetic add (+ relu); ``onednn.qadd`` is wrong for uint8 >= 128 in 2.13

A conv or linear absorbs the ``fxquant.lowering.kernels.integer.IntegerClamp`` (relu6, hardtanh)
that alone follows it as a ``hardtanh`` post op: no pass over the data of its own.
oneDNN clamps a uint8 output to 0..255 only: an output of fewer bits (0..127, the
7-bit activations of CPUs without VNNI) is clamped to its range by a ``hardtanh``
post op too, or after the kernel where the post op is taken.

Conv kernels keep activations channels_last, so a chain of convs never reorders.
Weights are kept as int8 buffers (the state_dict) and prepacked on the first call;
the packed copy is dropped by ``load_state_dict``, ``copy.deepcopy`` and pickling.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from fxquant.lowering import AddInput, Dequantize, QParams, Quantize
from fxquant.lowering.kernels import boundary
from fxquant.lowering.kernels.cpu import symmetric_zero_padding
from fxquant.lowering.kernels.integer import IntegerClamp
from fxquant.numerics import qdq  # the core's numerics, shared with the reference model
from torch import nn

__all__ = [
    "DynamicQLinear",
    "Fp16Linear",
    "QAdd",
    "QConv",
    "QLinear",
    "SharedInputDynamicQLinear",
    "symmetric_weight",
]

_ONEDNN = torch.ops.onednn
_LINEAR_OP = _ONEDNN.qlinear_pointwise.default
_CONV_OPS = (
    _ONEDNN.qconv1d_pointwise.default,
    _ONEDNN.qconv2d_pointwise.default,
    _ONEDNN.qconv3d_pointwise.default,
)
_CONV_BINARY = _ONEDNN.qconv2d_pointwise.binary  # looked up once, not on every conv + add


def symmetric_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The int8 weight and its per-output-channel float scales, or ``None`` if unsupported.

    oneDNN needs symmetric int8 weights (zero points 0) quantized per tensor or
    per output channel (axis 0); anything else returns ``None`` so the rule declines.

    Args:
        module: a reference module with ``get_quantized_weight``/``get_weight_qparams``.

    Example:
        >>> from fxquant.nn import reference
        >>> qparams = {"qscheme": torch.per_tensor_symmetric, "dtype": torch.qint8,
        ...            "scale": 0.1, "zero_point": 0}
        >>> ref = reference.Linear.from_float(nn.Linear(2, 3), qparams)
        >>> [t.dtype for t in symmetric_weight(ref)]
        [torch.int8, torch.float32]
    """
    qparams: dict[str, Any] = module.get_weight_qparams()  # type: ignore[operator]  # reference API
    weight: torch.Tensor = module.get_quantized_weight()  # type: ignore[operator]  # reference API
    axis = qparams.get("axis", 0)
    if weight.dtype != torch.int8 or (weight.dim() > 1 and axis not in (0, None)):
        return None
    scale = torch.as_tensor(qparams["scale"], dtype=torch.float32).reshape(-1)
    zero_point = torch.as_tensor(qparams["zero_point"]).reshape(-1)
    if bool((zero_point != 0).any()):
        return None
    channels = weight.shape[0]
    # contiguous: oneDNN's prepack reads the buffer row-major whatever its strides, and a
    # transposed weight (GPT-2's Conv1D as a Linear) gave noise
    weight = weight.detach().clone(memory_format=torch.contiguous_format)
    return weight, scale.expand(channels).contiguous()


class _Packed(nn.Module):
    """Base: an int8 weight buffer whose oneDNN-packed copy is made lazily and never saved."""

    _packed: torch.Tensor | None
    _tail: tuple[Any, ...] | None  # a kernel's constant arguments after the input, once packed

    def __init__(
        self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self._tail = None
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", scale.to(torch.float32))
        self.register_buffer("weight_zero_point", torch.zeros(scale.numel(), dtype=torch.int64))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self._packed = None

    def dequantized_weight(self) -> torch.Tensor:
        """The float weight these integers stand for: the reference module's weight after its
        quantize/dequantize step (per output channel, axis 0).

        Example:
            >>> kernel = _Packed(torch.tensor([[2, -4]], dtype=torch.int8), torch.ones(1) / 2, None)
            >>> kernel.dequantized_weight().tolist()
            [[1.0, -2.0]]
        """
        shape = (-1,) + (1,) * (self.weight.dim() - 1)
        zero_point = self.weight_zero_point.reshape(shape)
        return (self.weight.to(torch.float32) - zero_point) * self.weight_scale.reshape(shape)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._packed = None  # new weights: pack again on the next call
        self._tail = None

    def __getstate__(self) -> dict[str, Any]:
        # the packed tensor is an opaque oneDNN layout: rebuild it instead of copying it
        state = dict(self.__dict__)
        state["_packed"] = state["_tail"] = None
        return state


def _add(result: torch.Tensor, added: object) -> torch.Tensor:
    """``result + added``: in place on the kernel's fresh float ``result`` when the sum has its
    shape and dtype (a residual add at batch 8 then allocates and faults in no new 3 MB)."""
    if (
        isinstance(added, torch.Tensor)
        and added.dtype == result.dtype
        and torch.broadcast_shapes(added.shape, result.shape) == result.shape
    ):
        return result.add_(added)
    sum_: torch.Tensor = result + added  # promotes or broadcasts as the float add did
    return sum_


def _out_args(out: QParams | None) -> tuple[float, int, torch.dtype | None]:
    """Output scale, zero point and dtype for oneDNN: float32 output when ``out`` is None."""
    if out is None:
        return 1.0, 0, torch.float32
    assert out.scale is not None  # static output qparams always have a scale
    assert out.zero_point is not None
    dtype = None if out.dtype == torch.uint8 else out.dtype
    return float(out.scale), int(out.zero_point), dtype


def _range_clamp(q: QParams, post_op: str, args: list[float]) -> list[float]:
    """``hardtanh`` bounds: the reals ``q``'s integer range stands for, within ``args`` when
    ``post_op`` is already a ``hardtanh`` and at or above 0 after a ``relu``."""
    assert q.scale is not None  # static qparams
    assert q.zero_point is not None
    scale, zero_point = float(q.scale), int(q.zero_point)
    low, high = (q.quant_min - zero_point) * scale, (q.quant_max - zero_point) * scale
    if post_op == "relu":
        low = max(low, 0.0)
    if post_op == "hardtanh":
        low, high = max(low, args[0]), min(high, args[1])
    return [low, high]


def _hardtanh_args(
    clamp: object, scale: float, zero_point: int, post_op: str, args: list[float]
) -> list[float] | None:
    """The real bounds of ``clamp`` as ``hardtanh`` post op arguments after ``post_op``, or None.

    The kernel clamps before it quantizes its output with (``scale``, ``zero_point``):
    the bounds are the reals the clamp's integers stand for, so quantizing them gives
    those integers back. After a relu the lower bound is at least the zero point; after
    a ``hardtanh`` (``args``: an earlier clamp, or the output's range) both bounds are
    within its own.
    """
    if not isinstance(clamp, IntegerClamp) or post_op not in ("none", "relu", "hardtanh"):
        return None
    low = max(clamp.low, zero_point) if post_op == "relu" else clamp.low
    high = 255 if clamp.high is None else clamp.high  # the kernels' uint8 output
    bounds = [(low - zero_point) * scale, (high - zero_point) * scale]
    if post_op == "hardtanh":
        bounds = [max(bounds[0], args[0]), min(bounds[1], args[1])]
    return bounds


def _narrow_range(out: QParams | None) -> tuple[int, int] | None:
    """``out``'s integer range when it is narrower than the uint8 oneDNN clamps to, else None.

    Example:
        >>> _narrow_range(QParams(torch.uint8, 0, 127, scale=0.1, zero_point=0))
        (0, 127)
    """
    if out is None or out.dtype != torch.uint8 or (out.quant_min, out.quant_max) == (0, 255):
        return None
    return out.quant_min, out.quant_max


class QLinear(_Packed):
    """Static int8 linear: uint8 input, int8 per-channel weight, uint8 (or float) output.

    Args:
        weight: int8 ``[out_features, in_features]``.
        scale: float32 per-output-channel weight scales.
        bias: float bias or ``None``.
        x: the input's qparams (static, uint8).
        out: the output's qparams, or ``None`` for a float output.
        post_op: ``"none"``, ``"relu"``, ``"tanh"``, ``"leaky_relu"`` (oneDNN fuses it).
        post_op_args: scalars of the post op (e.g. ``[negative_slope]``).

    Example:
        >>> x = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)
        >>> w = torch.ones(2, 3, dtype=torch.int8)
        >>> kernel = QLinear(w, torch.full((2,), 0.5), None, x, out=None)
        >>> kernel(torch.full((1, 3), 10, dtype=torch.uint8))
        tensor([[1.5000, 1.5000]])
    """

    def __init__(  # noqa: PLR0913  # one argument per kernel parameter
        self,
        weight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        x: QParams,
        out: QParams | None,
        *,
        post_op: str = "none",
        post_op_args: tuple[float, ...] = (),
    ) -> None:
        super().__init__(weight, scale, bias)
        assert x.scale is not None  # static input
        assert x.zero_point is not None
        self.x_scale, self.x_zero_point = float(x.scale), int(x.zero_point)
        self.out_scale, self.out_zero_point, self.out_dtype = _out_args(out)
        self.post_op, self.post_op_args = post_op, list(post_op_args)
        self.post_op_algorithm = ""
        self.range_only = False  # a "hardtanh" post op that only clamps to the output range
        self.adds_input = False  # a float add absorbed: forward(qx, value) returns out + value
        # the integer output a dequantize step turned into floats (_to_float), and its grid
        self._integers: tuple[Any, ...] | None = None
        # (from, to): integers on one grid requantized onto another's after the kernel
        self.requantize: tuple[QParams, QParams] | None = None
        # a 7-bit output: clamped by a hardtanh post op, or after the kernel (leaky_relu, tanh)
        self.out_clamp = _narrow_range(out)
        if out is not None and self.out_clamp is not None and post_op in ("none", "relu"):
            self.post_op_args = _range_clamp(out, post_op, [])
            self.post_op, self.range_only, self.out_clamp = "hardtanh", post_op == "none", None

    def _weight(self, qx: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            # packing for the input's shape lets oneDNN pick the blocked layout it will run
            self._packed = _ONEDNN.qlinear_prepack(self.weight, list(qx.shape))
        return self._packed

    def absorb(self, step: object) -> bool:
        """Take over what alone follows this kernel (see ``LoweringRule``'s epilogues).

        A relu6 / hardtanh clamp of the integers; the dequantize step (the kernel
        then returns floats, clamped to the output range as the reference is);
        a float GELU after that (oneDNN's ``gelu`` post op, in place of the clamp);
        and the quantize step after those (integers again, with its qparams); or,
        with a float output, a float add of another value (a residual add: added in
        place on the kernel's fresh output, after the clamp; nothing after it).
        """
        self._tail = None  # the kernel's arguments may change
        if self.adds_input:
            return False  # the add comes last: a later step would run before it
        if isinstance(step, AddInput):
            self.adds_input = self.out_dtype == torch.float32
            return self.adds_input
        if isinstance(step, Dequantize):
            return self._to_float(step.qparams)
        if isinstance(step, nn.GELU):
            if self.out_dtype != torch.float32 or not (self.post_op == "none" or self.range_only):
                return False
            self.post_op, self.post_op_args = "gelu", []
            self.post_op_algorithm, self.range_only = step.approximate, False
            return True
        if isinstance(step, Quantize):
            return self._to_integers(step.qparams)
        if self.out_dtype is not None:  # float or int8 output: not the clamp's integers
            return False
        bounds = _hardtanh_args(
            step, self.out_scale, self.out_zero_point, self.post_op, self.post_op_args
        )
        if bounds is None or self.out_clamp is not None:
            return False
        self.post_op, self.post_op_args, self.range_only = "hardtanh", bounds, False
        return True

    def _to_float(self, q: QParams) -> bool:
        if self.out_dtype is not None or self.post_op not in ("none", "relu", "hardtanh"):
            return False
        state = (self.out_scale, self.out_zero_point, self.post_op, list(self.post_op_args))
        self._integers = (*state, self.range_only, q)
        self.post_op_args = _range_clamp(q, self.post_op, self.post_op_args)
        self.range_only = self.post_op == "none" or self.range_only
        self.post_op = "hardtanh"
        self.out_scale, self.out_zero_point, self.out_dtype = 1.0, 0, torch.float32
        return True

    def _to_integers(self, q: QParams) -> bool:
        if self.out_dtype != torch.float32 or q.is_per_channel or q.is_dynamic:
            return False
        if self._integers is not None and self.post_op == "hardtanh":
            return self._back_to_integers(q)
        if q.dtype != torch.uint8 or q.scale is None or q.zero_point is None:
            return False
        if (q.quant_min, q.quant_max) != (0, 255):  # oneDNN saturates at 0..255 only
            if self.post_op not in ("none", "hardtanh"):
                return False
            self.post_op_args = _range_clamp(q, self.post_op, self.post_op_args)
            self.post_op = "hardtanh"
        self.out_scale, self.out_zero_point = float(q.scale), int(q.zero_point)
        self.out_dtype, self.range_only = None, False
        return True

    def _back_to_integers(self, q: QParams) -> bool:
        """Dequantize (grid A) then quantize (grid B): the integers on A again, requantized.

        Floats clamped to A's range skip the rounding onto A, within half a step of A; on
        a finer grid B that is more than one step of B (a linear -> relu -> dropout ->
        linear whose relu kept a qconfig of its own: 1.5 steps). On A itself, the
        integers are exactly what the reference model's quantize step gives."""
        if q.scale is None or q.zero_point is None or q.dtype not in (torch.uint8, torch.int8):
            return False
        scale, zero_point, post_op, args, range_only, grid = self._integers  # type: ignore[misc]
        self.out_scale, self.out_zero_point, self.out_dtype = scale, zero_point, None
        self.post_op, self.post_op_args, self.range_only = post_op, args, range_only
        self._integers = None
        same = (float(q.scale), int(q.zero_point), q.quant_min, q.quant_max, q.dtype) == (
            float(grid.scale),
            int(grid.zero_point),
            grid.quant_min,
            grid.quant_max,
            grid.dtype,
        )
        self.requantize = None if same else (grid, q)
        return True

    def _requantized(self, result: torch.Tensor) -> torch.Tensor:
        grid, q = self.requantize  # type: ignore[misc]  # forward calls it only when set
        floats = qdq.dequantize_per_tensor(
            result, grid.scale, grid.zero_point, grid.quant_min, grid.quant_max, grid.dtype
        )
        return boundary.quantize_per_tensor(
            floats, float(q.scale), int(q.zero_point), q.quant_min, q.quant_max, q.dtype
        )

    def forward(self, qx: torch.Tensor, added: torch.Tensor | None = None) -> torch.Tensor:
        """Run the kernel on ``qx`` (uint8, any leading shape); plus ``added`` when it
        absorbed an add (:class:`fxquant.lowering.AddInput`)."""
        # the arguments after qx never change: built once
        tail = self._tail
        if tail is None:
            tail = self._tail = (
                self.x_scale, self.x_zero_point, self._weight(qx), self.weight_scale,
                self.weight_zero_point, self.bias, self.out_scale, self.out_zero_point,
                self.out_dtype, self.post_op, self.post_op_args, self.post_op_algorithm,
            )  # fmt: skip
        result: torch.Tensor = _LINEAR_OP(qx, *tail)
        if self.out_clamp is not None:
            result.clamp_(*self.out_clamp)
        if self.requantize is not None:
            result = self._requantized(result)
        if added is None:
            return result
        return _add(result, added)


class DynamicQLinear(QLinear):
    """Dynamic int8 linear: the float input is quantized per call, the output is float.

    The input qparams are those ``fxquant.numerics.qdq.choose_qparams_per_tensor`` picks
    for the input's range, as in the reference model, computed from its
    ``amin`` and ``amax`` as Python numbers (``fxquant.numerics.qdq.qparams_for_range``: no
    custom-op dispatch, no 0-d tensors). A float GELU after it runs as
    oneDNN's ``gelu`` post op. Dynamic linears that read the same input (a
    transformer's query, key and value) merge into one
    :class:`SharedInputDynamicQLinear`, which quantizes that input once.

    ``split``: for a CPU without VNNI, where oneDNN's u8 x s8 products saturate unless
    the weights stay within +-64 or the inputs within 7 bits (``fxquant.lowering.kernels.cpu``),
    an 8-bit input ``q`` runs as two exact GEMMs on its 7-bit high part and its lowest
    bit (``q = 2 * (q >> 1) + (q & 1)``), summed in float: the reference's numerics at
    2-3.3x the one-GEMM time, 1.1-1.3x faster than a float32 linear (BERT-base sizes,
    one AVX2 thread). The x86 and onednn defaults there (7-bit weights) run one GEMM.

    Example:
        >>> x = QParams(torch.uint8, 0, 255, is_dynamic=True)
        >>> w = torch.ones(2, 3, dtype=torch.int8)
        >>> kernel = DynamicQLinear(w, torch.full((2,), 0.5), None, x)
        >>> kernel(torch.ones(1, 3)).shape
        torch.Size([1, 2])
    """

    def __init__(  # one argument per kernel parameter
        self,
        weight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        x: QParams,
        *,
        split: bool = False,
    ) -> None:
        static = QParams(x.dtype, x.quant_min, x.quant_max, scale=1.0, zero_point=0)
        super().__init__(weight, scale, bias, static, None)
        self.quant_min, self.quant_max, self.dtype = x.quant_min, x.quant_max, x.dtype
        self.split = split and x.dtype == torch.uint8 and x.quant_max > 127

    def absorb(self, step: object) -> bool:
        """A float GELU after the kernel runs as its ``gelu`` post op; a float add after
        that is added in place on the output (:class:`fxquant.lowering.AddInput`)."""
        if self.adds_input:
            return False
        if isinstance(step, AddInput):
            self.adds_input = True
            return True
        if not isinstance(step, nn.GELU) or self.post_op != "none":
            return False
        self.post_op, self.post_op_algorithm = "gelu", step.approximate
        return True

    def merge(self, others: list[nn.Module]) -> nn.Module | None:
        """One module for dynamic linears that read this one's input: quantized once.

        ``None`` unless every other is a :class:`DynamicQLinear` quantizing to the
        same integer range (see ``LoweringRule``'s siblings).
        """
        kernels = [self, *others]
        range_ = (self.quant_min, self.quant_max, self.dtype)
        if not all(
            isinstance(k, DynamicQLinear) and (k.quant_min, k.quant_max, k.dtype) == range_
            for k in kernels
        ):
            return None
        return SharedInputDynamicQLinear(kernels)  # type: ignore[arg-type]  # checked above

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
        """``x`` quantized with qparams chosen from its range: (integers, scale, zero point)."""
        x = x.float()
        # amin + amax: 0.6x the time of torch 2.13's aminmax on CPU, the same exact values
        low, high = (0.0, 0.0) if x.numel() == 0 else (float(x.amin()), float(x.amax()))
        scale, zero_point = qdq.qparams_for_range(low, high, self.quant_min, self.quant_max)
        qx = boundary.quantize_per_tensor(
            x, scale, zero_point, self.quant_min, self.quant_max, self.dtype
        )
        return qx, scale, zero_point

    def run(self, qx: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
        """The int8 kernel on an input already quantized with (``scale``, ``zero_point``)."""
        if self.split:
            return self._run_split(qx, scale, zero_point)
        result: torch.Tensor = _LINEAR_OP(
            qx, scale, zero_point, self._weight(qx), self.weight_scale, self.weight_zero_point,
            self.bias, 1.0, 0, torch.float32, self.post_op, [], self.post_op_algorithm,
        )  # fmt: skip
        return result

    def _run_split(self, qx: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
        # (q - z) = 2 * ((q >> 1) - z // 2) + ((q & 1) - z % 2): both GEMMs' inputs fit 7 bits
        high_zero_point, low_zero_point = divmod(zero_point, 2)
        weight = (self._weight(qx), self.weight_scale, self.weight_zero_point)
        result: torch.Tensor = _LINEAR_OP(
            qx >> 1, 2.0 * scale, high_zero_point, *weight, self.bias,
            1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        low: torch.Tensor = _LINEAR_OP(
            qx & 1, scale, low_zero_point, *weight, None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip
        result.add_(low)
        if self.post_op == "gelu":
            result = F.gelu(result, approximate=self.post_op_algorithm or "none")
        return result

    def forward(self, x: torch.Tensor, added: torch.Tensor | None = None) -> torch.Tensor:
        """Quantize ``x`` with qparams chosen from its range, then run the int8 kernel (plus
        ``added`` when it absorbed an add)."""
        result = self.run(*self.quantize_input(x))
        return result if added is None else _add(result, added)


class SharedInputDynamicQLinear(nn.Module):
    """Dynamic linears that read one float input: it is quantized once, each runs its GEMM.

    A BERT layer's query, key and value: three range searches and quantize
    passes become one. The GEMMs stay separate: one merged GEMM with float
    output (N = 2304) runs 1.5x slower at batch 8 in oneDNN (bench_kernels.py).

    Example:
        >>> x = QParams(torch.uint8, 0, 255, is_dynamic=True)
        >>> w = torch.ones(2, 3, dtype=torch.int8)
        >>> one, two = (DynamicQLinear(w, torch.full((2,), s), None, x) for s in (0.5, 1.0))
        >>> [y.round(decimals=4).tolist() for y in one.merge([two])(torch.ones(1, 3))]
        [[[1.5, 1.5]], [[3.0, 3.0]]]
    """

    def __init__(self, kernels: list[DynamicQLinear]) -> None:
        super().__init__()
        self.kernels = nn.ModuleList(kernels)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each kernel's float output, in order."""
        first: DynamicQLinear = self.kernels[0]  # type: ignore[assignment]  # built from them
        qx, scale, zero_point = first.quantize_input(x)
        return tuple(kernel.run(qx, scale, zero_point) for kernel in self.kernels)


class Fp16Linear(nn.Module):
    """Linear with a float16 weight: float in, float out (``onednn.linear_dynamic_fp16``).

    Example:
        >>> kernel = Fp16Linear(torch.ones(2, 3), None)
        >>> kernel(torch.ones(1, 3))
        tensor([[3., 3.]])
    """

    _packed: torch.Tensor | None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        # contiguous: as for the int8 weights (symmetric_weight), prepack ignores strides
        weight = weight.detach().to(torch.float16, memory_format=torch.contiguous_format)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self._packed = None

    __getstate__ = _Packed.__getstate__

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        # its own method: _Packed's calls super() for _Packed, which this class is not
        # (load_state_dict raised TypeError; found by `fxquant check x86`)
        nn.Module._load_from_state_dict(self, *args, **kwargs)
        self._packed = None  # a new weight: pack again on the next call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the fp16-weight kernel on the float ``x``."""
        if self._packed is None:
            self._packed = _ONEDNN.linear_prepack_fp16(self.weight.float(), None)
        result: torch.Tensor = _ONEDNN.linear_dynamic_fp16(x, self._packed, self.bias)
        return result


def explicit_padding(conv: Any) -> list[int] | str:
    """``conv``'s padding as oneDNN's conv takes it, or why it cannot
    (:func:`fxquant.lowering.kernels.cpu.symmetric_zero_padding`).

    Example:
        >>> explicit_padding(nn.Conv2d(1, 1, 3, padding="same", dilation=2))
        [2, 2]
        >>> explicit_padding(nn.Conv1d(1, 1, 2, padding="same"))[:22]
        "padding='same' with ke"
    """
    return symmetric_zero_padding(conv, "oneDNN's conv")


class QConv(_Packed):
    """Static int8 conv 1d/2d/3d (+ relu), optionally adding a uint8 tensor (``"sum"``).

    Args:
        weight: int8 ``[out, in / groups, *kernel]``.
        scale: float32 per-output-channel weight scales.
        bias: float bias or ``None``.
        conv: the float (or reference) conv module: stride, padding, dilation, groups.
        qparams: ``(x, out)``, or ``(x, out, accumulate)`` for conv + add: the added
            tensor's qparams; ``out`` ``None`` gives a float output.
        relu: apply relu after the (conv + add).

    Example:
        >>> x = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)
        >>> conv = nn.Conv2d(1, 1, 1, bias=False)
        >>> w = torch.ones(1, 1, 1, 1, dtype=torch.int8)
        >>> kernel = QConv(w, torch.ones(1), None, conv, (x, x))
        >>> int(kernel(torch.full((1, 1, 2, 2), 7, dtype=torch.uint8))[0, 0, 0, 0])
        7
    """

    def __init__(  # one argument per kernel parameter
        self,
        weight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        conv: nn.Module,
        qparams: tuple[QParams, QParams | None] | tuple[QParams, QParams | None, QParams],
        *,
        relu: bool = False,
    ) -> None:
        super().__init__(weight, scale, bias)
        x, out = qparams[0], qparams[1]
        assert x.scale is not None  # static input
        assert x.zero_point is not None
        self.x_scale, self.x_zero_point = float(x.scale), int(x.zero_point)
        self.out_scale, self.out_zero_point, self.out_dtype = _out_args(out)
        self.accumulate = None if len(qparams) < 3 else _out_args(qparams[2])
        self.dims = weight.dim() - 2
        padding = explicit_padding(conv)
        if isinstance(padding, str):
            msg = f"QConv: {padding}"  # build_conv declines such a conv first
            raise ValueError(msg)
        self.geometry = (
            list(conv.stride), padding, list(conv.dilation), int(conv.groups)  # type: ignore[arg-type]  # conv attributes are tuples
        )  # fmt: skip
        # oneDNN's int8 conv3d has no relu post op: clamp at the output zero point instead
        self.unary = "relu" if relu and self.dims != 3 else "none"
        self.unary_args: list[float] = []
        # integers clamped after the kernel: conv3d's relu, a 7-bit output without a post op
        # (only the 2-d conv takes a hardtanh one)
        narrow = _narrow_range(out)
        self.clamp: tuple[int, int | None] | None = None
        if out is not None and narrow is not None and self.dims == 2 and len(qparams) < 3:
            self.unary_args = _range_clamp(out, self.unary, [])
            self.unary = "hardtanh"  # a 7-bit output clamped by the kernel's post op
        elif narrow is not None or (relu and self.dims == 3):
            low, high = narrow or (0, None)  # no upper bound: full range, or a float output
            self.clamp = (max(low, self.out_zero_point) if relu else low, high)
        # set by a lowering rule that knows the added tensor has no later reader
        self.reuse_accumulate = False

    def take_post_op(self, unary: str, args: list[float]) -> bool:
        """Run ``unary`` (``hardtanh`` with its real bounds, ``hardswish``, ``swish``) on the
        conv's real output before quantizing it: x86's conv + activation observed after the
        activation. Only a 2-d conv without an add takes one; a 7-bit output's range clamp
        already there takes a ``hardtanh`` (within it) and nothing else: False then.

        Example:
            >>> x = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)
            >>> w = torch.ones(1, 1, 1, 1, dtype=torch.int8)
            >>> kernel = QConv(w, torch.ones(1), None, nn.Conv2d(1, 1, 1), (x, x))
            >>> kernel.take_post_op("hardtanh", [0.0, 0.6])
            True
            >>> int(kernel(torch.full((1, 1, 2, 2), 9, dtype=torch.uint8))[0, 0, 0, 0])
            6
        """
        if self.dims != 2 or self.accumulate is not None:
            msg = f"QConv.take_post_op({unary!r}): only a 2-d conv without an add takes one"
            raise ValueError(msg)
        if self.unary == "hardtanh" and unary == "hardtanh":  # within a 7-bit output's range
            args = [max(args[0], self.unary_args[0]), min(args[1], self.unary_args[1])]
        elif self.unary != "none":
            return False
        self.unary, self.unary_args = unary, [float(a) for a in args]
        return True

    def _weight(self, qx: torch.Tensor) -> torch.Tensor:
        if self._packed is None:
            # packed for the first input's shape: without it oneDNN reorders the weight on
            # every call (1x1 conv 1024->256 at 14x14: 398 vs 271 us); other shapes still run
            stride, padding, dilation, groups = self.geometry
            self._packed = _ONEDNN.qconv_prepack(
                self.weight, self.weight_scale, self.x_scale, self.x_zero_point,
                stride, padding, dilation, groups, list(qx.shape),
            )  # fmt: skip
        return self._packed

    def _plain_tail(self, qx: torch.Tensor) -> tuple[Any, ...]:
        self._tail = (
            self.x_scale, self.x_zero_point, self._weight(qx), self.weight_scale,
            self.weight_zero_point, self.bias, *self.geometry, self.out_scale,
            self.out_zero_point, self.out_dtype, self.unary, self.unary_args, "",
        )  # fmt: skip
        return self._tail

    def absorb(self, kernel: object) -> bool:
        """Take over a relu6 / hardtanh clamp that reads only this conv's integer output
        (MobileNetV2: conv -> relu6), for 2-d convs without a fused add."""
        if self.dims != 2 or self.accumulate is not None or self.out_dtype is not None:
            return False
        bounds = _hardtanh_args(
            kernel, self.out_scale, self.out_zero_point, self.unary, self.unary_args
        )
        if bounds is None or self.clamp is not None:
            return False
        self.unary, self.unary_args, self._tail = "hardtanh", bounds, None
        return True

    def _output_shape(self, qx: torch.Tensor) -> torch.Size:
        """The conv's output shape for input ``qx`` (what the added tensor must have)."""
        stride, padding, dilation, _ = self.geometry
        kernel = self.weight.shape[2:]
        spatial = [
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, p, d, k, s in zip(
                qx.shape[2:], padding, dilation, kernel, stride, strict=True
            )
        ]
        return torch.Size([qx.shape[0], self.weight.shape[0], *spatial])

    def forward(self, qx: torch.Tensor, accumulate: torch.Tensor | None = None) -> torch.Tensor:
        """Run the conv on ``qx`` (uint8); add ``accumulate`` (uint8) when fused with add."""
        if self.dims == 2:  # only 2-d convs take channels_last
            qx = qx.contiguous(memory_format=torch.channels_last)
        if self.accumulate is None or accumulate is None:
            # the arguments after qx never change: built once (a MobileNetV2 makes 53 calls)
            tail = self._tail if self._tail is not None else self._plain_tail(qx)
            result: torch.Tensor = _CONV_OPS[self.dims - 1](qx, *tail)
            return result if self.clamp is None else result.clamp_(*self.clamp)
        head = (qx, self.x_scale, self.x_zero_point, self._weight(qx), self.weight_scale,
                self.weight_zero_point)  # fmt: skip
        shape = self._output_shape(qx)
        if accumulate.shape != shape:
            # conv(x) + b with b broadcast (a scalar, a bias-like [C, 1, 1]): the "sum" post
            # op takes the output's shape, and expanding the integers is exact (before: the
            # kernel failed on a 0-d tensor: "required rank 4 tensor to use channels_last")
            accumulate = accumulate.expand(shape)
        # the kernel writes into its accumulator: a copy unless nothing reads it afterwards
        accumulated = accumulate.contiguous(memory_format=torch.channels_last)
        if not self.reuse_accumulate or accumulated.data_ptr() != accumulate.data_ptr():
            accumulated = accumulated.clone(memory_format=torch.channels_last)
        accumulate_scale, accumulate_zero_point, _ = self.accumulate
        result = _CONV_BINARY(
            *head, accumulated, self.bias, *self.geometry, self.out_scale,
            self.out_zero_point, self.out_dtype, accumulate_scale, accumulate_zero_point,
            "sum", 1.0, self.unary, [], "",
        )  # fmt: skip
        return result if self.clamp is None else result.clamp_(*self.clamp)


class QAdd(nn.Module):
    """``a + b`` (+ relu) of two quantized tensors, requantized to the output's qparams.

    Computed as ``round((qa - za) * sa / so + (qb - zb) * sb / so) + zo`` in float32,
    which is within one output step of the reference and correct over the whole
    uint8 range (``torch.ops.onednn.qadd`` is not, for values >= 128, in torch 2.13).

    Example:
        >>> q = QParams(torch.uint8, 0, 255, scale=0.5, zero_point=10)
        >>> add = QAdd(q, q, q)
        >>> seven = torch.full((2,), 17, dtype=torch.uint8)  # (17 - 10) * 0.5 = 3.5
        >>> add(seven, seven).tolist()  # 7.0 -> 14 + 10
        [24, 24]
    """

    def __init__(self, a: QParams, b: QParams, out: QParams, *, relu: bool = False) -> None:
        super().__init__()
        for q in (a, b, out):
            assert q.scale is not None  # static qparams
            assert q.zero_point is not None
        so = float(out.scale)  # type: ignore[arg-type]  # checked above
        sa, sb = float(a.scale) / so, float(b.scale) / so  # type: ignore[arg-type]  # checked above
        za, zb, zo = float(a.zero_point), float(b.zero_point), float(out.zero_point)  # type: ignore[arg-type]  # checked above
        # y = qa * sa + qb * sb + offset: three passes over the data, then round and clamp
        self.scales = (sa, sb)
        self.offset = zo - za * sa - zb * sb
        low = int(zo) if relu else out.quant_min
        self.out = (low, out.quant_max, out.dtype)

    def forward(self, qa: torch.Tensor, qb: torch.Tensor) -> torch.Tensor:
        """Add the integers of ``qa`` and ``qb`` as the real numbers they stand for."""
        low, high, dtype = self.out
        y = torch.mul(qa, self.scales[0]).add_(qb, alpha=self.scales[1])
        y.add_(self.offset).round_()
        return y.clamp_(low, high).to(dtype)
