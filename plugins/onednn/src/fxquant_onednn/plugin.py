"""The fxquant hook implementations of the onednn backend (hooks only; data lives next door)."""

from __future__ import annotations

from fxquant.registry.backend_hooks import backend_hooks

from fxquant_onednn.kernels import lowering_rules
from fxquant_onednn.patterns import pattern_configs
from fxquant_onednn.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "onednn"

# full-range uint8 activations, per-channel symmetric int8 weights; a oneDNN kernel for
# every pattern
hooks = backend_hooks(
    BACKEND,
    pattern_configs=pattern_configs,
    default_qconfig_mapping=default_qconfig_mapping,
    lowering_kernels=lambda: lowering_rules(pattern_configs()),
)
fxquant_pattern_configs = hooks.fxquant_pattern_configs
fxquant_lowering_kernels = hooks.fxquant_lowering_kernels
fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping
