"""The fxquant hook implementations of the ``qnnpack`` backend (hooks only)."""

from __future__ import annotations

import fxquant.registry
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule

from fxquant_qnnpack.kernels import lowering_rules
from fxquant_qnnpack.patterns import pattern_configs
from fxquant_qnnpack.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "qnnpack"


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    """The patterns qnnpack quantizes."""
    return pattern_configs()


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_lowering_kernels(backend: str) -> list[LoweringRule] | None:
    """QNNPACK kernels for every reference pattern of the backend."""
    return lowering_rules()


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    """The default mapping: full-range activations, per-channel symmetric weights."""
    return default_qconfig_mapping(is_qat)
