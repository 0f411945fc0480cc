"""A backend made of this library alone, once per quint8 engine (as fbgemm and qnnpack are)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fxquant
import pytest
import torch
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule
from fxquant.lowering.kernels import cpu
from fxquant.patterns.generic import dynamic_dtype_configs
from fxquant_quantized_engine import (
    engine_default_qconfig_mapping,
    engine_pattern_configs,
    lowering_rules,
)

torch.set_num_threads(1)  # the test machine has 2 shared cores

ENGINES = ("fbgemm", "qnnpack")


class EngineBackend:
    """The hooks of a backend on ``engine``: the library's patterns, rules and mapping."""

    def __init__(self, engine: str) -> None:
        self.engine, self.name = engine, f"quint8_{engine}"
        # QNNPACK has no fp16 GEMM: only the dynamic int8 linear there
        self.dynamic = [
            c for c in dynamic_dtype_configs() if engine == "fbgemm" or c.weight_dtype == torch.int8
        ]

    @fxquant.hookimpl
    def fxquant_pattern_configs(self, backend: str) -> list[BackendPatternConfig] | None:
        if backend != self.name:
            return None
        return engine_pattern_configs(torch.uint8, torch.int8, self.dynamic)

    @fxquant.hookimpl
    def fxquant_lowering_kernels(self, backend: str) -> list[LoweringRule] | None:
        if backend != self.name:
            return None
        return lowering_rules(self.engine, self.fxquant_pattern_configs(backend) or [])

    @fxquant.hookimpl
    def fxquant_default_qconfig_mapping(self, backend: str, is_qat: bool) -> QConfigMapping | None:
        if backend != self.name:
            return None
        # 7-bit activations: fbgemm's int16 accumulation pairs cannot saturate on calibrated
        # values; 7-bit weights too where it sums pairs in int16 (CPUs without VNNI, see
        # fxquant.lowering.kernels.cpu, and its depthwise conv on every CPU), or its rules
        # decline: values beyond the calibrated range still reach 255
        activation: dict[str, Any] = {"dtype": torch.uint8, "quant_min": 0, "quant_max": 127}
        exact = self.engine != "fbgemm"
        low, high = (-127, 127) if exact else cpu.SEVEN_BIT_WEIGHT
        weight: dict[str, Any] = {"dtype": torch.int8, "quant_min": low, "quant_max": high}
        return engine_default_qconfig_mapping(is_qat, activation=activation, weight=weight)


@pytest.fixture(params=ENGINES, scope="module")
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The name of a registered backend on each engine (unregistered afterwards)."""
    plugin = EngineBackend(request.param)
    fxquant.register_plugin(plugin, backend=plugin.name)
    try:
        yield plugin.name
    finally:
        fxquant.unregister_plugin(plugin)
