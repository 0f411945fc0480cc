"""The fxquant hook implementations of the onednn backend (hooks only; data lives next door)."""

from __future__ import annotations

import fxquant.registry
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule

from fxquant_onednn.kernels import lowering_rules
from fxquant_onednn.patterns import pattern_configs
from fxquant_onednn.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "onednn"


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    """The patterns onednn quantizes."""
    return pattern_configs()


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_lowering_kernels(backend: str) -> list[LoweringRule] | None:
    """A oneDNN kernel for every pattern."""
    return lowering_rules(pattern_configs())


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    """Full-range uint8 activations, per-channel symmetric int8 weights."""
    return default_qconfig_mapping(is_qat)
