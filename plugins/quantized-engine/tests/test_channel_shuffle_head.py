"""ShuffleNetV2's shape on the quint8 engines: a channel shuffle, then a conv head averaged.

The channel shuffle views the 4-D activation as 5-D, transposes and views it back; the head
averages the last conv's output over its spatial dims. Run on small images that conv's
output is 1 x 1: its channels_last strides ``(C, 1, C, C)`` read as both memory formats, and
torch's quint8 ``mean`` raised "required rank 4 tensor to use channels_last format" (fbgemm,
torchvision's shufflenet_v2 at 1 x 3 x 32 x 32).
"""

from __future__ import annotations

import copy

import fxquant
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn


class ShuffleHead(nn.Module):
    """A conv, a channel shuffle in two groups, a conv to ``side`` x ``side``, a mean, a linear."""

    def __init__(self, side: int, keepdim: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Sequential(nn.Conv2d(8, 16, 8 - side + 1), nn.ReLU())
        self.fc = nn.Linear(16, 4)
        self.keepdim = keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        batch, channels, height, width = x.size()
        x = x.view(batch, 2, channels // 2, height, width)
        x = torch.transpose(x, 1, 2).contiguous()
        x = x.view(batch, -1, height, width)
        x = self.head(x).mean([2, 3], keepdim=self.keepdim)
        return self.fc(x.flatten(1))


def _lowered_and_reference(engine: str, model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, ...]:
    config = fxquant.get_backend_config(engine)
    mapping = fxquant.get_default_qconfig_mapping(engine)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    with torch.no_grad():
        prepared(x)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared), backend_config=config)
    return fxquant.convert_fx(prepared, backend_config=config), reference


def _output_step(reference: torch.fx.GraphModule) -> float:
    last = [n for n in reference.graph.nodes if "dequantize" in str(n.target)][-1]
    return float(last.args[1])


@settings(deadline=None, max_examples=12)
@given(
    engine=st.sampled_from(["fbgemm", "qnnpack"]),
    batch=st.integers(1, 3),
    side=st.integers(1, 3),
    keepdim=st.booleans(),
)
def test_a_shuffled_head_averaged_at_any_size_is_within_one_step_of_its_reference(
    engine: str, batch: int, side: int, keepdim: bool
) -> None:
    torch.manual_seed(0)
    model, x = ShuffleHead(side, keepdim).eval(), torch.randn(batch, 3, 8, 8)
    lowered, reference = _lowered_and_reference(engine, model, x)
    with torch.no_grad():
        difference = float((lowered(x) - reference(x)).abs().max())
    assert difference <= _output_step(reference) * 1.001 + 1e-6


def _shuffle(x: torch.Tensor) -> torch.Tensor:
    batch, channels, height, width = x.size()
    x = x.view(batch, 2, channels // 2, height, width)
    return torch.transpose(x, 1, 2).contiguous().view(batch, -1, height, width)


class ConvShuffle(nn.Module):
    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _shuffle(self.conv(x))


@pytest.mark.parametrize("engine", ["fbgemm", "qnnpack"])
@pytest.mark.parametrize("shape", [(1, 3, 1, 1), (2, 3, 5, 4)])
def test_the_lowered_channel_shuffle_moves_the_conv_integers_exactly(
    engine: str, shape: tuple[int, ...]
) -> None:
    """A permutation: the same observer ranges, so the same integers in a new order."""
    torch.manual_seed(0)
    conv, x = nn.Conv2d(3, 8, 1).eval(), torch.randn(shape)
    plain, _ = _lowered_and_reference(engine, nn.Sequential(conv), x)
    shuffled, _ = _lowered_and_reference(engine, ConvShuffle(conv), x)
    with torch.no_grad():
        assert torch.equal(shuffled(x), _shuffle(plain(x)))
