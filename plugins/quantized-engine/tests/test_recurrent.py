"""The dynamic recurrent kernels against fxquant's reference modules, on every engine (#20)."""

from __future__ import annotations

import copy
import os
import pickle
from unittest import mock

import pytest
import torch
from fxquant.lowering import Declined
from fxquant.nn import recurrent
from fxquant_quantized_engine.recurrent import (
    QuantizedRecurrent,
    QuantizedRecurrentCell,
    build_recurrent,
    recurrent_reason,
    recurrent_rules,
)
from torch import nn

ENGINES = ("fbgemm", "qnnpack", "x86", "onednn")


def _range(engine: str) -> tuple[int, int]:
    return (0, 255) if engine == "qnnpack" else (0, 127)


def _reference(module: nn.Module, engine: str, per_channel: bool = False) -> nn.Module:
    qparams = {}
    for name in recurrent.weight_names(module):
        weight = getattr(module, name).detach()
        if per_channel:
            scale = weight.abs().amax(1) / 127.5
            zero = torch.zeros(len(scale), dtype=torch.int64)
            qparams[name] = {
                "qscheme": torch.per_channel_affine, "dtype": torch.qint8,
                "scale": scale, "zero_point": zero, "axis": 0,
            }  # fmt: skip
        else:
            qparams[name] = {
                "qscheme": torch.per_tensor_affine, "dtype": torch.qint8,
                "scale": float(weight.abs().max()) / 127.5, "zero_point": 0,
            }  # fmt: skip
    cls = getattr(recurrent, type(module).__name__)
    return cls.from_float(module, qparams, activation=_range(engine))


def _kernel(reference: nn.Module, engine: str) -> nn.Module:
    if isinstance(reference, nn.RNNBase):
        return QuantizedRecurrent(engine, reference)
    return QuantizedRecurrentCell(engine, reference)


def _close(got: object, want: object) -> None:
    leaves = torch.utils._pytree.tree_leaves
    flat_got, flat_want = leaves(got), leaves(want)
    assert [t.shape for t in flat_got] == [t.shape for t in flat_want]
    for a, b in zip(flat_got, flat_want, strict=True):
        assert (a - b).abs().max() < 1e-5  # float rounding: the same integers


