"""Conv + add (+ relu) on the quint8 engines (#23): int8 with ``conv_adds_int8`` (PTQ),
lowered to the engine's conv then its ``quantized::add``, within one output step of the
reference model where the added tensor's range is no wider than the output's
(``conv_add.py``); float by default, as a transformer's adds."""

from __future__ import annotations

import copy
import operator
from typing import Any

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.errors import ConfigError
from fxquant.nn import intrinsic
from fxquant_quantized_engine import conv_adds_int8
from fxquant_quantized_engine.conv_add import QuantizedConvAdd
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

torch.set_num_threads(1)  # the test machine has 2 shared cores


class ConvAdd(nn.Module):
    """``conv(x) (+ bn) + y`` (+ relu), the conv on either side of the add."""

    def __init__(self, channels: tuple[int, int], kernel: int, options: dict[str, Any]) -> None:
        super().__init__()
        self.conv = nn.Conv2d(*channels, kernel, padding=kernel // 2)
        self.bn = nn.BatchNorm2d(channels[1]) if options["bn"] else None
        self.add = options["add"]
        self.left, self.relu = options["left"], options["relu"]

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = self.conv(x) if self.bn is None else self.bn(self.conv(x))
        s = self.add(c, y) if self.left else self.add(y, c)
        return torch.relu(s) if self.relu else s


def _lower(
    backend: str, model: nn.Module, inputs: tuple[torch.Tensor, ...], fused: bool = True
) -> tuple[Any, Any]:
    mapping = fxquant.get_default_qconfig_mapping(backend)
    if fused:
        conv_adds_int8(mapping)
    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, inputs, backend_config=config)
    with torch.no_grad():
        prepared(*inputs)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    return fxquant.convert_fx(prepared), reference


@settings(max_examples=20, deadline=None)
@given(
    channels=st.tuples(st.integers(1, 12), st.integers(1, 12)),
    shape=st.tuples(st.sampled_from([1, 3]), st.integers(1, 9)),  # kernel, image size
    y_scale=st.floats(0.05, 4.0),
    options=st.fixed_dictionaries(
        {
            "bn": st.booleans(),
            "add": st.sampled_from([operator.add, torch.add]),
            "left": st.booleans(),
            "relu": st.booleans(),
        }
    ),
    seed=st.integers(0, 2**16),
)
def test_conv_add_lowers_to_conv_then_add_within_a_step_of_the_reference(
    backend: str,
    channels: tuple[int, int],
    shape: tuple[int, int],
    y_scale: float,
    options: dict[str, Any],
    seed: int,
) -> None:
    torch.manual_seed(seed)
    kernel, size = shape
    model = ConvAdd(channels, kernel, options).eval()
    if model.bn is not None:
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)

    def inputs() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(2, channels[0], size, size)
        return x, torch.randn(2, channels[1], size, size) * y_scale

    lowered, reference = _lower(backend, model, inputs())
    kernels = [m for m in lowered.modules() if isinstance(m, QuantizedConvAdd)]
    assert len(kernels) == 1, fxquant.explain(lowered, show=False)
    out, mid = kernels[0].add.out, kernels[0].conv.out
    extra = kernels[0].add.inputs[1]
    # within one output step where the added tensor's range fits the output's, else half
    # an intermediate step more (conv_add.py)
    fits = extra.scale * (extra.quant_max - extra.quant_min) <= out.scale * (
        out.quant_max - out.quant_min
    )
    bound = out.scale if fits else out.scale + mid.scale / 2
    with torch.no_grad():
        for x, y in (inputs(), inputs()):  # fresh inputs: beyond the calibrated range too
            difference = (lowered(x, y) - reference(x, y)).abs().max().item()
            assert difference <= bound * 1.001 + 1e-6, (difference, out, mid, extra)


class Bottleneck(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class ResNetLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.Sequential(Bottleneck(), Bottleneck())
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(F.relu(self.stem(x)))
        return self.fc(y.mean((2, 3)))


class EncoderBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(F.gelu(self.fc1(x))))


def _statuses(
    backend: str, model: nn.Module, x: torch.Tensor, fused: bool = True
) -> dict[str, tuple[str, str]]:
    lowered, _ = _lower(backend, model.eval(), (x,), fused)
    entries = fxquant.explain(lowered, show=False).entries()
    return {e.node: (str(e.pattern), str(e.status)) for e in entries}


def test_conv_adds_int8_lowers_a_resnets_adds_a_transformers_stay_float(backend: str) -> None:
    torch.manual_seed(0)
    resnet = _statuses(backend, ResNetLike(), torch.randn(2, 3, 8, 8))
    fused = {node: s for node, s in resnet.items() if s[0].startswith("ConvAdd")}
    assert len(fused) == 2, resnet
    assert all(status == "lowered" for _, status in fused.values()), resnet
    assert not any("add" in node for node in resnet), resnet  # no add left on its own
    encoder = _statuses(backend, EncoderBlock(), torch.randn(2, 5, 16))
    adds = [s for node, s in encoder.items() if "add" in node]
    assert adds, encoder
    assert all(status == "float" for _, status in adds), encoder


def test_the_default_keeps_a_resnets_adds_float(backend: str) -> None:
    # the fused form is 4-5 dB below its reference on the zoo's ResNet (qconfig.py)
    torch.manual_seed(0)
    statuses = _statuses(backend, ResNetLike(), torch.randn(2, 3, 8, 8), fused=False)
    adds = [s for node, s in statuses.items() if "add" in node]
    assert len(adds) == 2, statuses
    assert all(status == "float" for _, status in adds), statuses


def test_conv_adds_int8_refuses_a_qat_mapping(backend: str) -> None:
    mapping = fxquant.get_default_qconfig_mapping(backend, is_qat=True)
    with pytest.raises(ConfigError, match=r"conv_adds_int8.*QAT mapping"):
        conv_adds_int8(mapping)
    assert intrinsic.ConvAdd2d not in mapping.object_type_qconfigs  # left as it was


def test_qat_keeps_a_resnet_blocks_adds_float(backend: str) -> None:
    # conv + bn + add cannot fuse while the BatchNorm trains (qconfig.py)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping(backend, is_qat=True)
    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_qat_fx(ResNetLike().train(), mapping, (x,), backend_config=config)
    prepared(x)
    entries = fxquant.explain(prepared, show=False).entries()
    statuses = {e.node: (str(e.pattern), str(e.status)) for e in entries}
    adds = [s for node, s in statuses.items() if "add" in node]
    assert len(adds) == 2, statuses
    assert all(status == "float" for _, status in adds), statuses
    assert not any(p.startswith("ConvAdd") for p, _ in statuses.values()), statuses
