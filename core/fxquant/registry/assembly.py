"""One backend from the answers of its plugins: call each hook, check, merge.

Each backend gets its own pluggy ``PluginManager`` holding only the plugins
registered for it, so a plugin that ignores ``backend`` cannot leak into
another backend. Hook implementations are called one at a time (in pluggy's
order, tryfirst/trylast included) so that a failure names its plugin::

    plugins (builtin, dists sorted, registered)  ->  answers per plugin
        -> checked (types, valid patterns)  ->  merged by normalized pattern
        -> lowering rules checked against the reference model the patterns make
        -> BackendConfig + lowering rules + who configured / overrode what
"""

from __future__ import annotations

import reprlib
import sys
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy
import torch

from fxquant.config.backend import BackendConfig, BackendPatternConfig
from fxquant.config.pattern import complex_to_simple, pattern_str
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import MissingDefaultQConfigError, PluginConflictError, PluginError
from fxquant.lowering import LoweringRule
from fxquant.registry import hookspecs
from fxquant.registry.answers import Deployment, GraphMode, Override
from fxquant.registry.loading import LoadedPlugin, PluginInfo

__all__ = [
    "AssembledBackend",
    "Hooks",
    "Origin",
    "assemble",
    "copied_config",
    "default_qconfig_mapping",
    "graph_mode",
    "hook_manager",
]

_PATTERN_HOOK = "fxquant_pattern_configs"
_KERNEL_HOOK = "fxquant_lowering_kernels"
_QCONFIG_HOOK = "fxquant_default_qconfig_mapping"
_DEPLOYMENT_HOOK = "fxquant_deployment"
_GRAPH_MODE_HOOK = "fxquant_graph_mode"


@dataclass(frozen=True, slots=True)
class Origin:
    """Who configured a pattern, and whose answers it replaced with ``Override``.

    Example:
        >>> Origin("fxquant-x86-extra", overrides=("fxquant-x86",)).overrides
        ('fxquant-x86',)
    """

    source: str
    overrides: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Hooks:
    """A backend's plugins in one pluggy manager (``hook_manager``), asked one at a time.

    Example:
        >>> hook_manager("b", []).answers("fxquant_deployment")
        []
    """

    backend: str
    manager: pluggy.PluginManager
    members: Mapping[str, PluginInfo]

    def answers(self, hook: str, **kwargs: Any) -> list[tuple[PluginInfo, Any]]:
        """Each plugin's answer but None, in pluggy's order; a raise is the plugin's PluginError.

        ``kwargs``: the hook's arguments but ``backend``, which is the backend's name.
        """
        kwargs["backend"] = self.backend
        answers = []
        # reversed: pluggy's call order, tryfirst/trylast applied
        for impl in reversed(getattr(self.manager.hook, hook).get_hookimpls()):
            info = self.members[impl.plugin_name]
            if impl.hookwrapper or impl.wrapper:
                wrapper = "declares a wrapper (fxquant hooks take none)"
                raise _plugin_error(info, hook, wrapper, None)
            try:
                answer = impl.function(*(kwargs[arg] for arg in impl.argnames))
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # SystemExit too: a hook's sys.exit() is its failure
                raise _plugin_error(info, hook, "raised", error) from error
            if answer is not None:
                answers.append((info, answer))
        return answers

    def single(
        self, hook: str, expected: type, what: tuple[str, str], **kwargs: Any
    ) -> tuple[PluginInfo, Any] | None:
        """Ask ``hook``, which only one plugin may answer (a later ``Override`` replaces it);
        the answering plugin and its answer, or None.

        ``what``: how the conflict message names the answer, as (``"a default
        QConfigMapping"``, ``"mapping"``).
        """
        chosen: tuple[PluginInfo, Any] | None = None
        for info, answer in self.answers(hook, **kwargs):
            item = _unwrapped(info, hook, answer, expected, f"a {expected.__name__}")
            if chosen is not None and not isinstance(answer, Override):
                msg = (
                    f"backend {self.backend!r}: both {chosen[0].label} and {info.label} "
                    f"return {what[0]}; the later plugin must wrap its {what[1]} in "
                    "fxquant.registry.Override(...) to replace it"
                )
                raise PluginConflictError(msg)
            chosen = (info, item)
        return chosen


