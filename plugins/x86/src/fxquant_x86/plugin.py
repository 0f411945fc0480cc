"""The fxquant hook implementations of the x86 backend (hooks only; data lives next door)."""

from __future__ import annotations

import fxquant.registry
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule
from fxquant.registry import Deployment

from fxquant_x86.kernels import x86_lowering_rules
from fxquant_x86.patterns import shared_pattern_configs
from fxquant_x86.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "x86"


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    """The patterns x86 quantizes (the registry keeps copies of the shared build)."""
    return list(shared_pattern_configs())


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_lowering_kernels(backend: str) -> list[LoweringRule] | None:
    """fxquant-onednn's kernels for every x86 pattern."""
    return x86_lowering_rules()


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    """int8 conv / pooling / Linear / matmul; norms, softmax and residual adds float."""
    return default_qconfig_mapping(is_qat)


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_deployment(backend: str) -> Deployment | None:
    """The reference model compiled by inductor with freezing: its x86 int8 fusions (#19)."""
    from fxquant_x86.compiled import deploy  # inductor loads only when deploying

    return Deployment("inductor (torch.compile, freezing)", deploy=deploy)
