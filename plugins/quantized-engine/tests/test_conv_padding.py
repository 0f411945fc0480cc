"""Convs whose padding the quint8 kernels cannot take as given: lowered right or declined.

Before: ``nn.Conv2d(..., padding_mode="reflect")`` lowered to a zero-padding kernel,
15 steps off the reference model (7.8 dB from float where the reference is at 33 dB),
with no warning; ``padding="same"`` failed at convert inside the kernel's prepack
("Expected a value of type 'List[int]' for argument 'padding'").
"""

from __future__ import annotations

import copy

import fxquant
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn


def _lowered_and_reference(
    backend: str, model: nn.Module, x: torch.Tensor
) -> tuple[nn.Module, ...]:
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    prepared = fxquant.prepare_fx(model.eval(), mapping, (x,), backend_config=config)
    with torch.no_grad():
        prepared(x)
        prepared(x * 1.5)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    return fxquant.convert_fx(prepared), reference


def _output_step(reference: torch.fx.GraphModule) -> float:
    last = [n for n in reference.graph.nodes if "dequantize" in str(n.target)][-1]
    return float(last.args[1])


# torch's own conv warns once that an even 'same' kernel copies its input padded
@pytest.mark.filterwarnings("ignore:Using padding='same':UserWarning")
@settings(deadline=None, max_examples=12)
@given(
    padding_mode=st.sampled_from(["zeros", "reflect", "replicate", "circular"]),
    padding=st.sampled_from([1, "same", "valid", (1, 2)]),
    kernel=st.sampled_from([3, 4, (3, 2)]),
    dilation=st.sampled_from([1, 2]),
    engine=st.sampled_from(["fbgemm", "qnnpack"]),
)
def test_a_conv_with_any_padding_is_within_one_step_of_its_reference(
    padding_mode: str, padding: object, kernel: object, dilation: int, engine: str
) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, kernel, padding=padding, dilation=dilation, padding_mode=padding_mode)  # type: ignore[arg-type]  # padding: an int, a pair or a word
    model, x = nn.Sequential(conv, nn.Conv2d(6, 4, 1)), torch.randn(2, 4, 9, 9)
    lowered, reference = _lowered_and_reference(engine, model, x)
    with torch.no_grad():
        difference = float((lowered(x) - reference(x)).abs().max())
    step = _output_step(reference)
    assert difference <= step * 1.001 + 1e-6, fxquant.explain(lowered, show=False)


@pytest.mark.parametrize("engine", ["fbgemm", "qnnpack"])
def test_a_reflect_padded_conv_is_declined_with_the_reason(engine: str) -> None:
    model = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect"))
    lowered, _ = _lowered_and_reference(engine, model, torch.randn(2, 4, 8, 8))
    assert "padding_mode 'reflect'" in str(fxquant.explain(lowered, show=False))