@dataclass(frozen=True)
class AssembledBackend:
    """A backend as its plugins made it: configs, kernels, provenance, manager.

    Example:
        >>> backend = assemble("empty", [])
        >>> backend.config.configs
        []
    """

    name: str
    config: Any  # the BackendConfig (its class is typed by its owner module)
    lowering_rules: tuple[LoweringRule, ...]
    pattern_origins: Mapping[Hashable, Origin]
    kernel_origins: Mapping[Hashable, Origin]
    plugins: tuple[PluginInfo, ...]
    hooks: Hooks = field(repr=False)
    deployment: Deployment | None = None
    """How the backend runs converted models outside PyTorch eager (``fxquant_deployment``)."""


@dataclass
class _Merged:
    items: dict[Hashable, Any] = field(default_factory=dict)
    origins: dict[Hashable, Origin] = field(default_factory=dict)
    owners: dict[Hashable, PluginInfo] = field(default_factory=dict)


def _show(key: Hashable) -> str:

    simple = complex_to_simple(key)
    return pattern_str(key if simple is None else simple)


def _plugin_error(
    info: PluginInfo, hook: str, problem: str, cause: BaseException | None
) -> PluginError:
    msg = f"{info.label} {problem} in hook {hook} for backend {info.backend!r}"
    if cause is not None:
        msg += f": {type(cause).__name__}: {cause}"
    error = PluginError(msg)
    error.__cause__ = cause
    return error


def hook_manager(backend: str, plugins: Sequence[LoadedPlugin]) -> Hooks:
    """A pluggy manager holding ``backend``'s ``plugins``, whose hooks pluggy checks as each
    registers.

    Raises:
        PluginError: pluggy refused a plugin (an unknown hook, wrong arguments).

    Example:
        >>> hook_manager("b", []).members
        {}
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    members: dict[str, PluginInfo] = {}
    # reversed: pluggy calls the last registered first; we want builtin, then dists sorted
    for index, loaded in reversed(list(enumerate(plugins))):
        plugin_name = f"{index}:{loaded.info.label}"
        members[plugin_name] = loaded.info
        try:
            manager.register(loaded.plugin, name=plugin_name)
            manager.check_pending()
        except (pluggy.PluginValidationError, ValueError) as error:
            raise _plugin_error(loaded.info, "registration", "was refused", error) from error
    return Hooks(backend, manager, members)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80  # long enough for a qualified class name


def _wrong_type(
    info: PluginInfo, hook: str, answer: object, expected: str, item: bool = False
) -> PluginError:
    what = f"an item {_SHORT.repr(answer)} of type {type(answer).__name__}" if item else None
    problem = f"returned {what or _SHORT.repr(answer)} (expected {expected}, or None)"
    return _plugin_error(info, hook, problem, None)


def _unwrapped(
    info: PluginInfo, hook: str, raw: object, expected: type, what: str, item: bool = False
) -> Any:
    """``raw``'s answer (an ``Override``'s item), refused unless it is an ``expected``."""
    answer = raw.item if isinstance(raw, Override) else raw
    if not isinstance(answer, expected):
        raise _wrong_type(info, hook, raw, what, item)
    return answer


def _add(merged: _Merged, key: Hashable, raw: Any, info: PluginInfo, hook: str) -> None:
    override = raw if isinstance(raw, Override) else None
    reason = override.reason if override is not None else ""
    previous = merged.owners.get(key)
    if previous is None:
        origin = Origin(info.source, reason=reason)
    elif previous is info:
        problem = f"returned pattern {_show(key)} twice"
        raise _plugin_error(info, hook, problem, None)
    elif override is None:
        msg = (
            f"backend {info.backend!r}: pattern {_show(key)} is configured by both "
            f"{previous.label} and {info.label} (hook {hook}); the later plugin must return "
            "it wrapped in fxquant.registry.Override(...) to replace it, or disable one "
            "with FXQUANT_DISABLE_PLUGINS"
        )
        raise PluginConflictError(msg)
    else:
        before = merged.origins[key]
        origin = Origin(info.source, (*before.overrides, before.source), reason)
    merged.items[key] = raw.item if override is not None else raw
    merged.origins[key] = origin
    merged.owners[key] = info


def _merge(hooks: Hooks, hook: str, expected: type, key: str) -> _Merged:
    """Ask ``hook`` of every plugin for a list of ``expected``, merged by attribute ``key``."""
    merged = _Merged()
    what = f"a list of {expected.__name__}"
    for info, answer in hooks.answers(hook):
        if not isinstance(answer, (list, tuple)):
            raise _wrong_type(info, hook, answer, what)
        for raw in answer:
            item = _unwrapped(info, hook, raw, expected, what, item=True)
            try:
                item_key = getattr(item, key)
            except Exception as error:
                problem = f"returned an invalid {expected.__name__} {item!r}"
                raise _plugin_error(info, hook, problem, error) from error
            _add(merged, item_key, raw, info, hook)
    return merged


def _qualified(cls: type) -> str:
    """The shortest import path of ``cls`` (``torch.nn.Linear``, not ``torch.nn.modules...``)."""
    parts = cls.__module__.split(".")
    for cut in range(1, len(parts) + 1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None and getattr(module, cls.__qualname__, None) is cls:
            return f"{module.__name__}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _quantizes_every_weight(config: Any) -> bool:
    """Every dtype config gives the weight an integer or half dtype: convert always swaps it."""
    weights = [d.weight_dtype for d in config.dtype_configs]
    return bool(weights) and all(w is not None and w != torch.float32 for w in weights)


def _is_fused_class(cls: type) -> bool:
    # a fused module (LinearReLU, ConvReLU2d...) stays, holding the reference module inside
    return issubclass(cls, torch.nn.Sequential)


def _replaced_in_reference(patterns: _Merged) -> dict[Hashable, str]:
    """Pattern parts that never reach a reference model with quantized nodes, and what does.

    A weighted float module whose pattern config names a reference module is swapped for it
    (``torch.nn.Linear`` -> ``fxquant.nn.reference.Linear``), a QAT module is converted back,
    and a fusion pattern (``(Linear, ReLU)``) is one fused module by then.
    """
    replaced: dict[Hashable, str] = {}
    for key, config in patterns.items.items():
        reference = config.reference_quantized_module
        swapped = reference is not None and _quantizes_every_weight(config)
        if isinstance(key, type) and not _is_fused_class(key):
            if callable(getattr(key, "to_float", None)):  # QAT: convert turns it back to float
                after = _qualified(reference) if reference is not None else "the float module"
                replaced[key] = f"{after} (convert turns QAT modules back to float)"
            elif swapped:
                replaced[key] = f"{_qualified(reference)} (convert swaps {_qualified(key)} for it)"
        qat = config.qat_module
        if isinstance(qat, type) and isinstance(key, type) and qat is not key:
            back: type = key if _is_fused_class(key) or not swapped else reference
            replaced.setdefault(qat, f"{_qualified(back)} (convert turns QAT modules back)")
        fused = config.fused_module
        if isinstance(fused, type) and key != fused:
            replaced.setdefault(key, f"{_qualified(fused)} (fusion makes that pattern one module)")
    return replaced


def _parts(key: Hashable) -> list[Hashable]:
    if isinstance(key, tuple):
        return [key, *(part for item in key for part in _parts(item))]
    return [key]


def _check_rules_can_match(patterns: _Merged, kernels: _Merged) -> None:
    """Refuse a quantized rule whose pattern cannot occur in a reference model.

    Such a rule would register and never match: ``fxquant check`` would skip it with
    nothing failed, the backend would look complete and its models stay reference.
    """
    replaced = _replaced_in_reference(patterns)
    for key, rule in kernels.items.items():
        if not rule.quantized:
            continue  # float rules match ops that stayed float: nothing was swapped
        for part in _parts(key):
            instead = replaced.get(part)
            if instead is None:
                continue
            shown = _show(part) if isinstance(part, tuple) else _qualified(part)  # type: ignore[arg-type]
            problem = (
                f"returned lowering rule {rule.name!r} whose pattern {_show(key)} can never "
                f"occur in a reference model: {shown} is not there once converted; "
                f"write {instead} in the pattern instead"
            )
            raise _plugin_error(kernels.owners[key], _KERNEL_HOOK, problem, None)


def copied_config(name: str, configs: Iterable[BackendPatternConfig]) -> BackendConfig:
    """A new ``BackendConfig`` named ``name`` holding copies of ``configs``.

    The registry copies twice, once per owner: at assembly, as the plugin keeps its objects
    and may change them later; on each hand-out, as the caller may change what it gets.

    Example:
        >>> copied_config("b", [BackendPatternConfig("relu")]).configs[0].pattern
        'relu'
    """
    return BackendConfig(name).set_backend_pattern_configs(c.copy() for c in configs)


def assemble(name: str, plugins: Sequence[LoadedPlugin]) -> AssembledBackend:
    """Ask every loaded plugin of backend ``name`` and merge the answers.

    Args:
        name: the backend.
        plugins: its plugins that loaded, in assembly order.

    Raises:
        PluginError: a plugin was refused by pluggy, raised, or answered wrongly
            (a lowering rule whose pattern can never occur in a reference model
            included: ``torch.nn.Linear`` where the model holds
            ``fxquant.nn.reference.Linear``).
        PluginConflictError: two plugins configured one pattern without ``Override``.

    Example:
        >>> assemble("nothing", []).lowering_rules
        ()
    """
    hooks = hook_manager(name, plugins)
    # a config without a pattern raises in normalized_pattern: _merge names the plugin
    patterns = _merge(hooks, _PATTERN_HOOK, BackendPatternConfig, "normalized_pattern")
    kernels = _merge(hooks, _KERNEL_HOOK, LoweringRule, "key")
    _check_rules_can_match(patterns, kernels)
    what = ("a Deployment", "Deployment")
    deployment = hooks.single(_DEPLOYMENT_HOOK, Deployment, what)
    return AssembledBackend(
        name=name,
        # _merge checked each config's pattern: building the BackendConfig cannot fail
        config=copied_config(name, patterns.items.values()),
        lowering_rules=tuple(kernels.items.values()),
        pattern_origins=dict(patterns.origins),
        kernel_origins=dict(kernels.origins),
        plugins=tuple(p.info for p in plugins),
        hooks=hooks,
        deployment=None if deployment is None else deployment[1],
    )


def default_qconfig_mapping(backend: AssembledBackend, is_qat: bool) -> Any:
    """Ask the backend's plugins for their default ``QConfigMapping``.

    Raises:
        MissingDefaultQConfigError: no plugin of the backend answers.
        PluginError: a plugin raised or returned something else than a mapping.
        PluginConflictError: two plugins answer and the later one did not use ``Override``.

    Example:
        >>> default_qconfig_mapping(assemble("nothing", []), is_qat=False)
        Traceback (most recent call last):
        ...
        fxquant.errors.MissingDefaultQConfigError: backend 'nothing' has no default ...
    """
    what = (f"a default QConfigMapping (is_qat={is_qat})", "mapping")
    chosen = backend.hooks.single(_QCONFIG_HOOK, QConfigMapping, what, is_qat=is_qat)
    if chosen is None:
        kind = "QAT" if is_qat else "post-training"
        msg = (
            f"backend {backend.name!r} has no default {kind} QConfigMapping: none of its plugins "
            f"implements {_QCONFIG_HOOK}; build a QConfigMapping whose qconfigs match the "
            f"dtypes shown by `fxquant show {backend.name}`"
        )
        raise MissingDefaultQConfigError(msg)
    return chosen[1]


def graph_mode(
    backend: AssembledBackend, model: Any, qconfig_mapping: QConfigMapping, is_qat: bool
) -> GraphMode | None:
    """Ask the backend's plugins whether ``model``'s graph gets a mode of its own.

    Raises:
        PluginError: a plugin raised, returned something else than a ``GraphMode``, or
            returned one with ``equalization`` for QAT.
        PluginConflictError: two plugins answer and the later one did not use ``Override``.

    Example:
        >>> graph_mode(assemble("nothing", []), None, QConfigMapping(), is_qat=False) is None
        True
    """
    what = ("a GraphMode for one graph", "mode")
    arguments = {"model": model, "qconfig_mapping": qconfig_mapping, "is_qat": is_qat}
    chosen = backend.hooks.single(_GRAPH_MODE_HOOK, GraphMode, what, **arguments)
    if chosen is None:
        return None
    info, mode = chosen
    if is_qat and mode.equalization is not None:
        problem = (
            f"returned GraphMode {mode.name!r} with an equalization for prepare_qat_fx, "
            "which takes none (return equalization=None when is_qat is True)"
        )
        raise _plugin_error(info, _GRAPH_MODE_HOOK, problem, None)
    return mode  # type: ignore[no-any-return]  # checked by Hooks.single
