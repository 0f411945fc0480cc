"""Dynamic int8 LSTM / GRU / cells lowered on qnnpack (#20): torch's quantized recurrent ops."""

from __future__ import annotations

import copy

import fxquant
import torch
from fxquant import observer
from fxquant.flow import convert_fx, convert_to_reference_fx, prepare_fx
from torch import nn

BACKEND = "qnnpack"
RECURRENT = (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(16, 8, batch_first=True)
        self.cell = nn.LSTMCell(8, 8)
        self.head = nn.RNNCell(8, 4)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x, (h, h))
        z, last = self.gru(y)
        a, _ = self.cell(z[:, -1], (last[0], last[0]))
        return self.head(a)


def _mapping(quant_max: int) -> fxquant.QConfigMapping:
    activation = observer.PlaceholderObserver.with_args(
        dtype=torch.uint8, quant_min=0, quant_max=quant_max, is_dynamic=True
    )
    qconfig = fxquant.QConfig(activation=activation, weight=observer.default_weight_observer)
    mapping = fxquant.QConfigMapping()
    for cls in RECURRENT:
        mapping.set_object_type(cls, qconfig)
    return mapping


def _convert(quant_max: int) -> tuple[nn.Module, nn.Module, nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = Tagger().eval()
    inputs = (torch.randn(2, 5, 6), torch.randn(4, 2, 8))
    config = fxquant.get_backend_config(BACKEND)
    prepared = prepare_fx(model, _mapping(quant_max), inputs, backend_config=config)
    reference = convert_to_reference_fx(copy.deepcopy(prepared))
    return model, reference, convert_fx(prepared), inputs


def test_recurrent_modules_lowered_match_the_reference() -> None:
    model, reference, lowered, inputs = _convert(255)
    statuses = {e.node: e.status for e in fxquant.explain(lowered).entries()}
    assert [statuses[n] for n in ("lstm", "gru", "cell", "head")] == ["lowered"] * 4
    with torch.no_grad():
        got, want, float_out = lowered(*inputs), reference(*inputs), model(*inputs)
    assert (got - want).abs().max() < 1e-5  # float rounding: the same integers
    assert 0 < (got - float_out).abs().max() < 0.05
