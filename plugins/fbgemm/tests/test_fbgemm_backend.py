"""The fbgemm backend: its patterns, constraints and default mappings (the shared checks of an
installed plugin run in test_fbgemm_lowering.py)."""

from __future__ import annotations

import warnings

import fxquant
import pytest
import torch
from fxquant.lowering.kernels import cpu
from fxquant.tools import testing
from torch import nn

BACKEND = "fbgemm"


@pytest.mark.parametrize("vnni", ["0", "1"])
def test_default_ranges_keep_fbgemm_products_from_saturating(
    vnni: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8-bit activations and 7-bit conv weights on every CPU: 2 x 255 x 64 fits FBGEMM's
    # int16 pair sums for every input (its depthwise conv adds in pairs even with VNNI);
    # Linear's weights 8 bits where its GEMM adds in int32 (VNNI)
    monkeypatch.setenv(cpu.ENV_VAR, vnni)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    qconfig = mapping.global_qconfig
    observer = qconfig.activation()
    observer(torch.linspace(-1, 1, 100))
    scale, _ = observer.calculate_qparams()
    assert float(scale) * 255 == pytest.approx(2.0, rel=0.05)  # 2.0 = the range, in 256 steps
    weight = qconfig.weight()
    assert weight.qscheme == torch.per_channel_symmetric
    assert (weight.quant_min, weight.quant_max) == cpu.SEVEN_BIT_WEIGHT
    linear = mapping.qconfig_for("", nn.Linear).weight()
    assert linear.quant_max == (127 if vnni == "1" else cpu.SEVEN_BIT_WEIGHT[1])


def _depthwise_error_in_steps(mapping: fxquant.QConfigMapping) -> tuple[float, str]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, groups=16, padding=1)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.rand_like(model[0].weight) + 0.5)
    x = torch.rand(2, 16, 12, 12) * 4  # positive: the uint8 inputs reach 255
    lowered, reference = testing.quantize_model(BACKEND, model, [[x]], mapping)
    step = testing.output_scale(reference)
    statuses = {e.node: str(e.status) for e in fxquant.explain(lowered, show=False).entries()}
    status = statuses["_0"]
    return float((lowered(x) - reference(x)).abs().max()) / step, status


def test_default_keeps_depthwise_conv_exact_where_full_range_saturates() -> None:
    from fxquant.numerics.observer import MinMaxObserver, default_per_channel_weight_observer

    default = fxquant.get_default_qconfig_mapping(BACKEND)
    full_range = fxquant.QConfig(
        activation=MinMaxObserver.with_args(dtype=torch.uint8),
        weight=default_per_channel_weight_observer,  # -128..127
    )
    error, status = _depthwise_error_in_steps(default)
    assert status == "lowered"  # FBGEMM's depthwise kernel runs, within one step
    assert error <= 1.0
    error, status = _depthwise_error_in_steps(fxquant.QConfigMapping().set_global(full_range))
    # 8-bit weights saturate the depthwise kernel on every CPU, VNNI too (10+ steps when it
    # ran): the rule declines them, the reference runs
    assert (error, status) == (0.0, "reference")


def test_without_vnni_eight_bit_weights_are_declined_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fxquant.numerics.observer import default_per_channel_weight_observer

    monkeypatch.setenv(cpu.ENV_VAR, "0")
    default = fxquant.get_default_qconfig_mapping(BACKEND)
    assert default.global_qconfig.weight().quant_max == 63
    eight_bit = fxquant.QConfig(
        default.global_qconfig.activation, default_per_channel_weight_observer
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 4)).eval()
    x = torch.randn(2, 4, 6, 6)
    for mapping, status in (
        (default, "lowered"),
        (fxquant.QConfigMapping().set_global(eight_bit), "reference"),
    ):
        lowered, reference = testing.quantize_model(BACKEND, model, [[x]], mapping)
        entries = {e.node: e for e in fxquant.explain(lowered, show=False).entries()}
        assert [entries[n].status for n in ("_0", "_2")] == [status, status]
        if status == "reference":
            assert "FBGEMM's u8 x s8 kernel saturates on CPUs without VNNI" in str(
                entries["_0"].reason
            )
        with torch.no_grad():
            y = x * 4  # beyond the calibrated range: uint8 inputs up to 255
            step = testing.output_scale(reference)
            assert float((lowered(y) - reference(y)).abs().max()) <= step * 1.001 + 1e-6


def test_backend_has_every_pattern_of_torch_ao_config_for_the_same_target() -> None:
    with warnings.catch_warnings(action="ignore"):  # torch.ao warns that it is deprecated
        pytest.importorskip("torch.ao.quantization.backend_config.utils")  # needed first
        ao = pytest.importorskip("torch.ao.quantization.backend_config")
    configs = ao.get_fbgemm_backend_config().configs
    testing.check_covers_ao_patterns(BACKEND, configs, at_least=190)
