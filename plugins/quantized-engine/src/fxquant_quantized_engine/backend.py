"""A backend on a quint8 engine, from its data: :func:`engine_plugin` writes its hooks.

fbgemm and qnnpack differ in their engine, their patterns' dtype constraints and their
default mapping; their hooks are :func:`fxquant.registry.backend_hooks.backend_hooks` with
the engine's lowering rules. A backend's ``plugin.py`` states its data and assigns the
hooks (pluggy reads a plugin module's attributes by their hook names)::

    fxquant_plugin_api = 1
    hooks = engine_plugin("fbgemm", pattern_configs=..., default_qconfig_mapping=...)
    fxquant_pattern_configs = hooks.fxquant_pattern_configs
    fxquant_lowering_kernels = hooks.fxquant_lowering_kernels
    fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping

Each hook answers for its backend only; the lowering rules are
:func:`~fxquant_quantized_engine.rules.lowering_rules` on the engine, for the backend's
own patterns.
"""

from __future__ import annotations

from collections.abc import Callable

from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule
from fxquant.registry.backend_hooks import BackendHooks, backend_hooks

from fxquant_quantized_engine.rules import lowering_rules

__all__ = ["EngineHooks", "engine_plugin"]


EngineHooks = BackendHooks
"""The hooks of a backend on a quint8 engine (:func:`engine_plugin` returns them)."""


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
        >>> from fxquant.patterns.generic import dynamic_dtype_configs
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

    def kernels() -> list[LoweringRule]:
        rules: list[LoweringRule] = lowering_rules(engine, pattern_configs())
        return rules

    return backend_hooks(
        backend,
        pattern_configs=pattern_configs,
        default_qconfig_mapping=default_qconfig_mapping,
        lowering_kernels=kernels,
    )
