"""Dynamic int8 LSTM / GRU / cells against torch.ao's dynamic quantized modules (#20).

torch.ao's FX flow with ``default_dynamic_qconfig`` lowers ``nn.LSTM`` to its dynamic
quantized LSTM, which quantizes activations to 7 bits whatever the observer says
(``reduce_range``); fxquant's qconfig says 0..127 for the same kernels. Both flows use
the same weights and the ``x86`` engine: their outputs must agree to float rounding, and
fxquant's lowered model must agree with its own reference model.
"""

from __future__ import annotations

import copy
import warnings

import fxquant
import pytest
import torch
from fxquant.flow import convert_fx, convert_to_reference_fx, prepare_fx
from fxquant.numerics import observer as fxobs
from torch import nn

from tests import oracle

RECURRENT = (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)


class Sequence(nn.Module):
    def __init__(self, kind: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = kind(6, 12, num_layers=2, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


class Cells(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTMCell(6, 12)
        self.gru = nn.GRUCell(12, 12)
        self.rnn = nn.RNNCell(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, c = self.lstm(x)
        return self.rnn(self.gru(h, c))


MODELS = {"lstm": lambda: Sequence(nn.LSTM), "gru": lambda: Sequence(nn.GRU), "cells": Cells}


def _inputs(name: str) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(3)
    shape = (4, 6) if name == "cells" else (3, 7, 6)
    return (torch.randn(shape, generator=generator) * 2,)


def _torch_ao(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> nn.Module:
    ao = oracle.load()
    with oracle.quiet(), warnings.catch_warnings():
        # torch.ao's reference RNN copies its scale tensors with torch.tensor(tensor)
        warnings.filterwarnings("ignore", message="To copy construct", category=UserWarning)
        from torch.ao.quantization import quantize_fx

        mapping = ao.QConfigMapping()
        for cls in RECURRENT:
            mapping.set_object_type(cls, ao.default_dynamic_qconfig)
        prepared = quantize_fx.prepare_fx(copy.deepcopy(model), mapping, inputs)
        return quantize_fx.convert_fx(prepared)


def _fxquant(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[nn.Module, nn.Module]:
    activation = fxobs.PlaceholderObserver.with_args(
        dtype=torch.uint8, quant_min=0, quant_max=127, is_dynamic=True
    )
    qconfig = fxquant.QConfig(activation=activation, weight=fxobs.default_weight_observer)
    mapping = fxquant.QConfigMapping()
    for cls in RECURRENT:
        mapping.set_object_type(cls, qconfig)
    backend = fxquant.get_backend_config("x86")
    prepared = prepare_fx(copy.deepcopy(model), mapping, inputs, backend_config=backend)
    reference = convert_to_reference_fx(copy.deepcopy(prepared))
    return convert_fx(prepared), reference


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_recurrent_matches_torch_ao(name: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    inputs = _inputs(name)
    lowered, reference = _fxquant(model, inputs)
    kinds = {type(m).__name__ for m in lowered.modules()}
    assert kinds & {"QuantizedRecurrent", "QuantizedRecurrentCell"}, kinds
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    try:
        theirs = _torch_ao(model, inputs)
        with oracle.quiet(), torch.no_grad():
            expected = theirs(*inputs)
    finally:
        torch.backends.quantized.engine = before
        oracle.release()
    with torch.no_grad():
        ours, ours_reference, float_out = lowered(*inputs), reference(*inputs), model(*inputs)
    assert (ours - expected).abs().max() < 1e-5  # float rounding: the same integers
    assert (ours - ours_reference).abs().max() < 1e-5
    assert (ours - float_out).abs().max() > 0  # quantized, not the float model
