"""The QAT and reference modules rebuild their float module's every setting.

They read the float class off their bases and its configuration off the
float module's attributes (``fxquant.nn.float_twin.init_arguments``), so a setting the
rule missed would silently come back as its default: these tests build each
float class with non-default settings and compare the whole ``repr``.
"""

from __future__ import annotations

import pytest
import torch
from fxquant.config.defaults import default_embedding_qat_qconfig
from fxquant.nn import qat, recurrent, reference
from fxquant.nn.float_twin import init_arguments
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.nn.helpers import tiny_qconfig

CONFIGURED = [
    nn.Linear(3, 2, bias=False),
    nn.Conv1d(2, 4, 3, stride=2, padding=1, dilation=2, groups=2, padding_mode="circular"),
    nn.Conv2d(2, 3, (1, 3), padding="same", bias=False, padding_mode="reflect"),
    nn.Conv3d(2, 2, 1, stride=(1, 2, 1)),
    nn.ConvTranspose1d(2, 4, 3, stride=2, output_padding=1, groups=2, dilation=1),
    nn.ConvTranspose2d(2, 3, 3, padding=1, bias=False),
    nn.ConvTranspose3d(2, 3, 1, stride=2, output_padding=1),
    nn.Embedding(10, 4, padding_idx=-1, max_norm=1.5, norm_type=1.0, scale_grad_by_freq=True),
    nn.EmbeddingBag(10, 4, mode="max", include_last_offset=True, padding_idx=0, sparse=True),
    nn.LSTM(3, 4, num_layers=2, bias=False, batch_first=True, bidirectional=True, proj_size=2),
    nn.GRU(3, 4, dropout=0.5, num_layers=2),
    nn.LSTMCell(3, 4, bias=False),
    nn.GRUCell(3, 4),
    nn.RNNCell(3, 4, nonlinearity="relu"),
]
IDS = [repr(module) for module in CONFIGURED]


@pytest.mark.parametrize("module", CONFIGURED, ids=IDS)
def test_init_arguments_rebuild_the_float_module_with_every_setting(module: nn.Module) -> None:
    rebuilt = type(module)(**init_arguments(module, type(module)))
    assert repr(rebuilt) == repr(module)
    shapes = [(name, p.shape) for name, p in module.named_parameters()]
    assert [(name, p.shape) for name, p in rebuilt.named_parameters()] == shapes


@pytest.mark.parametrize("module", CONFIGURED, ids=IDS)
def test_reference_modules_keep_every_setting_of_the_float_module(module: nn.Module) -> None:
    name = type(module).__name__
    if isinstance(module, nn.RNNBase | nn.RNNCellBase):
        ref = getattr(recurrent, name).from_float(module)
    else:
        ref = getattr(reference, name).from_float(module, None)
    assert ref._get_name() == f"Reference{name}"
    assert ref.extra_repr().startswith(module.extra_repr())
    assert ref.state_dict().keys() >= module.state_dict().keys()
    for key, value in module.state_dict().items():
        assert torch.equal(ref.state_dict()[key], value), key


QAT_FLOAT = [m for m in CONFIGURED if hasattr(qat, type(m).__name__)]


@pytest.mark.parametrize("module", QAT_FLOAT, ids=[repr(m) for m in QAT_FLOAT])
def test_qat_round_trip_gives_back_the_float_module_with_every_setting(module: nn.Module) -> None:
    module.qconfig = (
        default_embedding_qat_qconfig
        if isinstance(module, nn.Embedding | nn.EmbeddingBag)
        else tiny_qconfig()
    )
    back = getattr(qat, type(module).__name__).from_float(module).to_float()
    assert type(back) is type(module)
    assert repr(back) == repr(module)


@settings(max_examples=30, deadline=None)
@given(
    geometry=st.fixed_dictionaries(
        {
            "kernel_size": st.integers(1, 3),
            "stride": st.integers(1, 2),
            "padding": st.integers(0, 2),
            "dilation": st.integers(1, 2),
            "groups": st.sampled_from([1, 2]),
            "bias": st.booleans(),
            "padding_mode": st.sampled_from(["zeros", "reflect", "replicate", "circular"]),
        }
    )
)
def test_reference_conv2d_runs_as_the_float_conv_of_any_geometry(geometry: dict) -> None:
    conv = nn.Conv2d(2, 4, **geometry)
    ref = reference.Conv2d.from_float(conv, {"qscheme": None, "dtype": torch.float32})
    x = torch.randn(1, 2, 7, 7)
    assert torch.equal(ref(x), conv(x))


def test_qat_embedding_builds_its_fake_quantize_on_the_table_device() -> None:
    table = nn.EmbeddingBag(10, 4, device="meta")
    table.qconfig = default_embedding_qat_qconfig
    bag = qat.EmbeddingBag.from_float(table)
    assert bag.weight is table.weight
    assert {buffer.device.type for buffer in bag.weight_fake_quant.buffers()} == {"meta"}