SEQUENCES = {
    "lstm": lambda: nn.LSTM(6, 8, num_layers=2, bidirectional=True),
    "lstm_batch_first_no_bias": lambda: nn.LSTM(6, 8, batch_first=True, bias=False),
    "gru": lambda: nn.GRU(6, 8, num_layers=2, batch_first=True, bidirectional=True),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_sequence_kernels_match_the_reference(engine: str, name: str) -> None:
    torch.manual_seed(0)
    reference = _reference(SEQUENCES[name](), engine, per_channel=name == "gru")
    kernel = _kernel(reference, engine)
    x = torch.randn(3, 5, 6) * 2
    with torch.no_grad():
        _close(kernel(x), reference(x))
        # a given state (LSTM: flattened (h, c), as the lowered graph passes it), unbatched
        layers = reference.num_layers * (2 if reference.bidirectional else 1)
        h = torch.randn(layers, 3 if reference.batch_first else 5, 8)
        if isinstance(reference, nn.LSTM):
            _close(kernel(x, h, h), reference(x, (h, h)))
            _close(kernel(x[0], h[:, 0], h[:, 0]), reference(x[0], (h[:, 0], h[:, 0])))
        else:
            _close(kernel(x, h), reference(x, h))
            _close(kernel(x[0], h[:, 0]), reference(x[0], h[:, 0]))


CELLS = {
    "lstm_cell": lambda: nn.LSTMCell(6, 8),
    "gru_cell": lambda: nn.GRUCell(6, 8),
    "rnn_tanh": lambda: nn.RNNCell(6, 8),
    "rnn_relu": lambda: nn.RNNCell(6, 8, nonlinearity="relu"),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", sorted(CELLS))
def test_cell_kernels_match_the_reference(engine: str, name: str) -> None:
    torch.manual_seed(0)
    reference = _reference(CELLS[name](), engine)
    kernel = _kernel(reference, engine)
    assert kernel.native  # the engine's cell op: its fixed range is the reference's
    x, h = torch.randn(4, 6) * 2, torch.randn(4, 8)
    with torch.no_grad():
        _close(kernel(x), reference(x))
        state = (h, h) if name == "lstm_cell" else (h,)
        _close(kernel(x, *state), reference(x, state if name == "lstm_cell" else h))


@pytest.mark.parametrize("name", sorted(CELLS))
def test_cells_on_full_range_activations_run_two_dynamic_linears(name: str) -> None:
    torch.manual_seed(0)
    module = CELLS[name]()
    # weights within +-64: exact with 8-bit activations on CPUs without VNNI too
    qparams = {
        weight: {
            "qscheme": torch.per_tensor_affine,
            "dtype": torch.qint8,
            "zero_point": 0,
            "scale": float(getattr(module, weight).detach().abs().max()) / 64,
            "quant_min": -64,
            "quant_max": 64,
        }
        for weight in recurrent.weight_names(module)
    }
    reference = getattr(recurrent, type(module).__name__).from_float(module, qparams)
    assert reference.activation_range == (0, 255)
    assert recurrent_reason("fbgemm", reference) is None
    kernel = _kernel(reference, "fbgemm")
    assert not kernel.native  # fbgemm's cell ops quantize to 0..127
    x = torch.randn(4, 6)
    with torch.no_grad():
        _close(kernel(x), reference(x))


def test_declines_say_why() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(6, 8)
    seven_bits = _reference(lstm, "x86")
    assert "ignore reduce_range" in recurrent_reason("qnnpack", seven_bits)
    full = _reference(lstm, "qnnpack")
    with mock.patch.dict(os.environ, {"FXQUANT_CPU_VNNI": "0"}):
        reason = recurrent_reason("x86", full)
    assert "saturates on CPUs without VNNI" in reason
    assert "quant_max=127" in reason
    odd = _reference(lstm, "x86")
    odd.activation_quant_max = 100
    assert "0..127 or 0..255" in recurrent_reason("fbgemm", odd)
    half = {"qscheme": None, "dtype": torch.float16}
    weights = dict.fromkeys(["weight_ih_l0", "weight_hh_l0"], half)
    fp16 = recurrent.GRU.from_float(nn.GRU(6, 8), weights)
    assert "fp16" in recurrent_reason("onednn", fp16)


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_proj_size_is_declined_by_the_rule() -> None:
    lstm = nn.LSTM(6, 8, proj_size=3)
    reference = _reference(lstm, "x86")
    match = mock.Mock(modules=(reference,), output=None)
    declined = build_recurrent("x86")(match)
    assert isinstance(declined, Declined)
    assert "proj_size=3" in declined.reason


def test_one_kernel_per_reference_module() -> None:
    reference = _reference(nn.LSTMCell(6, 8), "fbgemm")
    build = build_recurrent("fbgemm")
    match = mock.Mock(modules=(reference,), output=None)
    assert build(match) is build(match)


def test_packed_weights_are_rebuilt_after_copies() -> None:
    torch.manual_seed(0)
    reference = _reference(nn.GRU(6, 8), "fbgemm")
    kernel = _kernel(reference, "fbgemm")
    x = torch.randn(3, 2, 6)
    with torch.no_grad():
        want = kernel(x)
        for other in (copy.deepcopy(kernel), pickle.loads(pickle.dumps(kernel))):
            _close(other(x), want)
        fresh = _kernel(_reference(nn.GRU(6, 8), "fbgemm"), "fbgemm")
        fresh.load_state_dict(kernel.state_dict())
        _close(fresh(x), want)


def test_packed_sequence_is_refused() -> None:
    kernel = _kernel(_reference(nn.LSTM(6, 8), "fbgemm"), "fbgemm")
    packed = nn.utils.rnn.pack_sequence([torch.randn(3, 6)])
    with pytest.raises(TypeError, match="PackedSequence"):
        kernel(packed)


def test_rules_cover_every_recurrent_reference_module() -> None:
    patterns = {rule.pattern for rule in recurrent_rules("onednn")}
    assert patterns == {
        recurrent.LSTM,
        recurrent.GRU,
        recurrent.LSTMCell,
        recurrent.GRUCell,
        recurrent.RNNCell,
    }
