"""The fxquant hook implementations of the x86 backend (hooks only; data lives next door)."""

from __future__ import annotations

from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.registry import Deployment, GraphMode, hookimpl, only_for
from fxquant.registry.backend_hooks import backend_hooks
from torch import fx

from fxquant_x86.graph_mode import graph_mode
from fxquant_x86.kernels import x86_lowering_rules
from fxquant_x86.patterns import shared_pattern_configs
from fxquant_x86.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "x86"


def _pattern_configs() -> list[BackendPatternConfig]:
    """The patterns x86 quantizes (the registry keeps copies of the shared build)."""
    return list(shared_pattern_configs())


def _deployment() -> Deployment:
    """The reference model compiled by inductor with freezing: its x86 int8 fusions."""
    from fxquant_x86.compiled import deploy  # inductor loads only when deploying

    return Deployment("inductor (torch.compile, freezing)", deploy=deploy)


# int8 conv / pooling / Linear / matmul, norms, softmax and residual adds float;
# fxquant-onednn's kernels for every x86 pattern
hooks = backend_hooks(
    BACKEND,
    pattern_configs=_pattern_configs,
    default_qconfig_mapping=default_qconfig_mapping,
    lowering_kernels=x86_lowering_rules,
    deployment=_deployment,
)
fxquant_pattern_configs = hooks.fxquant_pattern_configs
fxquant_lowering_kernels = hooks.fxquant_lowering_kernels
fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping
fxquant_deployment = hooks.fxquant_deployment


@hookimpl
@only_for(BACKEND)
def fxquant_graph_mode(
    backend: str, model: fx.GraphModule, qconfig_mapping: QConfigMapping, is_qat: bool
) -> GraphMode | None:
    """Attention in bfloat16 on a bfloat16 CPU (``fxquant_x86.graph_mode``), except in the
    blocks where the user's mapping sets a node its own way (so it reads the mapping)."""
    return graph_mode(model, qconfig_mapping, is_qat)
