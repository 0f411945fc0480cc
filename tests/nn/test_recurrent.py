"""fxquant.nn.recurrent: reference dynamic int8 LSTM / GRU / cells, and convert's swap (#20)."""

from __future__ import annotations

import copy
import io

import fxquant
import pytest
import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.flow import convert_to_reference_fx, prepare_fx
from fxquant.nn import recurrent
from fxquant.numerics import observer, qdq
from torch import nn

PER_TENSOR = {"qscheme": torch.per_tensor_affine, "dtype": torch.qint8, "zero_point": 0}


def _qparams(module: nn.Module, per_channel: bool = False) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for name in recurrent.weight_names(module):
        weight = getattr(module, name).detach()
        if per_channel:
            scale = weight.abs().amax(1) / 127.5
            found[name] = {
                "qscheme": torch.per_channel_affine, "dtype": torch.qint8, "scale": scale,
                "zero_point": torch.zeros(len(scale), dtype=torch.int64), "axis": 0,
            }  # fmt: skip
        else:
            found[name] = {**PER_TENSOR, "scale": float(weight.abs().max()) / 127.5}
    return found


FLOAT = {
    "lstm": lambda: nn.LSTM(5, 7, num_layers=2, bidirectional=True),
    "lstm_batch_first": lambda: nn.LSTM(5, 7, batch_first=True),
    "lstm_no_bias": lambda: nn.LSTM(5, 7, bias=False),
    "gru": lambda: nn.GRU(5, 7, num_layers=2, batch_first=True, bidirectional=True),
    "lstm_cell": lambda: nn.LSTMCell(5, 7),
    "gru_cell": lambda: nn.GRUCell(5, 7),
    "rnn_cell_tanh": lambda: nn.RNNCell(5, 7),
    "rnn_cell_relu": lambda: nn.RNNCell(5, 7, nonlinearity="relu"),
}


def _input(module: nn.Module) -> torch.Tensor:
    if isinstance(module, nn.RNNCellBase):
        return torch.randn(3, 5)
    return torch.randn(2, 4, 5)


def _first(value: object) -> torch.Tensor:
    while isinstance(value, tuple):
        value = value[0]
    assert isinstance(value, torch.Tensor)
    return value


@pytest.mark.parametrize("name", sorted(FLOAT))
@pytest.mark.parametrize("per_channel", [False, True])
def test_reference_is_close_to_float_with_its_shapes(name: str, per_channel: bool) -> None:
    torch.manual_seed(0)
    module = FLOAT[name]()
    ref = getattr(recurrent, type(module).__name__).from_float(
        module, _qparams(module, per_channel)
    )
    x = _input(module)
    expected, got = module(x), ref(x)
    flat_expected, flat_got = (
        torch.utils._pytree.tree_leaves(expected),
        torch.utils._pytree.tree_leaves(got),
    )
    assert [t.shape for t in flat_got] == [t.shape for t in flat_expected]
    for want, have in zip(flat_expected, flat_got, strict=True):
        assert 0 < (want - have).abs().max() < 0.05  # int8 weights, 8-bit activations


def test_weights_are_simulated_integers_and_activations_dynamic() -> None:
    torch.manual_seed(0)
    cell = nn.RNNCell(4, 3)
    qparams = _qparams(cell)
    ref = recurrent.RNNCell.from_float(cell, qparams, activation=(0, 127))
    weight = ref.get_quantized_weight("weight_ih")
    assert weight.dtype == torch.int8
    scale = qparams["weight_ih"]["scale"]
    assert torch.equal(ref.get_weight("weight_ih"), weight.float() * torch.tensor(scale))
    # by hand: each linear's input quantized dynamically over 0..127, then the float cell
    x, h = torch.randn(2, 4), torch.randn(2, 3)

    def fake(v: torch.Tensor) -> torch.Tensor:
        s, z = qdq.choose_qparams_per_tensor(v, 0, 127, torch.uint8)
        q = qdq.quantize_per_tensor(v, s, z, 0, 127, torch.uint8)
        return qdq.dequantize_per_tensor(q, s, z, 0, 127, torch.uint8)

    ih = fake(x) @ ref.get_weight("weight_ih").T + cell.bias_ih
    hh = fake(h) @ ref.get_weight("weight_hh").T + cell.bias_hh
    torch.testing.assert_close(ref(x, h), torch.tanh(ih + hh))


def test_unbatched_and_given_state() -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 7, num_layers=2)
    ref = recurrent.LSTM.from_float(lstm, _qparams(lstm))
    x, h, c = torch.randn(4, 5), torch.randn(2, 7), torch.randn(2, 7)
    out, (h1, c1) = ref(x, (h, c))
    want, (h2, c2) = lstm(x, (h, c))
    assert [out.shape, h1.shape, c1.shape] == [want.shape, h2.shape, c2.shape]
    assert (out - want).abs().max() < 0.05


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_fp16_weights_are_rounded_and_proj_size_projects() -> None:
    torch.manual_seed(0)
    gru = nn.GRU(5, 7)
    half = {"qscheme": None, "dtype": torch.float16}
    ref = recurrent.GRU.from_float(gru, dict.fromkeys(recurrent.weight_names(gru), half))
    x = torch.randn(3, 2, 5)
    assert (ref(x)[0] - gru(x)[0]).abs().max() < 1e-3
    lstm = nn.LSTM(5, 7, proj_size=3)
    ref_proj = recurrent.LSTM.from_float(lstm, _qparams(lstm))
    assert "weight_hr_l0" in ref_proj.weight_qparams
    out, (h, c) = ref_proj(x)
    assert [out.shape, h.shape, c.shape] == [(3, 2, 3), (1, 2, 3), (1, 2, 7)]
    assert (out - lstm(x)[0]).abs().max() < 0.05


@pytest.mark.parametrize(
    ("qparams", "is_half"),
    [
        ({"qscheme": None, "dtype": torch.float16}, True),
        ({"qscheme": None, "dtype": torch.bfloat16}, True),
        ({"qscheme": None, "dtype": torch.float32}, False),
        (PER_TENSOR, False),
    ],
)
def test_weight_qparams_say_whether_the_weight_is_half_precision(
    qparams: dict[str, object], is_half: bool
) -> None:
    """``is_half`` is public (a custom lowering picks an fp16 / bf16 kernel by it)."""
    assert recurrent.WeightQParams(qparams).is_half is is_half


def test_state_dict_round_trips_and_deepcopy() -> None:
    torch.manual_seed(0)
    gru = nn.GRU(5, 7)
    ref = recurrent.GRU.from_float(gru, _qparams(gru, per_channel=True), activation=(0, 127))
    other = recurrent.GRU.from_float(nn.GRU(5, 7), _qparams(nn.GRU(5, 7)))
    buffer = io.BytesIO()
    torch.save(ref.state_dict(), buffer)
    buffer.seek(0)
    other.load_state_dict(torch.load(buffer))
    assert other.activation_range == (0, 127)
    x = torch.randn(3, 2, 5)
    assert torch.equal(other(x)[0], ref(x)[0])
    assert torch.equal(copy.deepcopy(ref)(x)[0], ref(x)[0])


def test_bad_arguments_say_what_to_do() -> None:
    with pytest.raises(ConfigTypeError, match=r"expects an nn\.LSTM"):
        recurrent.LSTM.from_float(nn.GRU(2, 3))
    with pytest.raises(ConfigError, match="unknown keys"):
        recurrent.GRU.from_float(nn.GRU(2, 3), {"weight": PER_TENSOR})
    with pytest.raises(ConfigError, match=r"within 0\.\.255"):
        recurrent.GRU.from_float(nn.GRU(2, 3), None, activation=(0, 300))
    lstm = recurrent.LSTM.from_float(nn.LSTM(2, 3))
    packed = nn.utils.rnn.pack_sequence([torch.randn(3, 2)])
    with pytest.raises(TypeError, match="PackedSequence"):
        lstm(packed)


