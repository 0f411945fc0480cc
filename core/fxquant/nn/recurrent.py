"""Reference dynamic int8 recurrent modules: LSTM, GRU and the LSTM / GRU / RNN cells.

What ``convert_to_reference_fx`` makes of an ``nn.LSTM`` (or ``nn.GRU``, a cell)
under a dynamic qconfig (``default_dynamic_qconfig``). Each keeps the float
module's parameters and adds one :class:`WeightQParams` per weight
(``weight_ih_l0``, ``weight_hh_l0_reverse``...); its forward computes as the
engines' dynamic recurrent kernels do (``torch.ops.aten.quantized_lstm``,
``quantized::quantized_lstm_cell_dynamic``...), with float arithmetic on
quantize -> dequantized values::

    layer input x (the whole sequence)   ih = linear(dq(q(x)), dq(q(W_ih))) + b_ih   one
                                                          dynamic quantization for all steps
    each step t                          hh = linear(dq(q(h)), dq(q(W_hh))) + b_hh   h
                                                          quantized dynamically at each step
                                         gates from ih[t] + hh, as the float cell does

``q`` of an activation is dynamic: scale and zero point chosen from the
tensor's min and max (``fxquant.numerics.qdq.choose_qparams_per_tensor``) over the
activation range ``activation_quant_min..activation_quant_max`` (0..255, or
0..127 for 7-bit activations, torch's ``reduce_range``). A weight whose
qparams say float (``{"qscheme": None, ...}``) is used as it is. Only integer
tensors of plain dtypes (``uint8``, ``int8``) are made, never ``torch.qint8``.

fp16 weights (``float16_dynamic_qconfig``) are rounded to fp16, with float activations.
An LSTM's ``proj_size`` projection (``weight_hr``) is one more dynamic linear. The engine
kernels take neither (their lowering rules decline them, with the reason); a
``PackedSequence`` input is refused (pad it, or keep the module float).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fxquant import dtypes
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.nn.float_twin import FloatTwin, rebuilt
from fxquant.numerics import qdq
from fxquant.numerics.saved_shapes import adopt_saved_buffers

__all__ = [
    "GRU",
    "LSTM",
    "GRUCell",
    "LSTMCell",
    "RNNCell",
    "RecurrentReference",
    "WeightQParams",
    "dynamic_linear",
    "weight_names",
]


class WeightQParams(nn.Module):
    """One weight's qparams (buffers ``scale``, ``zero_point``), and its quantize step.

    Args:
        qparams: the ``from_float`` dict of one weight: ``qscheme`` (per tensor or per
            channel, affine or symmetric; ``None`` keeps the weight float), ``dtype``,
            ``scale``, ``zero_point``, ``axis`` (per channel), ``quant_min``/``quant_max``.

    Example:
        >>> q = WeightQParams({"qscheme": torch.per_tensor_affine, "dtype": torch.qint8,
        ...                    "scale": 0.5, "zero_point": 0})
        >>> q.quantize(torch.tensor([1.0, -3.2])).tolist()
        [2, -6]
    """

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, qparams: Mapping[str, Any]) -> None:
        super().__init__()
        if not isinstance(qparams, Mapping):
            msg = f"weight qparams must be a dict, got {qparams!r}; see fxquant.nn.reference"
            raise ConfigTypeError(msg)
        dtype = qparams.get("dtype", torch.float32)
        if not isinstance(dtype, torch.dtype):
            msg = f"weight qparams 'dtype' must be a torch.dtype, got {dtype!r}"
            raise ConfigTypeError(msg)
        qscheme = qparams.get("qscheme")
        self.dtype = dtype
        self.quantized = qscheme is not None and dtypes.is_quantized_dtype(dtype)
        self.qscheme = None if qscheme is None else dtypes.qscheme_name(qscheme)
        low, high = dtypes.quant_range(dtype) if self.quantized else (0, 0)
        self.quant_min = int(qparams.get("quant_min", low))
        self.quant_max = int(qparams.get("quant_max", high))
        if self.quantized and self.qscheme == "per_channel_affine_float_qparams":
            msg = (
                "recurrent weights take integer zero points, got the qscheme "
                "per_channel_affine_float_qparams; use per_channel_affine"
            )
            raise ConfigError(msg)
        per_channel = self.quantized and str(self.qscheme).startswith("per_channel")
        self.axis: int | None = int(qparams.get("axis", 0)) if per_channel else None
        scale = torch.as_tensor(qparams.get("scale", 1.0), dtype=torch.float32)
        zero_point = torch.as_tensor(qparams.get("zero_point", 0)).to(torch.int32)
        self.register_buffer("scale", scale.detach().clone())
        self.register_buffer("zero_point", zero_point.detach().clone())

    def _qdq_arguments(self) -> tuple[Any, ...]:
        """The q/dq ops' arguments after the tensor (per channel ones carry the axis)."""
        axis = () if self.axis is None else (self.axis,)
        storage = dtypes.canonical_dtype(self.dtype)
        return (self.scale, self.zero_point, *axis, self.quant_min, self.quant_max, storage)

    def quantize(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight's integers as a plain ``int8``/``uint8`` tensor (float: the weight)."""
        if not self.quantized:
            return weight
        quantize = qdq.quantize_per_tensor if self.axis is None else qdq.quantize_per_channel
        return quantize(weight, *self._qdq_arguments())

    @property
    def is_half(self) -> bool:
        """An fp16 / bf16 weight (``{"qscheme": None, "dtype": torch.float16}``)."""
        return not self.quantized and self.dtype in (torch.float16, torch.bfloat16)

    def fake_quantize(self, weight: torch.Tensor) -> torch.Tensor:
        """quantize -> dequantize: the weight as the integer kernel computes with it
        (fp16 / bf16: rounded to that dtype and back)."""
        if self.is_half:
            return weight.to(self.dtype).to(weight.dtype)
        if not self.quantized:
            return weight
        dequantize = qdq.dequantize_per_tensor if self.axis is None else qdq.dequantize_per_channel
        return dequantize(self.quantize(weight), *self._qdq_arguments(), out_dtype=weight.dtype)

    def as_dict(self) -> dict[str, Any]:
        """The qparams in the ``from_float`` dict form (what lowering reads)."""
        params: dict[str, Any] = {
            "qscheme": None if self.qscheme is None else dtypes.qscheme_object(self.qscheme),
            "dtype": self.dtype,
            "scale": self.scale,
            "zero_point": self.zero_point,
            "quant_min": self.quant_min,
            "quant_max": self.quant_max,
        }
        if self.axis is not None:
            params["axis"] = self.axis
        return params

    def get_extra_state(self) -> dict[str, Any]:
        """The non-tensor qparams, saved in ``state_dict``."""
        return {
            "qscheme": self.qscheme,
            "dtype": dtypes.dtype_name(self.dtype),
            "quant_min": self.quant_min,
            "quant_max": self.quant_max,
            "axis": self.axis,
        }

    def set_extra_state(self, state: Any) -> None:
        """Restore what :meth:`get_extra_state` saved."""
        self.qscheme, self.axis = state["qscheme"], state["axis"]
        self.dtype = dtypes.dtype_from_name(state["dtype"])
        self.quant_min, self.quant_max = int(state["quant_min"]), int(state["quant_max"])
        self.quantized = self.qscheme is not None and dtypes.is_quantized_dtype(self.dtype)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], *rest: Any
    ) -> None:
        # per-channel qparams load into a per-tensor module (and back)
        adopt_saved_buffers(self, state_dict, prefix, ("scale", "zero_point"))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *rest)

    def extra_repr(self) -> str:
        """qscheme, dtype and range."""
        return f"qscheme={self.qscheme}, dtype={self.dtype}, {self.quant_min}..{self.quant_max}"


