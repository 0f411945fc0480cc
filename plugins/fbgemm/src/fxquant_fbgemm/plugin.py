"""The fxquant hook implementations of the ``fbgemm`` backend (hooks only)."""

from __future__ import annotations

import fxquant.registry
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule

from fxquant_fbgemm.kernels import lowering_rules
from fxquant_fbgemm.patterns import pattern_configs
from fxquant_fbgemm.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "fbgemm"


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    """The patterns fbgemm quantizes."""
    return pattern_configs()


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_lowering_kernels(backend: str) -> list[LoweringRule] | None:
    """FBGEMM kernels for every reference pattern of the backend."""
    return lowering_rules()


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    """The default mapping: reduce-range activations, per-channel symmetric weights."""
    return default_qconfig_mapping(is_qat)