def test_a_weight_left_out_of_the_dict_stays_float() -> None:
    """A weight the dict does not name is used as it is, and its repr says so."""
    torch.manual_seed(0)
    cell = nn.GRUCell(4, 6)
    ref = recurrent.GRUCell.from_float(cell, {"weight_ih": _qparams(cell)["weight_ih"]})
    assert torch.equal(ref.get_weight("weight_hh"), cell.weight_hh)
    assert torch.equal(ref.get_quantized_weight("weight_hh"), cell.weight_hh)
    assert ref.get_quantized_weight("weight_ih").dtype == torch.int8
    assert "(weight_hh): WeightQParams(qscheme=None, dtype=torch.float32, 0..0)" in repr(ref)
    assert "(weight_ih): WeightQParams(qscheme=per_tensor_affine, dtype=torch.qint8" in repr(ref)
    x, h = torch.randn(3, 4), torch.randn(3, 6)
    torch.testing.assert_close(ref(x, h), cell(x, h), atol=0.05, rtol=0)


@pytest.mark.parametrize(
    ("qparams", "error", "match"),
    [
        ([PER_TENSOR], ConfigTypeError, r"weight qparams must be a dict, got \[\{"),
        ({"qscheme": None, "dtype": "float16"}, ConfigTypeError, "'dtype' must be a torch.dtype"),
        (
            {"qscheme": torch.per_channel_affine_float_qparams, "dtype": torch.quint8, "axis": 0},
            ConfigError,
            "integer zero points.*use per_channel_affine",
        ),
    ],
)
def test_bad_weight_qparams_say_what_is_wrong(
    qparams: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        recurrent.LSTMCell.from_float(nn.LSTMCell(2, 3), {"weight_hh": qparams})


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(5, 7, batch_first=True)
        self.cell = nn.GRUCell(7, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, (h, _) = self.lstm(x)
        return self.cell(y[:, -1], h[0])


def test_convert_to_reference_swaps_recurrent_modules() -> None:
    torch.manual_seed(0)
    model = Tagger().eval()
    x = torch.randn(2, 4, 5)
    activation = observer.PlaceholderObserver.with_args(
        dtype=torch.uint8, quant_min=0, quant_max=127, is_dynamic=True
    )
    qconfig = fxquant.QConfig(activation=activation, weight=observer.default_weight_observer)
    mapping = fxquant.QConfigMapping().set_object_type(nn.LSTM, qconfig)
    mapping.set_object_type(nn.GRUCell, fxquant.default_dynamic_qconfig)
    reference = convert_to_reference_fx(prepare_fx(model, mapping, (x,)))
    assert isinstance(reference.lstm, recurrent.LSTM)
    assert isinstance(reference.cell, recurrent.GRUCell)
    assert reference.lstm.activation_range == (0, 127)
    assert reference.cell.activation_range == (0, 255)
    assert reference.lstm.get_quantized_weight("weight_hh_l0").dtype == torch.int8
    assert 0 < (reference(x) - model(x)).abs().max() < 0.05


def test_float16_dynamic_qconfig_gives_fp16_weights() -> None:
    model = Tagger().eval()
    x = torch.randn(2, 4, 5)
    mapping = fxquant.QConfigMapping().set_object_type(nn.LSTM, fxquant.float16_dynamic_qconfig)
    reference = convert_to_reference_fx(prepare_fx(model, mapping, (x,)))
    assert isinstance(reference.lstm, recurrent.LSTM)
    assert reference.lstm.get_weight_qparams("weight_ih_l0")["dtype"] == torch.float16
    assert (reference(x) - model(x)).abs().max() < 1e-3


def test_a_static_qconfig_on_an_lstm_is_refused_saying_how_to_quantize_it() -> None:
    # a backend's default mapping is static, and its LSTM patterns are dynamic only
    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(4, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lstm(x)[0]

    x = torch.randn(3, 2, 4)
    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepared = prepare_fx(Tagger().eval(), mapping, (x,), backend_config=config)
    (skipped,) = fxquant.explain(prepared).skipped()
    assert skipped.reason.code.value == "is_dynamic"
    assert "set a dynamic qconfig for it (docs/guide/torch-modules.md" in skipped.reason.words

    activation = observer.PlaceholderObserver.with_args(
        dtype=torch.uint8, quant_min=0, quant_max=127, is_dynamic=True
    )
    qconfig = fxquant.QConfig(activation=activation, weight=observer.default_weight_observer)
    mapping.set_object_type(nn.LSTM, qconfig)  # what the message points at
    prepared = prepare_fx(Tagger().eval(), mapping, (x,), backend_config=config)
    assert fxquant.explain(prepared).skipped() == []
