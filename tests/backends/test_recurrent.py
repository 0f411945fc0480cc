"""Dynamic int8 LSTM / GRU / cells lowered on every installed CPU backend (#20): torch's
quantized recurrent ops, equal to the reference model; x86's own declines and qconfig."""

from __future__ import annotations

import copy
import os
from unittest import mock

import fxquant
import pytest
import torch
from fxquant.flow import convert_fx, convert_to_reference_fx, prepare_fx
from fxquant.numerics import observer
from torch import nn

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


def _convert(
    backend: str, quant_max: int
) -> tuple[nn.Module, nn.Module, nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = Tagger().eval()
    inputs = (torch.randn(2, 5, 6), torch.randn(4, 2, 8))
    config = fxquant.get_backend_config(backend)
    prepared = prepare_fx(model, _mapping(quant_max), inputs, backend_config=config)
    reference = convert_to_reference_fx(copy.deepcopy(prepared))
    return model, reference, convert_fx(prepared), inputs


def test_recurrent_modules_lowered_match_the_reference(backend: str) -> None:
    # qnnpack ignores reduce_range: 0..127 is its declined range, 0..255 its lowered one
    model, reference, lowered, inputs = _convert(backend, 255 if backend == "qnnpack" else 127)
    statuses = {e.node: e.status for e in fxquant.explain(lowered).entries()}
    assert [statuses[n] for n in ("lstm", "gru", "cell", "head")] == ["lowered"] * 4
    with torch.no_grad():
        got, want, float_out = lowered(*inputs), reference(*inputs), model(*inputs)
    assert (got - want).abs().max() < 1e-5  # float rounding: the same integers
    assert 0 < (got - float_out).abs().max() < 0.05


def test_full_range_activations_without_vnni_are_declined_with_the_reason() -> None:
    pytest.importorskip("fxquant_x86")
    with mock.patch.dict(os.environ, {"FXQUANT_CPU_VNNI": "0"}):
        _, reference, lowered, inputs = _convert("x86", 255)
    entries = {e.node: e for e in fxquant.explain(lowered).entries()}
    assert entries["lstm"].status == "reference"
    assert "saturates on CPUs without VNNI" in entries["lstm"].reason.words
    with torch.no_grad():
        torch.testing.assert_close(lowered(*inputs), reference(*inputs))


def test_the_backends_dynamic_qconfig_lowers_recurrent_modules() -> None:
    # 8-bit activations, per-channel weights in 7 bits without VNNI: exact there too
    pytest.importorskip("fxquant_x86")
    from fxquant_onednn.qconfig import dynamic_qconfig

    torch.manual_seed(0)
    model = Tagger().eval()
    inputs = (torch.randn(2, 5, 6), torch.randn(4, 2, 8))
    mapping = fxquant.QConfigMapping()
    for cls in RECURRENT:
        mapping.set_object_type(cls, dynamic_qconfig())
    config = fxquant.get_backend_config("x86")
    prepared = prepare_fx(model, mapping, inputs, backend_config=config)
    reference = convert_to_reference_fx(copy.deepcopy(prepared))
    lowered = convert_fx(prepared)
    statuses = {e.node: e.status for e in fxquant.explain(lowered).entries()}
    assert [statuses[n] for n in ("lstm", "gru", "cell", "head")] == ["lowered"] * 4
    with torch.no_grad():
        assert (lowered(*inputs) - reference(*inputs)).abs().max() < 1e-5
