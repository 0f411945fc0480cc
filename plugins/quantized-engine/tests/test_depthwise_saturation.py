"""FBGEMM's depthwise conv sums pairs of u8 x s8 products in int16 on every CPU (#30).

Its other kernels sum in int32 on VNNI and AMX CPUs, so a mapping giving convs 8-bit
weights (``set_object_type(nn.Conv2d, ...)`` with ``default_weight_observer``) lowered a
depthwise conv that saturated: torchvision's DeepLabV3-MobileNetV3 15 steps from its
reference model (``backbone.6.block.1.0``, a 5 x 5 depthwise conv), silently. Such a conv
now stays its reference module, and ``explain`` says why.
"""

from __future__ import annotations

import copy

import fxquant
import pytest
import torch
from fxquant.numerics.observer import default_weight_observer
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn


class Depthwise(nn.Module):
    """A pointwise conv and relu (inputs over 127), a depthwise conv, a pointwise head."""

    def __init__(self, kernel: int, groups: int) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(4, 16, 1), nn.ReLU())
        self.depthwise = nn.Conv2d(16, 16, kernel, padding=kernel // 2, groups=groups)
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.depthwise(self.expand(x)))


def _mapping(eight_bit: bool) -> fxquant.QConfigMapping:
    mapping = fxquant.get_default_qconfig_mapping("fbgemm")
    if eight_bit:  # the matrix's object_type move: per-tensor 8-bit conv weights
        base = mapping.global_qconfig
        qconfig = fxquant.QConfig(activation=base.activation, weight=default_weight_observer)
        mapping.set_object_type(nn.Conv2d, qconfig)
    return mapping


def _quantize(model: nn.Module, eight_bit: bool, x: torch.Tensor) -> tuple[nn.Module, ...]:
    config = fxquant.get_backend_config("fbgemm")
    prepared = fxquant.prepare_fx(model.eval(), _mapping(eight_bit), (x,), backend_config=config)
    with torch.no_grad():
        prepared(x)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared), backend_config=config)
    return fxquant.convert_fx(prepared, backend_config=config), reference


def _depthwise_steps(lowered: nn.Module, reference: nn.Module, x: torch.Tensor) -> float:
    """The depthwise conv's own error: both models fed the reference's input to it (none
    where it stays its reference module: the same float ops)."""
    rows = fxquant.numerics.compare(reference, lowered, x)
    (row,) = [r for r in rows if r.node == "depthwise"]
    if row.local_steps is None:
        assert row.status == "reference"
        return 0.0
    return float(row.local_steps)


@settings(deadline=None, max_examples=10)
@given(kernel=st.sampled_from([3, 5]), groups=st.sampled_from([16, 4, 1]), eight_bit=st.booleans())
def test_an_fbgemm_conv_with_any_weight_range_is_within_one_step_of_its_reference(
    kernel: int, groups: int, eight_bit: bool
) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8) * 3
    lowered, reference = _quantize(Depthwise(kernel, groups), eight_bit, x)
    assert _depthwise_steps(lowered, reference, x) <= 1.001


@pytest.mark.parametrize("eight_bit", [True, False])
def test_explain_says_why_an_eight_bit_depthwise_conv_stays_its_reference(eight_bit: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8) * 3
    lowered, _ = _quantize(Depthwise(5, 16), eight_bit, x)
    report = fxquant.explain(lowered, show=False)
    (entry,) = [e for e in report.entries() if e.node == "depthwise"]
    if eight_bit:
        assert entry.status == "reference"
        assert "depthwise conv adds pairs of uint8 x int8 products in int16" in entry.reason.words
    else:  # the default mapping's 7-bit weights: exact, lowered
        assert entry.status == "lowered"
