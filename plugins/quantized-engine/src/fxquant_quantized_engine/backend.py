"""A backend on a quint8 engine, from its data: :func:`engine_plugin` writes its hooks.

fbgemm and qnnpack differ in their engine, their patterns' dtype constraints and their
default mapping; the hooks that serve those are the same code, written once here. A
backend's ``plugin.py`` states its data and assigns the hooks (pluggy reads a plugin
module's attributes by their hook names)::

    fxquant_plugin_api = 1
    hooks = engine_plugin("fbgemm", pattern_configs=..., default_qconfig_mapping=...)
    fxquant_pattern_configs = hooks.fxquant_pattern_configs
    fxquant_lowering_kernels = hooks.fxquant_lowering_kernels
    fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping

Each hook answers for its backend only (``fxquant.registry.only_for``); the lowering
rules are :func:`~fxquant_quantized_engine.rules.lowering_rules` on the engine, for
the backend's own patterns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import fxquant.registry
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule

from fxquant_quantized_engine.rules import lowering_rules

__all__ = ["EngineHooks", "engine_plugin"]


@dataclass(frozen=True, slots=True)
class EngineHooks:
    """The hook implementations of one backend on a quint8 engine (see :func:`engine_plugin`).

    Example:
        >>> hooks = engine_plugin("fbgemm", pattern_configs=list,
        ...                       default_qconfig_mapping=lambda is_qat: QConfigMapping())
        >>> hooks.fxquant_pattern_configs("fbgemm"), hooks.fxquant_pattern_configs("x86")
        ([], None)
    """

    fxquant_pattern_configs: Callable[[str], list[BackendPatternConfig] | None]
    fxquant_lowering_kernels: Callable[[str], list[LoweringRule] | None]
    fxquant_default_qconfig_mapping: Callable[[str, bool], QConfigMapping | None]


def engine_plugin(
    backend: str,
    *,
    pattern_configs: Callable[[], list[BackendPatternConfig]],
    default_qconfig_mapping: Callable[[bool], QConfigMapping],
    engine: str | None = None,
) -> EngineHooks:
    """The three hooks of backend ``backend`` on PyTorch's quint8 engine ``engine``.

    Args:
        backend: the backend's name, the only one its hooks answer for.
        pattern_configs: its patterns (built anew on each call, as the hook's callers expect).
        default_qconfig_mapping: its default mapping, given ``is_qat``.
        engine: the quantized engine its kernels run on (``torch.backends.quantized.engine``);
            the backend's name when ``None`` (fbgemm's kernels on the fbgemm engine).

    Returns:
        The hooks, to assign to the plugin module's attributes of the same names.

    Example:
        >>> import torch
        >>> from fxquant.patterns.reference import dynamic_dtype_configs
        >>> from fxquant_quantized_engine import engine_pattern_configs
        >>> hooks = engine_plugin(
        ...     "mine", engine="qnnpack",
        ...     pattern_configs=lambda: engine_pattern_configs(
        ...         torch.uint8, torch.int8, dynamic_dtype_configs()),
        ...     default_qconfig_mapping=lambda is_qat: QConfigMapping())
        >>> any(r.name == "qnnpack_linear" for r in hooks.fxquant_lowering_kernels("mine"))
        True
        >>> hooks.fxquant_lowering_kernels("x86") is None
        True
    """
    engine = backend if engine is None else engine

    @fxquant.registry.hookimpl
    @fxquant.registry.only_for(backend)
    def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig]:
        return pattern_configs()

    @fxquant.registry.hookimpl
    @fxquant.registry.only_for(backend)
    def fxquant_lowering_kernels(backend: str) -> list[LoweringRule]:
        rules: list[LoweringRule] = lowering_rules(engine, pattern_configs())
        return rules

    @fxquant.registry.hookimpl
    @fxquant.registry.only_for(backend)
    def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping:
        return default_qconfig_mapping(is_qat)

    fxquant_pattern_configs.__doc__ = f"The patterns {backend} quantizes."
    fxquant_lowering_kernels.__doc__ = f"{engine} kernels for every reference pattern of {backend}."
    fxquant_default_qconfig_mapping.__doc__ = f"{backend}'s default mapping, given is_qat."
    return EngineHooks(
        fxquant_pattern_configs, fxquant_lowering_kernels, fxquant_default_qconfig_mapping
    )
