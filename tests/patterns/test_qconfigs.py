"""The reference default QConfigMapping is accepted by the reference patterns."""

from __future__ import annotations

import operator
import re
from typing import Any

import pytest
import torch
from fxquant.config.backend import BackendPatternConfig
from fxquant.patterns import reference_default_qconfig_mapping, reference_pattern_configs
from torch import nn

from tests.patterns.helpers import accepted_by_any


@pytest.fixture(scope="module")
def configs() -> dict[Any, BackendPatternConfig]:
    return {c.pattern: c for c in reference_pattern_configs() if c.pattern is not None}


OPS = [
    nn.Linear,
    nn.Conv2d,
    nn.ConvTranspose2d,
    operator.add,
    torch.add,
    nn.LayerNorm,
    torch.sigmoid,
    nn.Sigmoid,
    nn.Softmax,
    nn.Hardsigmoid,
    torch.tanh,
    "tanh",
    nn.MaxPool2d,
    torch.cat,
]


def op_id(op: object) -> str:
    """``str(op)`` without the address a builtin prints: the same id in every process (the
    pytest-xdist workers of ``nox -s tests`` must collect the same tests)."""
    return re.sub(r" at 0x[0-9a-f]+", "", str(op))


@pytest.mark.parametrize("is_qat", [False, True])
@pytest.mark.parametrize("op", OPS, ids=op_id)
def test_default_qconfig_for_op_is_accepted(
    configs: dict[Any, BackendPatternConfig], op: object, is_qat: bool
) -> None:
    qconfig = reference_default_qconfig_mapping(is_qat).qconfig_for("", op)
    assert accepted_by_any(qconfig, configs[op]) == []


def test_the_global_qconfig_is_rejected_by_sigmoid(
    configs: dict[Any, BackendPatternConfig],
) -> None:
    # the checker is not vacuous: a plain observer cannot meet the fixed grid
    mapping = reference_default_qconfig_mapping()
    reasons = accepted_by_any(mapping.global_qconfig, configs[torch.sigmoid])
    assert reasons
    assert "no fixed qparams" in reasons[0]


@pytest.mark.parametrize("is_qat", [False, True])
def test_fixed_qparams_observers_report_the_grid(is_qat: bool) -> None:
    mapping = reference_default_qconfig_mapping(is_qat)
    for op, (scale, zero_point) in ((nn.Sigmoid, (1 / 256, 0)), (torch.tanh, (2 / 256, 128))):
        observer = mapping.qconfig_for("", op).activation()
        got_scale, got_zero_point = observer.calculate_qparams()
        assert (float(got_scale), int(got_zero_point)) == (scale, zero_point)


def test_ops_on_one_grid_share_one_qconfig() -> None:
    mapping = reference_default_qconfig_mapping()
    assert mapping.qconfig_for("", torch.sigmoid) is mapping.qconfig_for("", nn.Softmax)
    assert mapping.qconfig_for("", torch.sigmoid) is not mapping.qconfig_for("", torch.tanh)
