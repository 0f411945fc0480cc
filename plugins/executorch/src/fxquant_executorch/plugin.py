"""The fxquant hook implementations of the ``executorch`` backend (hooks only)."""

from __future__ import annotations

import fxquant.registry
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.registry import Deployment

from fxquant_executorch.patterns import pattern_configs
from fxquant_executorch.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "executorch"


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    """The patterns XNNPACK runs on int8."""
    return pattern_configs()


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    """Asymmetric int8 activations, symmetric per-channel int8 weights (XNNPACK's qs8/qc8w)."""
    return default_qconfig_mapping(is_qat)


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_deployment(backend: str) -> Deployment | None:
    """Converted models deploy as ExecuTorch programs run by the XNNPACK delegate."""
    from fxquant_executorch.program import deploy  # executorch loads only when deploying

    return Deployment("ExecuTorch XNNPACK", deploy=deploy)
