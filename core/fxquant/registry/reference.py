"""The built-in ``reference`` backend: a plugin like any other (hookimpls only).

It contributes the generic pattern configs every backend starts from (built
by ``fxquant.patterns``) and no lowering kernels, so ``convert_fx`` with it
gives the reference model. Registered by the core's own entry point
``reference = "fxquant.registry.reference"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxquant.patterns import reference_default_qconfig_mapping, reference_pattern_configs
from fxquant.registry.hookspecs import hookimpl

if TYPE_CHECKING:
    from fxquant.config.backend import BackendPatternConfig
    from fxquant.config.qconfig_mapping import QConfigMapping

__all__ = ["fxquant_default_qconfig_mapping", "fxquant_pattern_configs"]

fxquant_plugin_api = 1
BACKEND = "reference"


@hookimpl
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    """The generic patterns, for the ``reference`` backend only.

    Example:
        >>> len(fxquant_pattern_configs("reference")) > 0
        True
    """
    if backend != BACKEND:
        return None
    return reference_pattern_configs()


@hookimpl
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    """The default mapping whose qconfigs the generic patterns accept.

    Example:
        >>> fxquant_default_qconfig_mapping("x86", is_qat=False) is None
        True
    """
    if backend != BACKEND:
        return None

    return reference_default_qconfig_mapping(is_qat)
