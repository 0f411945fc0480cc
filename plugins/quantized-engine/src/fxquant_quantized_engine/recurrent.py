"""Dynamic int8 LSTM, GRU and cells on a quantized engine's recurrent kernels.

A reference recurrent module (``fxquant.nn.recurrent``: float weights + one set of
qparams per weight, dynamic activation range) becomes one kernel module::

    reference.LSTM / GRU      -> QuantizedRecurrent       torch.quantized_lstm / quantized_gru
                                                           (use_dynamic: one packed linear per
                                                           weight, cell params per layer/direction)
    reference.LSTMCell / ...  -> QuantizedRecurrentCell   quantized::quantized_lstm_cell_dynamic,
                                                           gru_cell_dynamic, rnn_*_cell_dynamic

The weights are packed with ``quantized::linear_prepack`` on the kernel's engine (fbgemm,
qnnpack, x86 or onednn; the qint8 weight tensors exist only inside its ``EngineScope``), and
the ops quantize each linear's input dynamically as the reference does: the layer input
once for the whole sequence, the hidden state at every step. Within a few float roundings of
the reference (measured: 3e-8 on a 2-layer bidirectional LSTM).

The activation range is the qconfig's: 0..127 (``reduce_range``) or 0..255. The sequence ops
take either on fbgemm / x86 / onednn; the cell ops fix it (0..127 there, 0..255 on qnnpack),
so a cell on the other range runs as two ``quantized::linear_dynamic`` calls and the float gate
arithmetic. Declined, with the reason (the module stays in reference form):

- fp16 weights, and an LSTM's ``proj_size`` (torch's quantized LSTM op has no projection);
- a range other than 0..127 / 0..255, or 0..127 on qnnpack (its kernels ignore ``reduce_range``);
- 8-bit activations with weights beyond +-64 on CPUs without VNNI (fbgemm / oneDNN add pairs
  of u8 x s8 products in int16: ``fxquant.lowering.kernels.cpu``);
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from fxquant.lowering import Declined, LoweringMatch, LoweringRule, QParams
from fxquant.lowering.kernels import cpu
from fxquant.nn import recurrent
from torch import nn

from fxquant_quantized_engine.engine import _QINT8, _engine_id
from fxquant_quantized_engine.modules import _Packed, _quantized_op
from fxquant_quantized_engine.views import _run_on, weight_as_qint8

__all__ = [
    "QuantizedRecurrent",
    "QuantizedRecurrentCell",
    "recurrent_reason",
    "recurrent_rules",
]

_SEVEN_BITS, _EIGHT_BITS = (0, 127), (0, 255)

_LSTM = torch.ops.aten.quantized_lstm.input
_GRU = torch.ops.aten.quantized_gru.input


def _dynamic_lstm(*args: Any) -> Any:
    return _LSTM(*args, dtype=_QINT8, use_dynamic=True)


_LIBRARY = {"fbgemm": "FBGEMM", "x86": "FBGEMM", "onednn": "oneDNN", "qnnpack": "QNNPACK"}


def _hidden(states: tuple[Any, ...], pair: bool) -> Any:
    """The kernel's arguments after the input (the flow passes ``(h, c)`` flattened) as the
    op's ``hx``: ``None``, a tensor, or an ``(h, c)`` pair."""
    if not states or states[0] is None:
        return None
    if len(states) == 1 and isinstance(states[0], (tuple, list)):
        states = tuple(states[0])
    return tuple(states) if pair else states[0]


class _RecurrentWeights(_Packed):
    """The int8 weights (buffers ``w_NAME``, ``s_NAME``, ``z_NAME``) and float biases."""

    def __init__(self, engine: str, reference: Any) -> None:
        super().__init__(engine)
        self.names = recurrent.weight_names(reference)
        self.has_bias = bool(reference.bias)
        self.hidden_size = int(reference.hidden_size)
        self.activation_range = tuple(reference.activation_range)
        self.reduce_range = self.activation_range == _SEVEN_BITS
        for name in self.names:
            qparams = reference.get_weight_qparams(name)
            self.register_buffer(f"w_{name}", reference.get_quantized_weight(name).detach().clone())
            self.register_buffer(
                f"s_{name}", torch.as_tensor(qparams["scale"]).reshape(-1).double().clone()
            )
            self.register_buffer(
                f"z_{name}", torch.as_tensor(qparams["zero_point"]).reshape(-1).long().clone()
            )
            bias_name = name.replace("weight", "bias")
            bias = getattr(reference, bias_name, None) if self.has_bias else None
            rows = int(getattr(reference, name).shape[0])
            value = torch.zeros(rows) if bias is None else bias.detach().float().clone()
            self.register_buffer(f"b_{name}", value)

    def _packed_linear(self, name: str) -> Any:
        weight = weight_as_qint8(
            getattr(self, f"w_{name}"), getattr(self, f"s_{name}"), getattr(self, f"z_{name}")
        )
        return torch.ops.quantized.linear_prepack(weight, getattr(self, f"b_{name}"))

    def _bias(self, name: str) -> torch.Tensor:
        bias: torch.Tensor = getattr(self, f"b_{name}")
        return bias


class QuantizedRecurrent(_RecurrentWeights):
    """Dynamic int8 ``nn.LSTM`` / ``nn.GRU``: float in, float out, as the float module returns.

    Example:
        >>> from fxquant.nn import recurrent
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.01, "zero_point": 0}
        >>> lstm = nn.LSTM(4, 8, batch_first=True)
        >>> ref = recurrent.LSTM.from_float(lstm, dict.fromkeys(recurrent.weight_names(lstm),
        ...                                 qparams), activation=(0, 127))
        >>> kernel = QuantizedRecurrent("fbgemm", ref)
        >>> out, (h, c) = kernel(torch.randn(2, 5, 4))
        >>> out.shape, h.shape
        (torch.Size([2, 5, 8]), torch.Size([1, 2, 8]))
    """

    def __init__(self, engine: str, reference: Any) -> None:
        super().__init__(engine, reference)
        self.is_lstm = isinstance(reference, nn.LSTM)
        self.num_layers = int(reference.num_layers)
        self.bidirectional = bool(reference.bidirectional)
        self.batch_first = bool(reference.batch_first)

    def pack(self) -> Any:
        cells = []
        for index in range(0, len(self.names), 2):
            ih, hh = self.names[index], self.names[index + 1]
            cells.append(
                torch.ops.quantized.make_quantized_cell_params_dynamic(
                    self._packed_linear(ih),
                    self._packed_linear(hh),
                    self._bias(ih),
                    self._bias(hh),
                    self.reduce_range,
                )
            )
        return cells

    def bind(self) -> Callable[..., Any]:
        engine, params = _engine_id(self.engine), self.packed()
        # has_biases always: torch's quantized LSTM requires them, zeros stand in for none
        settings = (True, self.num_layers, 0.0, False, self.bidirectional)
        batch_first, is_lstm = self.batch_first, self.is_lstm
        layers = self.num_layers * (2 if self.bidirectional else 1)
        hidden_size = self.hidden_size

        def lstm(x: torch.Tensor, hx: Any) -> Any:
            out = _run_on(engine, _dynamic_lstm, x, hx, params, *settings, batch_first)
            return out[0], (out[1], out[2])

        def gru(x: torch.Tensor, hx: Any) -> Any:
            out = _run_on(engine, _GRU, x, hx, params, *settings, batch_first)
            return out[0], out[1]

        run = lstm if is_lstm else gru

        def call(x: torch.Tensor, *states: torch.Tensor) -> Any:
            if not isinstance(x, torch.Tensor):
                msg = (
                    f"the lowered {'LSTM' if is_lstm else 'GRU'} takes a padded tensor, got "
                    f"{type(x).__name__}; pad a PackedSequence (nn.utils.rnn."
                    "pad_packed_sequence) or keep this module float (qconfig None)"
                )
                raise TypeError(msg)
            hx = _hidden(states, is_lstm)
            batched = x.dim() == 3  # 2-d: one unbatched sequence
            if not batched:
                x = x.unsqueeze(0 if batch_first else 1)
                if hx is not None:
                    hx = tuple(h.unsqueeze(1) for h in hx) if is_lstm else hx.unsqueeze(1)
            if hx is None:
                zeros = x.new_zeros(layers, x.shape[0 if batch_first else 1], hidden_size)
                hx = (zeros, zeros) if is_lstm else zeros
            output, hidden = run(x, hx)
            if batched:
                return output, hidden
            output = output.squeeze(0 if batch_first else 1)
            if is_lstm:
                return output, (hidden[0].squeeze(1), hidden[1].squeeze(1))
            return output, hidden.squeeze(1)

        return call

    def forward(self, *values: Any) -> Any:
        """``output, h_n`` (GRU) or ``output, (h_n, c_n)`` (LSTM)."""
        return super().forward(*values)