def weight_names(module: nn.Module) -> list[str]:
    """The names of a recurrent module's weights (not biases), in torch's order.

    Example:
        >>> weight_names(nn.LSTM(2, 3, bidirectional=True))
        ['weight_ih_l0', 'weight_hh_l0', 'weight_ih_l0_reverse', 'weight_hh_l0_reverse']
        >>> weight_names(nn.GRUCell(2, 3))
        ['weight_ih', 'weight_hh']
    """
    if isinstance(module, nn.RNNBase):
        return [n for n in module._flat_weights_names if n.startswith("weight")]
    return ["weight_ih", "weight_hh"]


def dynamic_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: tuple[int, int]
) -> torch.Tensor:
    """``F.linear`` on ``x`` quantized dynamically (one scale for the tensor) -> dequantized.

    ``weight`` is already fake-quantized. ``activation`` is the integer range.

    Example:
        >>> dynamic_linear(torch.tensor([[0.0, 2.0]]), torch.eye(2), None, (0, 255)).tolist()
        [[0.0, 2.0]]
    """
    low, high = activation
    scale, zero_point = qdq.choose_qparams_per_tensor(x, low, high, torch.uint8)
    q = qdq.quantize_per_tensor(x, scale, zero_point, low, high, torch.uint8)
    xq = qdq.dequantize_per_tensor(q, scale, zero_point, low, high, torch.uint8, out_dtype=x.dtype)
    return F.linear(xq, weight, bias)


