"""The built-in ``reference`` backend: a plugin like any other (hookimpls only).

It contributes the generic pattern configs every backend starts from (built
by ``fxquant.patterns``) and their default mapping, and no lowering kernels, so
``convert_fx`` with it gives the reference model. Registered by the core's own
entry point ``reference = "fxquant.registry.reference"``; its hooks are written by
:func:`fxquant.registry.backend_hooks.backend_hooks`, as the plugins' are.

Example:
    >>> len(fxquant_pattern_configs("reference")) > 0
    True
    >>> fxquant_default_qconfig_mapping("x86", is_qat=False) is None
    True
"""

from __future__ import annotations

from fxquant.patterns import reference_default_qconfig_mapping, reference_pattern_configs
from fxquant.registry.backend_hooks import backend_hooks

__all__ = ["fxquant_default_qconfig_mapping", "fxquant_pattern_configs"]

fxquant_plugin_api = 1
BACKEND = "reference"

hooks = backend_hooks(
    BACKEND,
    pattern_configs=reference_pattern_configs,
    default_qconfig_mapping=reference_default_qconfig_mapping,
)
fxquant_pattern_configs = hooks.fxquant_pattern_configs
fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping
