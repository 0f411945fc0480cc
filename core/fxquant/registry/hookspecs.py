"""The fxquant plugin specification: the hooks a backend plugin implements.

A plugin is a module (or any object) whose functions are marked with
``fxquant.hookimpl`` and named after the hooks below. It is announced by an
entry point in the group ``fxquant.backends`` whose name is the backend it
contributes to::

    [project.entry-points."fxquant.backends"]
    mybackend = "my_package.plugin"

Every hook receives the backend's name, so one module can serve several
backends; a hook with nothing to say for that name returns ``None``.

Merge rule, the same for every hook: the answers of all plugins registered for
a backend are merged in call order (the core's built-in plugins first, then
installed distributions sorted by name, then ``register_plugin`` calls in
order; pluggy's ``tryfirst``/``trylast`` move a plugin to the front or the
back). Two plugins answering for the same pattern (or both returning a default
mapping) is a ``PluginConflictError``, unless the later answer is wrapped in
``Override(...)``, which replaces the earlier one and is shown by
``fxquant show``.

A plugin may declare the plugin-API versions it was written for with a module
attribute ``fxquant_plugin_api = 1`` (an int or a tuple of ints); omitting it
means version 1. ``PLUGIN_API_VERSIONS`` lists the versions this fxquant offers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

from fxquant.errors import ConfigError, ConfigTypeError

if TYPE_CHECKING:
    from fxquant.config.backend import BackendPatternConfig
    from fxquant.config.qconfig_mapping import QConfigMapping

__all__ = [
    "PLUGIN_API_VERSIONS",
    "PROJECT_NAME",
    "LoweringRule",
    "Override",
    "fxquant_default_qconfig_mapping",
    "fxquant_lowering_kernels",
    "fxquant_pattern_configs",
    "hookimpl",
    "hookspec",
]

PROJECT_NAME = "fxquant"
# Versions of the hook API this fxquant can call; a plugin names the ones it targets.
PLUGIN_API_VERSIONS: tuple[int, ...] = (1,)

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@dataclass(frozen=True, slots=True)
class LoweringRule:
    """How a backend lowers one reference pattern to its own kernel.

    The flow matches ``pattern`` around ``dequantize -> float op -> quantize``
    in a reference model and calls ``build`` with the match to get the module
    or callable that replaces it.

    Args:
        pattern: the float op(s), in the simple pattern format of
            ``BackendPatternConfig`` (or the reversed nested format when
            ``complex_format`` is True).
        build: builds the replacement kernel for one match.
        name: a short name shown by ``fxquant show`` (e.g. ``"qlinear"``).
        complex_format: whether ``pattern`` is in the reversed nested format.

    Raises:
        ConfigTypeError: when ``build`` is not callable or ``name`` not a str.
        ConfigError: when ``name`` is empty or ``pattern`` is not a valid pattern.

    Example:
        >>> import torch
        >>> rule = LoweringRule(torch.nn.Linear, build=lambda match: match, name="qlinear")
        >>> rule.name
        'qlinear'
    """

    pattern: Any
    build: Callable[..., Any]
    name: str
    complex_format: bool = False

    def __post_init__(self) -> None:
        if self.pattern is None:
            msg = f"LoweringRule {self.name!r} needs a pattern, got None; pass e.g. torch.nn.Linear"
            raise ConfigError(msg)
        if not callable(self.build):
            msg = (
                f"LoweringRule build must be callable, got {self.build!r} of type "
                f"{type(self.build).__name__}; pass a function that builds the kernel"
            )
            raise ConfigTypeError(msg)
        if not isinstance(self.name, str):
            msg = f"LoweringRule name must be a str, got {self.name!r}"
            raise ConfigTypeError(msg)
        if not self.name:
            msg = "LoweringRule name must not be empty; give the kernel a short name"
            raise ConfigError(msg)
        _ = self.key  # validates the pattern now, not when the flow first needs it

    @property
    def key(self) -> Hashable:
        """The pattern in the reversed nested format: the key for matching and conflicts."""
        # imported here: `import fxquant.registry` must not need the config package
        from fxquant.config.pattern import simple_to_complex, validate_complex

        key: Hashable = (
            validate_complex(self.pattern)
            if self.complex_format
            else simple_to_complex(self.pattern)
        )
        return key


@dataclass(frozen=True, slots=True)
class Override:
    """Marks a hook answer that deliberately replaces another plugin's answer.

    Wrap a ``BackendPatternConfig``, a ``LoweringRule`` or a ``QConfigMapping``
    in ``Override`` to say "this replaces what an earlier plugin gave for the
    same pattern". Without it, two plugins answering for one pattern is a
    ``PluginConflictError``. An ``Override`` with nothing to replace is fine.

    Args:
        item: the pattern config, lowering rule or qconfig mapping.
        reason: an optional note shown by ``fxquant show``.

    Example:
        >>> import torch
        >>> Override(LoweringRule(torch.nn.Linear, build=print, name="fast")).item.name
        'fast'
    """

    item: Any
    reason: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.item, Override):
            msg = f"Override wraps another Override {self.item!r}; wrap the item once"
            raise ConfigTypeError(msg)


# --- hook specifications: the docstrings are the plugin author's reference ----------------------


@hookspec
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig | Override] | None:
    """Return the patterns this plugin supports on ``backend``.

    Called once per backend, the first time ``get_backend_config(backend)``
    (or ``fxquant show``) needs it, and again after ``refresh()`` or a
    ``register_plugin`` for that backend.

    :param backend: the backend being assembled (the entry-point name).

    Return a list of ``BackendPatternConfig``, each with its dtype configs,
    observation type and, when needed, fuser, QAT and reference modules.
    ``None`` means "nothing for this backend".

    Merge rule: the lists of all plugins of the backend are joined in call
    order. A pattern configured by two plugins is a ``PluginConflictError``
    naming both distributions, unless the later one returns it wrapped in
    ``Override(config)``.

    Example::

        @fxquant.hookimpl
        def fxquant_pattern_configs(backend):
            if backend != "mybackend":
                return None
            return [BackendPatternConfig(torch.nn.Linear).add_dtype_config(int8)]
    """


@hookspec
def fxquant_lowering_kernels(backend: str) -> list[LoweringRule | Override] | None:
    """Return how to lower reference patterns to this plugin's kernels on ``backend``.

    Called when the backend is assembled, like ``fxquant_pattern_configs``;
    ``convert_fx`` uses the rules to replace each matched
    ``dequantize -> float op -> quantize`` pattern with the kernel.

    :param backend: the backend being assembled.

    Return a list of ``LoweringRule(pattern, build, name)``. ``None`` means
    "no kernels": the converted model stays a reference model for those
    patterns.

    Merge rule: as for ``fxquant_pattern_configs``, one rule per pattern; a
    later plugin replaces an earlier rule only with ``Override(rule)``.

    Example::

        @fxquant.hookimpl
        def fxquant_lowering_kernels(backend):
            if backend != "mybackend":
                return None
            return [LoweringRule(torch.nn.Linear, build=build_qlinear, name="qlinear")]
    """


@hookspec
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | Override | None:
    """Return the ``QConfigMapping`` that ``get_default_qconfig_mapping`` gives for ``backend``.

    Called by ``get_default_qconfig_mapping(backend, is_qat)`` on every call
    (and by ``fxquant show``); return a new mapping each time, since callers
    may change the one they get.

    :param backend: the backend asked for.
    :param is_qat: True for quantization-aware training (fake-quantize
        modules), False for post-training quantization (observers).

    Return a mapping whose qconfigs the backend's dtype configs accept.
    ``None`` means "no opinion"; if every plugin says ``None``,
    ``get_default_qconfig_mapping`` raises ``MissingDefaultQConfigError``.

    Merge rule: one plugin answers; a second answer is a
    ``PluginConflictError`` unless it is wrapped in ``Override(mapping)``.

    Example::

        @fxquant.hookimpl
        def fxquant_default_qconfig_mapping(backend, is_qat):
            if backend != "mybackend":
                return None
            return QConfigMapping().set_global(my_qconfig)
    """