_CELL_OPS = {
    "LSTMCell": "quantized_lstm_cell_dynamic",
    "GRUCell": "quantized_gru_cell_dynamic",
    "RNNCell_tanh": "quantized_rnn_tanh_cell_dynamic",
    "RNNCell_relu": "quantized_rnn_relu_cell_dynamic",
}


def _cell_kind(reference: Any) -> str:
    kind = type(reference).__name__
    if kind == "RNNCell":
        kind = f"RNNCell_{reference.nonlinearity}"
    return kind


def _cell_op_range(engine: str) -> tuple[int, int]:
    """The activation range the engine's cell ops quantize to (``reduce_range`` fixed)."""
    return _EIGHT_BITS if engine == "qnnpack" else _SEVEN_BITS


class QuantizedRecurrentCell(_RecurrentWeights):
    """Dynamic int8 ``nn.LSTMCell`` / ``nn.GRUCell`` / ``nn.RNNCell``: float in, float out.

    The engine's cell op where its fixed activation range is the reference's, else two
    ``quantized::linear_dynamic`` calls (``reduce_range`` as the reference) and the gates.

    Example:
        >>> from fxquant.nn import recurrent
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.01, "zero_point": 0}
        >>> cell = nn.GRUCell(4, 8)
        >>> ref = recurrent.GRUCell.from_float(cell, dict.fromkeys(["weight_ih", "weight_hh"],
        ...                                    qparams), activation=(0, 127))
        >>> QuantizedRecurrentCell("fbgemm", ref)(torch.randn(3, 4)).shape
        torch.Size([3, 8])
    """

    def __init__(self, engine: str, reference: Any) -> None:
        super().__init__(engine, reference)
        self.kind = _cell_kind(reference)
        self.native = self.activation_range == _cell_op_range(engine)

    def pack(self) -> Any:
        return self._packed_linear("weight_ih"), self._packed_linear("weight_hh")

    def bind(self) -> Callable[..., Any]:
        engine, (ih, hh) = _engine_id(self.engine), self.packed()
        b_ih, b_hh = self._bias("weight_ih"), self._bias("weight_hh")
        kind, hidden_size = self.kind, self.hidden_size

        def zeros(x: torch.Tensor) -> torch.Tensor:
            return x.new_zeros((*x.shape[:-1], hidden_size))

        if self.native:
            op = _quantized_op(_CELL_OPS[kind])

            def native(x: torch.Tensor, *states: torch.Tensor) -> Any:
                hx = _hidden(states, kind == "LSTMCell")
                if hx is None:
                    hx = (zeros(x), zeros(x)) if kind == "LSTMCell" else zeros(x)
                out = _run_on(engine, op, x, hx, ih, hh, b_ih, b_hh)
                return tuple(out) if kind == "LSTMCell" else out

            return native
        linear, reduce_range = _quantized_op("linear_dynamic"), self.reduce_range

        def gates(x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return (
                _run_on(engine, linear, x, ih, reduce_range),
                _run_on(engine, linear, h, hh, reduce_range),
            )

        def linears(x: torch.Tensor, *states: torch.Tensor) -> Any:
            hx = _hidden(states, kind == "LSTMCell")
            if kind == "LSTMCell":
                h, c = (zeros(x), zeros(x)) if hx is None else hx
                i, f, g, o = (lambda p: p[0] + p[1])(gates(x, h)).chunk(4, -1)
                cy = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                return torch.sigmoid(o) * torch.tanh(cy), cy
            h = zeros(x) if hx is None else hx
            gi, gh = gates(x, h)
            if kind == "GRUCell":
                i_r, i_z, i_n = gi.chunk(3, -1)
                h_r, h_z, h_n = gh.chunk(3, -1)
                reset, update = torch.sigmoid(h_r + i_r), torch.sigmoid(h_z + i_z)
                new = torch.tanh(i_n + h_n * reset)
                return (h - new) * update + new
            total = gi + gh
            return torch.tanh(total) if kind == "RNNCell_tanh" else torch.relu(total)

        return linears

    def forward(self, *values: Any) -> Any:
        """``h_1`` (GRU / RNN cell) or ``(h_1, c_1)`` (LSTM cell)."""
        return super().forward(*values)


def recurrent_reason(engine: str, reference: Any) -> str | None:
    """Why ``engine``'s kernels cannot run this reference recurrent module exactly, or None.

    Example:
        >>> from fxquant.nn import recurrent
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8,
        ...            "scale": 0.01, "zero_point": 0}
        >>> lstm = nn.LSTM(4, 8)
        >>> ref = recurrent.LSTM.from_float(lstm, dict.fromkeys(recurrent.weight_names(lstm),
        ...                                 qparams), activation=(0, 127))
        >>> recurrent_reason("qnnpack", ref).split(";")[0]
        "QNNPACK's dynamic kernels quantize activations to 0..255 (they ignore reduce_range)"
        >>> recurrent_reason("fbgemm", ref) is None
        True
    """
    library = _LIBRARY.get(engine, engine)
    proj_size = getattr(reference, "proj_size", 0)
    if proj_size:
        return (
            f"proj_size={proj_size}: torch's quantized LSTM op has no projection; "
            "keep proj_size=0 for an int8 kernel"
        )
    for name in recurrent.weight_names(reference):
        dtype = reference.get_weight_qparams(name).get("dtype")
        if dtype not in (torch.int8, _QINT8):
            return (
                f"{name} is {dtype}: the dynamic recurrent kernels lowered here take int8 "
                "weights (fp16 ones are not lowered); use default_dynamic_qconfig for int8"
            )
    low, high = reference.activation_range
    if (low, high) not in (_SEVEN_BITS, _EIGHT_BITS):
        return (
            f"{library}'s dynamic kernels quantize activations to 0..127 or 0..255, the "
            f"qconfig says {low}..{high}; use a dynamic activation observer with quant_min=0 "
            "and quant_max=127 or 255"
        )
    if engine == "qnnpack" and (low, high) == _SEVEN_BITS:
        return (
            f"{library}'s dynamic kernels quantize activations to 0..255 (they ignore "
            "reduce_range); the qconfig says 0..127: use quant_max=255 on qnnpack"
        )
    for name in recurrent.weight_names(reference):
        if engine == "qnnpack":
            continue  # QNNPACK widens every product before adding: no saturation
        x = QParams(torch.uint8, low, high, is_dynamic=True)
        reason = cpu.saturation_reason(library, reference.get_quantized_weight(name), x)
        if reason is not None:
            return f"{name}: {reason}; or 7-bit activations (quant_max=127)"
    return None


def build_recurrent(engine: str) -> Callable[[LoweringMatch], nn.Module | Declined | None]:
    """A rule builder for the reference recurrent modules on ``engine``.

    Example:
        >>> callable(build_recurrent("x86"))
        True
    """

    # one kernel per reference module: a cell stepped in a Python loop is one module called at
    # every step, and one packed copy of its weights stays in cache (20 copies of a 128x256
    # LSTMCell's weights ran 1.4x slower, measured, 1 thread)
    kernels: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()

    def build(match: LoweringMatch) -> nn.Module | Declined | None:
        reference = match.modules[-1]
        if reference is None or match.output is not None:
            return None
        kernel = kernels.get(reference)
        if kernel is not None:
            return kernel
        reason = recurrent_reason(engine, reference)
        if reason is not None:
            return Declined(reason)
        if isinstance(reference, (nn.LSTM, nn.GRU)):
            kernel = QuantizedRecurrent(engine, reference)
        else:
            kernel = QuantizedRecurrentCell(engine, reference)
        kernels[reference] = kernel
        return kernel

    return build


_CLASSES = (recurrent.LSTM, recurrent.GRU, recurrent.LSTMCell, recurrent.GRUCell, recurrent.RNNCell)


def recurrent_rules(engine: str) -> list[LoweringRule]:
    """One rule per reference recurrent module, its kernel on ``engine``.

    Example:
        >>> [rule.name for rule in recurrent_rules("x86")][:2]
        ['x86_quantized_lstm', 'x86_quantized_gru']
    """
    names = ("quantized_lstm", "quantized_gru", "lstm_cell", "gru_cell", "rnn_cell")
    return [
        LoweringRule(cls, build=build_recurrent(engine), name=f"{engine}_{name}")
        for cls, name in zip(_CLASSES, names, strict=True)
    ]
