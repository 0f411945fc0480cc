"""The quint8 engines convert a layer's scaled accumulator to int32 before clamping (#30).

At 2**31 output steps or more the conversion gives the lowest int32: an output the
reference model saturates at 255 came out 0, 255 steps off, silently (fbgemm QAT on
torchvision's ResNet-50 and RegNetY-400MF: a BN channel whose variance collapsed in two SGD
steps folded into weight scales near 1e5, 156,383 output steps per accumulator unit). Such
a layer now stays its reference module, and ``explain`` says why.
"""

from __future__ import annotations

import fxquant
import pytest
import torch
from fxquant.numerics import compare
from torch import nn

STEP_SLACK = 1.0 + 1e-3


def _quantize(grow: float, backend: str) -> tuple[nn.Module, nn.Module, list]:
    """A conv + relu whose channel 0 weights grow ``grow`` times after calibration, as a
    QAT step grows a BN-folded weight after its output range was observed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    batches = [
        (torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(s)),) for s in range(3)
    ]
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    prepared = fxquant.prepare_fx(model, mapping, batches[0], backend_config=config)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
        prepared.get_parameter("0.0.weight")[0].mul_(grow)
    lowered = fxquant.convert_fx(prepared, backend_config=config)
    reference = fxquant.convert_to_reference_fx(prepared, backend_config=config)
    return lowered, reference, batches


def _far(lowered: nn.Module, reference: nn.Module, batches: list) -> list[tuple[str, float]]:
    return [
        (row.node, row.local_steps)
        for row in compare(reference, lowered, batches)
        if row.node != "output" and row.local_steps is not None and row.local_steps > STEP_SLACK
    ]


def _entry(lowered: nn.Module, node: str) -> fxquant.ExplainEntry:
    (entry,) = [e for e in fxquant.explain(lowered, show=False).entries() if e.node == node]
    return entry


@pytest.mark.parametrize("backend", ["fbgemm", "qnnpack"])
def test_a_layer_whose_requantization_passes_int32_agrees_with_its_reference(
    backend: str,
) -> None:
    lowered, reference, batches = _quantize(1e8, backend)
    assert not _far(lowered, reference, batches)
    entry = _entry(lowered, "_0")
    assert entry.status == "reference"
    assert f"{backend}'s requantization of output channel 0" in entry.reason.words
    assert "freeze_bn_stats" in entry.reason.words


@pytest.mark.parametrize("backend", ["fbgemm", "qnnpack"])
def test_a_layer_with_a_grown_but_bounded_weight_still_lowers(backend: str) -> None:
    lowered, reference, batches = _quantize(3.0, backend)
    assert _entry(lowered, "_0").status == "lowered"
    assert not _far(lowered, reference, batches)


def _transposed(grow: float, groups: int) -> tuple[nn.Module, nn.Module, list]:
    """A transposed conv whose output channel 0 grows ``grow`` times after calibration."""
    torch.manual_seed(0)
    conv = nn.ConvTranspose2d(4, 4, 2, groups=groups)
    model = nn.Sequential(conv, nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    batches = [
        (torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(s)),) for s in range(3)
    ]
    config = fxquant.get_backend_config("qnnpack")
    mapping = fxquant.get_default_qconfig_mapping("qnnpack")
    prepared = fxquant.prepare_fx(model, mapping, batches[0], backend_config=config)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
        # (in, out / groups, kh, kw): output channel 0 reads the first group's inputs only
        prepared.get_parameter("0.weight")[: 4 // groups, 0].mul_(grow)
    lowered = fxquant.convert_fx(prepared, backend_config=config)
    reference = fxquant.convert_to_reference_fx(prepared, backend_config=config)
    return lowered, reference, batches


@pytest.mark.parametrize("groups", [1, 2])
def test_a_transposed_conv_whose_requantization_passes_int32_agrees_with_its_reference(
    groups: int,
) -> None:
    if "qnnpack" not in fxquant.list_backends():
        pytest.skip("qnnpack (the engine that lowers transposed convs) is not installed")
    lowered, reference, batches = _transposed(1e8, groups)
    assert not _far(lowered, reference, batches)
    entry = _entry(lowered, "_0")
    assert entry.status == "reference"
    assert "qnnpack's requantization of output channel 0" in entry.reason.words
    bounded, reference, batches = _transposed(3.0, groups)
    assert _entry(bounded, "_0").status == "lowered"
    assert not _far(bounded, reference, batches)