State = tuple[torch.Tensor, ...]  # (h,) or, for an LSTM, (h, c)


class RecurrentReference(FloatTwin, nn.Module):
    """Mixin of the reference recurrent modules: per-weight qparams, dynamic activations.

    Every module runs one loop (``_direction``): ``ih`` for the whole input at once (one
    dynamic scale), then per step ``hh`` of the state and the module's ``_step`` (its
    gates). A cell runs it over a one-step sequence, with the weights' names unsuffixed.

    Attributes:
        weight_qparams: ``nn.ModuleDict`` of :class:`WeightQParams`, by weight name.
        activation_quant_min, activation_quant_max: the dynamic activation range.
    """

    weight_qparams: nn.ModuleDict
    activation_quant_min: int
    activation_quant_max: int
    _step: Callable[[torch.Tensor, torch.Tensor, State], State]
    # lowering drops a reference module its kernels fully replaced (and its float weights)
    _IS_REFERENCE: ClassVar[bool] = True

    def __init__(
        self,
        *args: Any,
        weight_qparams_dict: Mapping[str, Any] | None = None,
        activation: tuple[int, int] = (0, 255),
        **kwargs: Any,
    ) -> None:
        self._float_class.__init__(self, *args, **kwargs)
        given = dict(weight_qparams_dict or {})
        names = weight_names(self)
        unknown = sorted(set(given) - set(names) - {"is_decomposed"})
        if unknown:
            msg = f"weight_qparams_dict has unknown keys {unknown}; the weights are {names}"
            raise ConfigError(msg)
        default = {"qscheme": None, "dtype": torch.float32}
        self.weight_qparams = nn.ModuleDict(
            {name: WeightQParams(given.get(name, default)) for name in names}
        )
        low, high = (int(v) for v in activation)
        if not 0 <= low < high <= 255:  # uint8
            msg = f"activation range must be within 0..255 (uint8), got {low}..{high}"
            raise ConfigError(msg)
        self.activation_quant_min, self.activation_quant_max = low, high

    def get_extra_state(self) -> dict[str, Any]:
        """The dynamic activation range, saved in ``state_dict``."""
        return {"activation": [self.activation_quant_min, self.activation_quant_max]}

    def set_extra_state(self, state: Any) -> None:
        """Restore what :meth:`get_extra_state` saved."""
        self.activation_quant_min, self.activation_quant_max = (int(v) for v in state["activation"])

    @property
    def activation_range(self) -> tuple[int, int]:
        """``(activation_quant_min, activation_quant_max)``."""
        return self.activation_quant_min, self.activation_quant_max

    def _qparams(self, name: str) -> WeightQParams:
        qparams = self.weight_qparams[name]
        assert isinstance(qparams, WeightQParams)  # built by __init__
        return qparams

    def get_weight(self, name: str) -> torch.Tensor:
        """The weight ``name`` after quantize -> dequantize."""
        return self._qparams(name).fake_quantize(getattr(self, name))

    def get_quantized_weight(self, name: str) -> torch.Tensor:
        """The weight ``name`` as a plain integer tensor (float when not quantized)."""
        return self._qparams(name).quantize(getattr(self, name))

    def get_weight_qparams(self, name: str) -> dict[str, Any]:
        """The ``from_float`` qparams dict of the weight ``name``."""
        return self._qparams(name).as_dict()

    def _linear(self, x: torch.Tensor, suffix: str, kind: str) -> torch.Tensor:
        bias = getattr(self, f"bias_{kind}{suffix}", None) if self.bias and kind != "hr" else None
        name = f"weight_{kind}{suffix}"
        weight = self.get_weight(name)
        if not self._qparams(name).quantized:  # fp16 (or float) weights: float activations
            return F.linear(x, weight, bias)
        return dynamic_linear(x, weight, bias, self.activation_range)

    def _direction(
        self, x: torch.Tensor, state: State, suffix: str, reverse: bool
    ) -> tuple[torch.Tensor, State]:
        """Run over ``x`` (steps first) from ``state``; returns the outputs, stacked, and the
        last state."""
        ih = self._linear(x, suffix, "ih")
        steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
        outputs: list[torch.Tensor] = [x.new_empty(0)] * x.shape[0]
        for t in steps:
            state = self._step(ih[t], self._linear(state[0], suffix, "hh"), state)
            if getattr(self, "proj_size", 0):
                state = (self._linear(state[0], suffix, "hr"), *state[1:])
            outputs[t] = state[0]
        return torch.stack(outputs), state

    def _get_name(self) -> str:
        return f"Reference{type(self).__name__}"

    @classmethod
    def from_float(
        cls,
        mod: nn.Module,
        weight_qparams_dict: Mapping[str, Any] | None = None,
        activation: tuple[int, int] = (0, 255),
    ) -> Any:
        """The reference module of float ``mod`` (its parameters copied)."""
        if type(mod) is not cls._float_class and not isinstance(mod, cls):
            msg = (
                f"reference {cls.__name__}.from_float expects an nn.{cls._float_class.__name__}, "
                f"got {type(mod).__name__}"
            )
            raise ConfigTypeError(msg)
        names = [name for name, _ in mod.named_parameters(recurse=False)]
        qparams = {"weight_qparams_dict": weight_qparams_dict, "activation": activation}
        return rebuilt(cls, mod, names, **qparams)


def _lstm_step(ih: torch.Tensor, hh: torch.Tensor, state: State) -> State:
    i, f, g, o = (ih + hh).chunk(4, -1)
    cy = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(cy), cy


def _gru_step(ih: torch.Tensor, hh: torch.Tensor, state: State) -> State:
    i_r, i_z, i_n = ih.chunk(3, -1)
    h_r, h_z, h_n = hh.chunk(3, -1)
    reset = torch.sigmoid(h_r + i_r)
    update = torch.sigmoid(h_z + i_z)
    new = torch.tanh(i_n + h_n * reset)
    return ((state[0] - new) * update + new,)


class _Sequence(RecurrentReference, nn.RNNBase):
    """LSTM and GRU: layers x directions over the sequence, as torch's kernels loop."""

    def _run(self, x: object, hx: State | None) -> tuple[torch.Tensor, State]:
        if isinstance(x, nn.utils.rnn.PackedSequence):
            msg = (
                f"reference {type(self).__name__} takes a padded tensor, got a PackedSequence; "
                "pad it (nn.utils.rnn.pad_packed_sequence) or keep this module float"
            )
            raise TypeError(msg)
        assert isinstance(x, torch.Tensor)
        batched = x.dim() == 3  # (T, B, I); 2-d: one unbatched sequence
        if not batched:
            x = x.unsqueeze(1)
            hx = None if hx is None else tuple(h.unsqueeze(1) for h in hx)
        elif self.batch_first:
            x = x.transpose(0, 1)
        directions = 2 if self.bidirectional else 1
        if hx is None:
            size = (self.num_layers * directions, x.shape[1])
            projected = getattr(self, "proj_size", 0) or self.hidden_size
            hx = (x.new_zeros(*size, projected), x.new_zeros(*size, self.hidden_size))
            hx = hx[: 2 if isinstance(self, nn.LSTM) else 1]
        lasts: list[State] = []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                state = tuple(h[layer * directions + direction] for h in hx)
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                out, last = self._direction(x, state, suffix, reverse=bool(direction))
                outputs.append(out)
                lasts.append(last)
            x = torch.cat(outputs, -1) if directions > 1 else outputs[0]
        hidden = tuple(torch.stack(final) for final in zip(*lasts, strict=True))
        if not batched:
            return x.squeeze(1), tuple(h.squeeze(1) for h in hidden)
        return (x.transpose(0, 1) if self.batch_first else x), hidden


