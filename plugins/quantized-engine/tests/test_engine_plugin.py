"""engine_plugin writes a quint8-engine backend's hooks from its data (#21): they answer for
that backend only, lower with the named engine's kernels, and register like any plugin."""

from __future__ import annotations

import types

import fxquant
import torch
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.patterns.generic import dynamic_dtype_configs
from fxquant.tools import testing
from fxquant_quantized_engine import (
    QuantizedLinear,
    engine_default_qconfig_mapping,
    engine_pattern_configs,
    engine_plugin,
)

INT8_DYNAMIC = [c for c in dynamic_dtype_configs() if c.weight_dtype == torch.int8]


def _mapping(is_qat: bool) -> QConfigMapping:
    activation = {"dtype": torch.uint8, "quant_min": 0, "quant_max": 127}
    weight = {"dtype": torch.int8, "quant_min": -63, "quant_max": 63}
    return engine_default_qconfig_mapping(is_qat, activation=activation, weight=weight)


def _module(backend: str, engine: str) -> types.ModuleType:
    """A plugin module as fbgemm's plugin.py is one: the hooks assigned to its attributes."""
    hooks = engine_plugin(
        backend,
        engine=engine,
        pattern_configs=lambda: engine_pattern_configs(torch.uint8, torch.int8, INT8_DYNAMIC),
        default_qconfig_mapping=_mapping,
    )
    module = types.ModuleType(f"fxquant_{backend}_plugin")
    module.fxquant_plugin_api = 1  # type: ignore[attr-defined]
    module.fxquant_pattern_configs = hooks.fxquant_pattern_configs  # type: ignore[attr-defined]
    module.fxquant_lowering_kernels = hooks.fxquant_lowering_kernels  # type: ignore[attr-defined]
    module.fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping  # type: ignore[attr-defined]
    return module


def test_the_hooks_answer_only_for_their_backend_with_the_named_engines_rules() -> None:
    plugin = _module("mine_on_qnnpack", "qnnpack")
    testing.check_hooks_answer_only_for(
        plugin, "mine_on_qnnpack", other="fbgemm", rules=["qnnpack_linear", "qnnpack_conv2d"]
    )
    rules = plugin.fxquant_lowering_kernels("mine_on_qnnpack")
    assert {r.name.split("_")[0] for r in rules} == {"qnnpack"}


def test_the_engine_defaults_to_the_backends_name() -> None:
    hooks = engine_plugin("fbgemm", pattern_configs=lambda: [], default_qconfig_mapping=_mapping)
    rules = hooks.fxquant_lowering_kernels("fbgemm")
    assert rules
    assert {r.name.split("_")[0] for r in rules} == {"fbgemm"}
    assert hooks.fxquant_default_qconfig_mapping("fbgemm", True) is not None
    assert hooks.fxquant_default_qconfig_mapping("qnnpack", True) is None


def test_a_registered_engine_plugin_lowers_a_linear_within_one_step() -> None:
    plugin = _module("mine_on_fbgemm", "fbgemm")
    fxquant.register_plugin(plugin, backend="mine_on_fbgemm")
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
        x = torch.randn(16, 8)
        prepared = fxquant.prepare_fx(
            model,
            fxquant.get_default_qconfig_mapping("mine_on_fbgemm"),
            (x,),
            backend_config=fxquant.get_backend_config("mine_on_fbgemm"),
        )
        prepared(x)
        reference = fxquant.convert_to_reference_fx(prepared)
        lowered = fxquant.convert_fx(prepared)
        assert any(isinstance(m, QuantizedLinear) for m in lowered.modules())
        step = reference(x).abs().max() / 127
        assert (lowered(x) - reference(x)).abs().max() <= 1.01 * step
    finally:
        fxquant.unregister_plugin(plugin)
