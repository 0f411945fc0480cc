"""Backends by name: plugins found through entry points, assembled on demand.

A backend is whatever the plugins registered for its name contribute: their
entry points in the group ``fxquant.backends`` (entry-point name = backend)
plus objects given to ``register_plugin``. ``list_backends`` reads metadata
only; ``get_backend_config`` imports the plugins of that one backend, asks
their hooks (see ``fxquant.registry.hookspecs``) and caches the result.

Environment controls (read at the first scan and at every ``refresh()``):
``FXQUANT_DISABLE_PLUGIN_AUTOLOAD=1`` loads no installed plugin (the core's
built-in ``reference`` stays), ``FXQUANT_PLUGINS=a,b`` keeps only those
distributions, ``FXQUANT_DISABLE_PLUGINS=a,b`` skips those.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from fxquant import plugin_roots
from fxquant.errors import MissingDefaultQConfigError, UnknownBackendError
from fxquant.lowering import LoweringRule
from fxquant.registry.answers import Deployed, Deployment, GraphMode, Override, only_for
from fxquant.registry.hookspecs import PLUGIN_API_VERSIONS, hookimpl, hookspec
from fxquant.registry.install import install_command

if TYPE_CHECKING:
    from fxquant.config.backend import BackendConfig
    from fxquant.config.qconfig import QConfig
    from fxquant.config.qconfig_mapping import QConfigMapping
    from fxquant.registry.manager import Registry
    from fxquant.registry.resolution import ResolvedBackend

__all__ = [
    "PLUGIN_API_VERSIONS",
    "Deployed",
    "Deployment",
    "GraphMode",
    "LoweringRule",
    "Override",
    "default_registry",
    "get_backend_config",
    "get_default_qat_qconfig",
    "get_default_qat_qconfig_mapping",
    "get_default_qconfig",
    "get_default_qconfig_mapping",
    "get_deployment",
    "hookimpl",
    "hookspec",
    "list_backends",
    "only_for",
    "refresh",
    "register_plugin",
    "unregister_plugin",
]

_registry: Registry | None = None
# first use from several threads must build one registry, or a register_plugin made on a
# registry that another thread then replaces is lost
_registry_lock = threading.Lock()


def default_registry() -> Registry:
    """The process-wide registry behind the functions of this module (made on first use).

    Example:
        >>> "reference" in default_registry().list_backends()
        True
    """
    global _registry  # one registry per process, made lazily
    registry = _registry
    if registry is None:
        from fxquant.registry.manager import Registry  # why: import time (0.2 s)

        with _registry_lock:
            if _registry is None:
                _registry = Registry()
            registry = _registry
    return registry


def _plugin_roots() -> frozenset[str]:
    """The top-level packages of enabled entry points (trusted names in JSON configs)."""
    records = [r for r in default_registry().records() if not r.disabled]
    modules = (record.value.split(":", 1)[0].strip() for record in records)  # module:attribute
    return frozenset(module.split(".", 1)[0] for module in modules if module)


plugin_roots.answer_with(_plugin_roots)  # the configs ask through fxquant.plugin_roots


def list_backends() -> list[str]:
    """The installed backend names, sorted, found from metadata without importing any plugin.

    A backend whose plugins are all switched off by the environment controls
    is left out; ``fxquant backends`` still shows it.

    Example:
        >>> "reference" in list_backends()
        True
    """
    return default_registry().list_backends()


def get_backend_config(name: str) -> BackendConfig:
    """The ``BackendConfig`` of backend ``name``, assembled from every plugin contributing to it.

    The first call imports the backend's plugins and asks their hooks; later
    calls reuse that answer. Each call returns a new ``BackendConfig`` of
    copied pattern configs, so changing it never changes the registry.

    Args:
        name: the backend, e.g. ``"reference"`` or ``"x86"``.

    Returns:
        The backend's BackendConfig, named ``name``.

    Raises:
        UnknownBackendError: (a ``KeyError``) no installed plugin provides
            ``name``; the message lists the installed backends and the
            closest match.
        PluginError: a plugin of this backend failed to import or answered
            wrongly; names the distribution, version, entry point and hook.
        PluginConflictError: two plugins configure one pattern and the later
            one did not wrap it in ``Override``.

    Example:
        >>> get_backend_config("reference").name
        'reference'
    """
    return default_registry().get_backend_config(name)  # type: ignore[no-any-return]  # typed by config


def get_default_qconfig_mapping(name: str = "x86", is_qat: bool = False) -> QConfigMapping:
    """The default ``QConfigMapping`` of backend ``name``, from its plugins' hook.

    Args:
        name: the backend; ``"x86"`` when not given, as in torch.ao.
        is_qat: True for quantization-aware training, False for post-training.

    Raises:
        UnknownBackendError: no installed plugin provides ``name`` (the message
            says how to install it, and for the default ``"x86"`` that the
            built-in ``"reference"`` needs no install).
        MissingDefaultQConfigError: no plugin of the backend gives a mapping.
        PluginError: a plugin failed or answered wrongly.

    Example:
        >>> mapping = get_default_qconfig_mapping("reference")
    """
    try:
        return default_registry().get_default_qconfig_mapping(name, is_qat)  # type: ignore[no-any-return]
    except UnknownBackendError as error:
        if name != "x86":
            raise

        msg = (
            f"get_default_qconfig_mapping() uses backend 'x86' when no name is given, as "
            f"torch.ao does, and no installed plugin provides it: install it "
            f"({install_command('x86')}) or name the built-in backend: "
            "get_default_qconfig_mapping('reference')"
        )
        raise UnknownBackendError(msg) from error


def get_default_qat_qconfig_mapping(backend: str = "x86", version: int = 1) -> QConfigMapping:
    """torch.ao's name for ``get_default_qconfig_mapping(backend, is_qat=True)``.

    ``version`` is accepted so that torch.ao calls run unchanged; the backend's
    plugin gives one default mapping, whatever the version (docs/migration.md).

    Example:
        >>> get_default_qat_qconfig_mapping("reference").global_qconfig is not None
        True
    """
    del version  # one default per backend: its plugin's
    return get_default_qconfig_mapping(backend, is_qat=True)


def get_default_qconfig(backend: str = "x86", version: int = 0) -> QConfig:
    """torch.ao's default post-training ``QConfig`` of ``backend``: its mapping's global one.

    Raises:
        MissingDefaultQConfigError: the backend's default mapping has no global qconfig.

    Example:
        >>> mapping = get_default_qconfig_mapping("reference")
        >>> get_default_qconfig("reference") == mapping.global_qconfig
        True
    """
    del version  # one default per backend: its plugin's
    return _global_qconfig(get_default_qconfig_mapping(backend), backend)


def get_default_qat_qconfig(backend: str = "x86", version: int = 1) -> QConfig:
    """torch.ao's default QAT ``QConfig`` of ``backend``: its default QAT mapping's global one.

    Example:
        >>> get_default_qat_qconfig("reference").activation is not None
        True
    """
    del version  # one default per backend: its plugin's
    return _global_qconfig(get_default_qconfig_mapping(backend, is_qat=True), backend)


def _global_qconfig(mapping: QConfigMapping, backend: str) -> QConfig:

    if mapping.global_qconfig is None:
        msg = (
            f"the default QConfigMapping of backend {backend!r} sets no global qconfig; "
            f"use get_default_qconfig_mapping({backend!r}) itself"
        )
        raise MissingDefaultQConfigError(msg)
    return mapping.global_qconfig


def get_deployment(name: str) -> Deployment | None:
    """How backend ``name`` runs converted models outside PyTorch eager, or ``None``.

    ``None`` means the model ``convert_fx`` returns is the deployed one (its
    kernels run in PyTorch). See the ``fxquant_deployment`` hook.

    Raises:
        UnknownBackendError: no installed plugin provides ``name``.

    Example:
        >>> get_deployment("reference") is None
        True
    """
    return default_registry().assembled(name).deployment


def resolve_backend(backend_config: BackendConfig | None, step: str) -> ResolvedBackend:
    """What flow entry point ``step`` needs of ``backend_config``: the one registry call.

    ``None`` is this host's native backend; a config gets the lowering rules,
    deployment and graph modes of the backend it is named after
    (``fxquant.registry.resolution``). A ``NativeBackendWarning`` points at the
    user's call of ``step``, the caller of the function calling this one.

    Raises:
        PluginError: a plugin of the backend failed.

    Example:
        >>> from fxquant.config.backend import BackendConfig
        >>> resolve_backend(BackendConfig("reference"), "prepare_fx").sources
        ('fxquant',)
    """
    return default_registry().resolve(backend_config, step, stacklevel=4)


def register_plugin(plugin: object, *, backend: str) -> None:
    """Register ``plugin`` (a module or object with hook implementations) for ``backend``.

    For notebooks and tests: no entry point is needed, and the next
    ``get_backend_config(backend)`` includes it. Its hooks are checked now.

    Args:
        plugin: the object whose ``fxquant_*`` functions carry ``@hookimpl``.
        backend: the backend it contributes to (a new name creates a backend).

    Raises:
        PluginError: pluggy refuses the hooks (unknown hook, wrong arguments).
        PluginAPIVersionError: the plugin targets a plugin API we do not offer.
        ConfigError: it is already registered for ``backend``.

    Example:
        >>> class Mine:
        ...     @hookimpl
        ...     def fxquant_pattern_configs(self, backend):
        ...         return []
        >>> plugin = Mine()
        >>> register_plugin(plugin, backend="mine")
        >>> get_backend_config("mine").configs
        []
        >>> unregister_plugin(plugin)
    """
    default_registry().register_plugin(plugin, backend)


def unregister_plugin(plugin: object) -> None:
    """Remove a plugin given to ``register_plugin`` from every backend; effective at once.

    Raises:
        ConfigError: ``plugin`` was never registered.

    Example:
        >>> import types
        >>> plugin = types.SimpleNamespace()
        >>> register_plugin(plugin, backend="scratch")
        >>> unregister_plugin(plugin)
        >>> "scratch" in list_backends()
        False
    """
    default_registry().unregister_plugin(plugin)


def refresh() -> None:
    """Rescan installed plugins (after a ``pip install`` in a running process).

    Drops every cached scan, import outcome and assembled backend, and reads
    the environment controls again; objects given to ``register_plugin`` stay.

    Example:
        >>> refresh()
        >>> "reference" in list_backends()
        True
    """
    default_registry().refresh()
