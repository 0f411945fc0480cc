"""F.interpolate lowered on both engines agrees with the reference model within one step.

DeepLabV3's ASPP pooling branch upsamples a 1x1 map (global average, conv, relu) to the
feature size; its head upsamples the logits to the input size. Both shapes, every mode
F.interpolate takes, and the memory layouts an input reaches the op in (a quantize step's
contiguous tensor, a channels_last one, a conv kernel's result) are drawn here.
"""

from __future__ import annotations

from typing import Any

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.tools.testing.cases import output_scale, quantize_model
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

torch.set_num_threads(1)  # the test machine has 2 shared cores

_MODES = {
    3: ("nearest", "nearest-exact", "linear", "area"),
    4: ("nearest", "nearest-exact", "bilinear", "bicubic", "area"),
    5: ("nearest", "nearest-exact", "trilinear", "area"),
}
_CORNERS = frozenset({"linear", "bilinear", "bicubic", "trilinear"})  # align_corners applies


class Upsampled(nn.Module):
    """An optional 1x1 conv (its kernel hands the op a channels_last result), then the op."""

    def __init__(self, channels: int, rank: int, conv: bool, arguments: dict[str, Any]) -> None:
        super().__init__()
        conv_type = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[rank - 3]
        self.conv = conv_type(channels, channels, 1) if conv else nn.Identity()
        self.arguments = arguments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.conv(x), **self.arguments)


@st.composite
def upsamplings(draw: st.DrawFn) -> tuple[tuple[int, ...], dict[str, Any]]:
    """An input shape (spatial sizes of 1 favoured: a pooled map) and interpolate's arguments."""
    rank = draw(st.sampled_from((3, 4, 5)))
    spatial = draw(st.lists(st.sampled_from((1, 1, 2, 3, 5)), min_size=rank - 2, max_size=rank - 2))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 6)), *spatial)
    mode = draw(st.sampled_from(_MODES[rank]))
    arguments: dict[str, Any] = {"mode": mode}
    if draw(st.booleans()):
        arguments["size"] = tuple(draw(st.integers(1, 7)) for _ in spatial)
    else:
        shrinks = (0.5,) if min(spatial) > 1 else ()  # a size-1 side cannot shrink
        arguments["scale_factor"] = draw(st.sampled_from((2, 3, 1.5, *shrinks)))
    if mode in _CORNERS:
        arguments["align_corners"] = draw(st.booleans())
        arguments["antialias"] = mode in ("bilinear", "bicubic") and draw(st.booleans())
    return shape, arguments


def _lowered_and_reference(
    backend: str, model: nn.Module, shape: tuple[int, ...], layout: torch.memory_format
) -> tuple[torch.Tensor, torch.Tensor, float, Any]:
    torch.manual_seed(0)
    batches = [[torch.randn(shape).contiguous(memory_format=layout)] for _ in range(3)]
    lowered, reference = quantize_model(backend, model.eval(), batches)
    x = torch.randn(shape).contiguous(memory_format=layout)
    with torch.no_grad():
        got, want = lowered(x), reference(x)
    return got, want, output_scale(reference), fxquant.explain(lowered, show=False)


def _layouts(rank: int) -> list[torch.memory_format]:
    channels_last = {4: [torch.channels_last], 5: [torch.channels_last_3d]}.get(rank, [])
    return [torch.contiguous_format, *channels_last]


@settings(max_examples=40, deadline=None)
@given(case=upsamplings(), conv=st.booleans(), channels_last=st.booleans())
def test_interpolate_lowers_within_one_step_of_the_reference(
    backend: str, case: tuple[tuple[int, ...], dict[str, Any]], conv: bool, channels_last: bool
) -> None:
    shape, arguments = case
    layout = _layouts(len(shape))[-1 if channels_last else 0]
    model = Upsampled(shape[1], len(shape), conv, arguments)
    got, want, step, report = _lowered_and_reference(backend, model, shape, layout)
    [entry] = [e for e in report.entries() if e.node == "interpolate"]
    assert str(entry.status) == "lowered", str(report)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= step * 1.001, (shape, arguments)


@pytest.mark.parametrize("layout", _layouts(4), ids=["contiguous", "channels_last"])
def test_a_pooled_1x1_map_upsampled_to_the_feature_size_keeps_each_channel(
    backend: str, layout: torch.memory_format
) -> None:
    # the engines' kernels read a 1x1 map as channels_last and wrote its values in that order
    # into a contiguous output: channel c's plane held other channels' values, 255 steps off
    arguments = {"size": (4, 4), "mode": "bilinear", "align_corners": False}
    model = Upsampled(8, 4, False, arguments)
    got, want, step, _ = _lowered_and_reference(backend, model, (2, 8, 1, 1), layout)
    assert float((got - want).abs().max()) <= step * 1.001


class Decoder(nn.Module):
    """A latent vector through a linear, viewed as a 1x1 map, upsampled (a decoder's stem)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 8)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.linear(z).view(-1, 8, 1, 1), size=(4, 4), mode="nearest")


def test_a_linear_output_viewed_as_a_1x1_map_upsamples_as_the_reference(backend: str) -> None:
    # the view hands the kernel contiguous strides: 153 (fbgemm) and 161 (qnnpack) steps off
    got, want, step, _ = _lowered_and_reference(
        backend, Decoder(), (2, 16), torch.contiguous_format
    )
    assert float((got - want).abs().max()) <= step * 1.001