class LSTM(_Sequence, nn.LSTM):
    """Reference dynamic int8 ``nn.LSTM`` (see the module docstring).

    Args:
        *args, **kwargs: those of ``nn.LSTM`` (no ``proj_size``).
        weight_qparams_dict: ``{weight name: qparams dict}`` (``weight_ih_l0``...).
        activation: the dynamic activation range, ``(0, 255)`` or ``(0, 127)``.

    Example:
        >>> lstm = nn.LSTM(4, 8)
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.qint8,
        ...            "scale": 0.01, "zero_point": 0}
        >>> ref = LSTM.from_float(lstm, {n: qparams for n in weight_names(lstm)})
        >>> out, (h, c) = ref(torch.randn(5, 2, 4))
        >>> out.shape, h.shape
        (torch.Size([5, 2, 8]), torch.Size([1, 2, 8]))
    """

    _step = staticmethod(_lstm_step)

    def forward(  # type: ignore[override]  # no PackedSequence
        self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``output, (h_n, c_n)`` as ``nn.LSTM`` returns them."""
        output, (h, c) = self._run(input, hx)
        return output, (h, c)


class GRU(_Sequence, nn.GRU):
    """Reference dynamic int8 ``nn.GRU`` (see the module docstring).

    Example:
        >>> gru = nn.GRU(4, 8, batch_first=True)
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.qint8,
        ...            "scale": 0.01, "zero_point": 0}
        >>> ref = GRU.from_float(gru, {n: qparams for n in weight_names(gru)})
        >>> ref(torch.randn(2, 5, 4))[0].shape
        torch.Size([2, 5, 8])
    """

    _step = staticmethod(_gru_step)

    def forward(  # type: ignore[override]  # no PackedSequence
        self, input: torch.Tensor, hx: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``output, h_n`` as ``nn.GRU`` returns them."""
        output, (h,) = self._run(input, None if hx is None else (hx,))
        return output, h


class LSTMCell(RecurrentReference, nn.LSTMCell):
    """Reference dynamic int8 ``nn.LSTMCell``: one step, ``linear_ih(x) + linear_hh(h)``,
    each quantized dynamically.

    Example:
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.qint8,
        ...            "scale": 0.01, "zero_point": 0}
        >>> both = {"weight_ih": qparams, "weight_hh": qparams}
        >>> ref = LSTMCell.from_float(nn.LSTMCell(4, 8), both)
        >>> [t.shape for t in ref(torch.randn(3, 4))]
        [torch.Size([3, 8]), torch.Size([3, 8])]
    """

    _step = staticmethod(_lstm_step)

    def forward(
        self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h_1, c_1)`` as ``nn.LSTMCell`` returns them."""
        if hx is None:
            zeros = input.new_zeros((*input.shape[:-1], self.hidden_size))
            hx = (zeros, zeros)
        _, (h, c) = self._direction(input[None], hx, "", reverse=False)
        return h, c


class _StateCell(RecurrentReference, nn.RNNCellBase):
    """The cells whose state is ``h`` alone (GRU, RNN).

    Example:
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.qint8,
        ...            "scale": 0.01, "zero_point": 0}
        >>> both = {"weight_ih": qparams, "weight_hh": qparams}
        >>> [cls.from_float(cls._float_class(4, 8), both)(torch.randn(3, 4)).shape
        ...  for cls in (GRUCell, RNNCell)]
        [torch.Size([3, 8]), torch.Size([3, 8])]
    """

    def forward(self, input: torch.Tensor, hx: torch.Tensor | None = None) -> torch.Tensor:
        """``h_1`` as the float cell returns it."""
        h = input.new_zeros((*input.shape[:-1], self.hidden_size)) if hx is None else hx
        _, (h,) = self._direction(input[None], (h,), "", reverse=False)
        return h


class GRUCell(_StateCell, nn.GRUCell):
    """Reference dynamic int8 ``nn.GRUCell`` (example: see ``_StateCell``)."""

    _step = staticmethod(_gru_step)


class RNNCell(_StateCell, nn.RNNCell):
    """Reference dynamic int8 ``nn.RNNCell``, tanh or relu (example: see ``_StateCell``)."""

    def _step(self, ih: torch.Tensor, hh: torch.Tensor, state: State) -> State:
        gates = ih + hh
        return (torch.tanh(gates) if self.nonlinearity == "tanh" else torch.relu(gates),)
