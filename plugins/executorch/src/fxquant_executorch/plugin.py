"""The fxquant hook implementations of the ``executorch`` backend (hooks only)."""

from __future__ import annotations

from fxquant.registry import Deployment
from fxquant.registry.backend_hooks import backend_hooks

from fxquant_executorch.patterns import pattern_configs
from fxquant_executorch.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "executorch"


def _deployment() -> Deployment:
    """Converted models deploy as ExecuTorch programs run by the XNNPACK delegate."""
    from fxquant_executorch.program import deploy  # executorch loads only when deploying

    return Deployment("ExecuTorch XNNPACK", deploy=deploy)


# the patterns XNNPACK runs on int8; asymmetric int8 activations, symmetric per-channel
# int8 weights (XNNPACK's qs8/qc8w)
hooks = backend_hooks(
    BACKEND,
    pattern_configs=pattern_configs,
    default_qconfig_mapping=default_qconfig_mapping,
    deployment=_deployment,
)
fxquant_pattern_configs = hooks.fxquant_pattern_configs
fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping
fxquant_deployment = hooks.fxquant_deployment
