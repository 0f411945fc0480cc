"""A backend's hook implementations written from its data: :func:`backend_hooks`.

Most of a backend plugin's hooks hand over data its other modules build (patterns, kernels,
the default mapping, a deployment), each for its own backend only. ``backend_hooks`` writes
them once; the plugin module assigns the ones it has to its attributes of the same names,
which is where pluggy reads them::

    fxquant_plugin_api = 1
    hooks = backend_hooks("mine", pattern_configs=..., default_qconfig_mapping=...)
    fxquant_pattern_configs = hooks.fxquant_pattern_configs
    fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping

A hook the plugin does not assign is not implemented (``None`` here when not given).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import fx

from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule
from fxquant.registry.answers import Deployment, GraphMode, only_for
from fxquant.registry.hookspecs import hookimpl

__all__ = ["BackendHooks", "backend_hooks"]

GraphModeHook = Callable[[str, fx.GraphModule, QConfigMapping, bool], GraphMode | None]


@dataclass(frozen=True, slots=True)
class BackendHooks:
    """The hook implementations of one backend (see :func:`backend_hooks`).

    Example:
        >>> hooks = backend_hooks("mine", pattern_configs=list,
        ...                       default_qconfig_mapping=lambda is_qat: QConfigMapping())
        >>> hooks.fxquant_pattern_configs("mine"), hooks.fxquant_pattern_configs("x86")
        ([], None)
    """

    fxquant_pattern_configs: Callable[[str], list[BackendPatternConfig] | None]
    fxquant_default_qconfig_mapping: Callable[[str, bool], QConfigMapping | None]
    fxquant_lowering_kernels: Callable[[str], list[LoweringRule] | None] | None = None
    fxquant_deployment: Callable[[str], Deployment | None] | None = None
    fxquant_graph_mode: GraphModeHook | None = None


def backend_hooks(
    backend: str,
    *,
    pattern_configs: Callable[[], list[BackendPatternConfig]],
    default_qconfig_mapping: Callable[[bool], QConfigMapping],
    lowering_kernels: Callable[[], list[LoweringRule]] | None = None,
    deployment: Callable[[], Deployment] | None = None,
    graph_mode: Callable[[fx.GraphModule, bool], GraphMode | None] | None = None,
) -> BackendHooks:
    """The hooks of backend ``backend``, each answering for it only (``None`` for others).

    Args:
        backend: the backend's name.
        pattern_configs: its patterns, built anew on each call (the hook's callers expect it).
        default_qconfig_mapping: its default mapping, given ``is_qat``.
        lowering_kernels: its lowering rules; ``None``: the hook is not written.
        deployment: how it runs converted models (called when asked, so a toolchain the
            deployment imports loads then); ``None``: the hook is not written.
        graph_mode: the mode it picks for a traced graph, given the graph and ``is_qat``
            (the flow merges it under the user's mapping); ``None``: the hook is not written.

    Returns:
        The hooks, to assign to the plugin module's attributes of the same names.

    Example:
        >>> hooks = backend_hooks("mine", pattern_configs=list,
        ...                       default_qconfig_mapping=lambda is_qat: QConfigMapping())
        >>> hooks.fxquant_lowering_kernels is None
        True
    """

    def written(hook: Callable[..., Any], doc: str | None) -> Any:
        hook.__doc__ = doc  # before only_for: its wrapper copies it
        return hookimpl(only_for(backend)(hook))

    def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig]:
        return pattern_configs()

    def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping:
        return default_qconfig_mapping(is_qat)

    kernels_hook = deployment_hook = graph_mode_hook = None
    if lowering_kernels is not None:

        def fxquant_lowering_kernels(backend: str) -> list[LoweringRule]:
            return lowering_kernels()

        kernels_hook = written(fxquant_lowering_kernels, f"{backend}'s lowering rules.")
    if deployment is not None:

        def fxquant_deployment(backend: str) -> Deployment:
            return deployment()

        deployment_hook = written(fxquant_deployment, deployment.__doc__)
    if graph_mode is not None:

        def fxquant_graph_mode(
            backend: str, model: fx.GraphModule, qconfig_mapping: QConfigMapping, is_qat: bool
        ) -> GraphMode | None:
            del qconfig_mapping  # the flow merges the mode under the user's entries (the hookspec)
            return graph_mode(model, is_qat)

        graph_mode_hook = written(fxquant_graph_mode, graph_mode.__doc__)
    return BackendHooks(
        written(fxquant_pattern_configs, f"The patterns {backend} quantizes."),
        written(fxquant_default_qconfig_mapping, f"{backend}'s default mapping, given is_qat."),
        kernels_hook,
        deployment_hook,
        graph_mode_hook,
    )
