"""The fbgemm backend: its patterns, constraints and default mappings (the shared checks of an
installed plugin run in test_fbgemm_lowering.py)."""

from __future__ import annotations

import warnings

import fxquant
import pytest
import torch
from fxquant import testing
from torch import nn

BACKEND = "fbgemm"


def test_activations_use_seven_bits_so_fbgemm_products_cannot_saturate() -> None:
    qconfig = fxquant.get_default_qconfig_mapping(BACKEND).global_qconfig
    observer = qconfig.activation()
    observer(torch.linspace(-1, 1, 100))
    scale, _ = observer.calculate_qparams()
    assert observer.reduce_range
    assert float(scale) * 127 == pytest.approx(2.0, rel=0.05)  # 2.0 = the range, in 128 steps
    weight = qconfig.weight()
    assert weight.qscheme == torch.per_channel_symmetric


def _depthwise_error_in_steps(mapping: fxquant.QConfigMapping) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, groups=16, padding=1)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.rand_like(model[0].weight) + 0.5)
    x = torch.rand(2, 16, 12, 12) * 4  # positive: the uint8 inputs reach 255
    lowered, reference = testing.quantize_model(BACKEND, model, [[x]], mapping)
    step = testing.output_scale(reference)
    return float((lowered(x) - reference(x)).abs().max()) / step


def test_default_reduce_range_keeps_depthwise_conv_exact_where_full_range_saturates() -> None:
    from fxquant.observer import MinMaxObserver

    default = fxquant.get_default_qconfig_mapping(BACKEND)
    full_range = fxquant.QConfig(
        activation=MinMaxObserver.with_args(dtype=torch.uint8),
        weight=default.global_qconfig.weight,
    )
    assert _depthwise_error_in_steps(default) <= 1.0
    assert _depthwise_error_in_steps(fxquant.QConfigMapping().set_global(full_range)) > 10


def test_backend_has_every_pattern_of_torch_ao_config_for_the_same_target() -> None:
    with warnings.catch_warnings(action="ignore"):  # torch.ao warns that it is deprecated
        pytest.importorskip("torch.ao.quantization.backend_config.utils")  # needed first
        ao = pytest.importorskip("torch.ao.quantization.backend_config")
    configs = ao.get_fbgemm_backend_config().configs
    testing.check_covers_ao_patterns(BACKEND, configs, at_least=190)
