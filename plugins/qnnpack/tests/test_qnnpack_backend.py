"""The qnnpack backend: its patterns, constraints and default mappings (the shared checks of an
installed plugin run in test_qnnpack_lowering.py)."""

from __future__ import annotations

import warnings

import fxquant
import pytest
import torch
from fxquant.tools import testing
from torch import nn

BACKEND = "qnnpack"


def test_activations_use_the_full_range_and_no_scale_below_the_kernel_bound() -> None:
    qconfig = fxquant.get_default_qconfig_mapping(BACKEND).global_qconfig
    observer = qconfig.activation()
    observer(torch.full((10,), 1e-6))  # a tiny range: the scale must stay >= 2**-12
    scale, _ = observer.calculate_qparams()
    assert (observer.quant_min, observer.quant_max) == (0, 255)
    assert float(scale) >= 2**-12
    weight = qconfig.weight()
    assert (weight.quant_min, weight.quant_max, weight.qscheme) == (
        -127,
        127,
        torch.per_channel_symmetric,
    )


def test_backend_refuses_qconfigs_outside_the_kernel_constraints() -> None:
    from fxquant.numerics.observer import MinMaxObserver

    model = nn.Sequential(nn.Linear(4, 4)).eval()
    x = torch.randn(2, 4)
    tiny_scale = fxquant.QConfig(
        activation=MinMaxObserver.with_args(eps=2**-20),
        weight=fxquant.get_default_qconfig_mapping(BACKEND).global_qconfig.weight,
    )
    mapping = fxquant.QConfigMapping().set_global(tiny_scale)
    prepared = fxquant.prepare_fx(
        model, mapping, (x,), backend_config=fxquant.get_backend_config(BACKEND)
    )
    (entry,) = [e for e in fxquant.explain(prepared).entries() if e.op == "call_module"]
    assert entry.status == "skipped"
    assert entry.reason.field == "scale_min_lower_bound"


def test_backend_has_every_pattern_of_torch_ao_config_for_the_same_target() -> None:
    with warnings.catch_warnings(action="ignore"):  # torch.ao warns that it is deprecated
        pytest.importorskip("torch.ao.quantization.backend_config.utils")  # needed first
        ao = pytest.importorskip("torch.ao.quantization.backend_config")
    configs = ao.get_qnnpack_backend_config().configs
    testing.check_covers_ao_patterns(BACKEND, configs, at_least=190)
