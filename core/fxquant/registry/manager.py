"""The registry's state: scanned entry points, registered objects, assembled backends.

One ``Registry`` per process (``fxquant.registry`` holds it); tests make fresh
ones. Everything is cached after its first use and dropped by ``refresh()``;
``register_plugin``/``unregister_plugin`` drop only the backend they touch.
A lock makes concurrent first calls assemble a backend once.
"""

from __future__ import annotations

import difflib
import importlib
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from fxquant.config.backend import BackendConfig
from fxquant.enums import member
from fxquant.errors import (
    ConfigError,
    ConfigTypeError,
    PluginError,
    PluginWarning,
    UnknownBackendError,
    extension_skipped_warning,
)
from fxquant.registry.assembly import (
    AssembledBackend,
    assemble,
    copied_config,
    default_qconfig_mapping,
    hook_manager,
)
from fxquant.registry.compat import check_plugin_api
from fxquant.registry.install import checkout_root, install_hint, local_plugin_folders
from fxquant.registry.loading import (
    EntryPointRecord,
    LoadedPlugin,
    PluginInfo,
    PluginStatus,
    is_first_party,
    load,
    scan,
    strict_plugins,
)
from fxquant.registry.native import host_native_backend
from fxquant.registry.resolution import ResolvedBackend

__all__ = ["BackendReport", "Registry"]


@dataclass(frozen=True, slots=True)
class BackendReport:
    """One line of ``fxquant backends``: a backend, its plugins and its state.

    Example:
        >>> BackendReport("demo", "ok", "", (), 0, 0).status
        <PluginStatus.OK: 'ok'>
    """

    name: str
    status: PluginStatus
    reason: str
    plugins: tuple[PluginInfo, ...]
    pattern_count: int
    kernel_count: int

    def __post_init__(self) -> None:
        status = member(PluginStatus, self.status, "BackendReport status")
        object.__setattr__(self, "status", status)  # frozen: the checked member


def _object_name(plugin: object) -> str:
    name = getattr(plugin, "__name__", None)
    return name if isinstance(name, str) else type(plugin).__name__


def _copy_error(error: PluginError) -> PluginError:
    # a fresh exception per raise: re-raising one instance would pile up tracebacks
    copy = type(error)(str(error))
    copy.__cause__ = error.__cause__
    return copy


def _backend_name(backend: object) -> str:
    if not isinstance(backend, str):
        msg = f"backend must be a str naming the backend, got {backend!r}"
        raise ConfigTypeError(msg)
    if not backend:
        msg = "backend must not be empty; pass the name the plugin contributes to, e.g. 'x86'"
        raise ConfigError(msg)
    return backend


def _install_hint(name: str) -> str:
    """How to install ``name`` here: its folder from a checkout, else the generic command."""
    root = checkout_root()
    known = root is not None and bool(local_plugin_folders(name, root))
    return install_hint(name if known else None)


class Registry:
    """Finds, loads and assembles backends; see ``fxquant.registry`` for the public face.

    Example:
        >>> "reference" in Registry().list_backends()
        True
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._records: list[EntryPointRecord] | None = None
        self._registered: list[LoadedPlugin] = []  # register_plugin's, in call order
        self._loaded: dict[str, list[LoadedPlugin]] = {}
        # each backend's assembly as it went: the backend, or the error raised again on each ask
        self._backends: dict[str, AssembledBackend | PluginError] = {}
        self._assembling: set[str] = set()

    # --- discovery (metadata only) -------------------------------------------------------------

    def records(self) -> list[EntryPointRecord]:
        """Every ``fxquant.backends`` entry point, scanned once until ``refresh()``."""
        records = self._records
        if records is None:
            with self._lock:
                if self._records is None:
                    self._records = scan()
                records = self._records
        return records

    def list_backends(self) -> list[str]:
        """Backend names with at least one enabled plugin, sorted; imports nothing."""
        return self._all_names(enabled_only=True)

    def _all_names(self, *, enabled_only: bool = False) -> list[str]:
        names = {r.backend for r in self.records() if not (enabled_only and r.disabled)}
        names.update(entry.info.backend for entry in self._registered)
        return sorted(names)

    # --- loading and assembly ------------------------------------------------------------------

    def _unknown(self, name: str) -> UnknownBackendError:
        installed = self.list_backends()
        # known, but every plugin is switched off or incompatible
        if any(r.backend == name for r in self.records()):
            outcomes = [p.info for p in self._load_all(name)]
            why = "; ".join(
                f"{i.distribution} {i.version} is {i.status} ({i.reason})" for i in outcomes
            )
            msg = f"backend {name!r} is not available: {why}"
            return UnknownBackendError(msg)
        close = difflib.get_close_matches(name, installed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        msg = (
            f"unknown backend {name!r}; {hint}installed: {', '.join(installed) or 'none'}; "
            f"{_install_hint(name)}; see `fxquant backends`"
        )
        return UnknownBackendError(msg)

    def _load_all(self, name: str) -> list[LoadedPlugin]:
        if name not in self._loaded:
            self._loaded[name] = [load(r) for r in self.records() if r.backend == name]
        return self._loaded[name]

    def _plugins_of(self, name: str) -> list[LoadedPlugin]:
        loaded = self._load_all(name)
        failed = [p for p in loaded if p.error is not None]
        usable = [p for p in loaded if p.ok]
        # a broken extension never takes down the backend it extends; its own
        # first-party plugin failing, or strict plugins, still does
        fatal = [p for p in failed if strict_plugins() or is_first_party(p.info, name)]
        if failed and not usable and not fatal:
            fatal = failed
        if fatal:
            assert fatal[0].error is not None  # narrowed above; mypy cannot see through the list
            raise fatal[0].error
        for extension in failed:
            warnings.warn(extension_skipped_warning(extension.info), PluginWarning, stacklevel=4)
        usable += self._registered_for(name)
        if not usable:
            raise self._unknown(name)
        return usable

    def _registered_for(self, name: str) -> list[LoadedPlugin]:
        return [entry for entry in self._registered if entry.info.backend == name]

    def assembled(self, name: str) -> AssembledBackend:
        """The backend as its plugins made it, assembled on first use.

        Raises:
            UnknownBackendError: no enabled plugin provides ``name``.
            PluginError: one of its plugins failed (the same error on every call).
        """
        found = self._backends.get(name)
        if isinstance(found, AssembledBackend):
            return found
        _backend_name(name)
        with self._lock:
            found = self._backends.get(name)
            if isinstance(found, PluginError):
                raise _copy_error(found)
            if found is not None:
                return found
            if name not in self._all_names():
                raise self._unknown(name)
            if name in self._assembling:
                msg = (
                    f"backend {name!r} was asked for while it is being assembled "
                    "(one of its hooks asks for its own backend)"
                )
                raise PluginError(msg)
            self._assembling.add(name)
            try:
                backend = assemble(name, self._plugins_of(name))
            except PluginError as error:
                self._backends[name] = error
                raise
            finally:
                self._assembling.discard(name)
            self._backends[name] = backend
            return backend

    def get_backend_config(self, name: str) -> Any:
        """A new ``BackendConfig`` holding the backend's pattern configs (see the module doc)."""
        return copied_config(name, self.assembled(name).config.configs)

    def resolve(
        self, backend_config: BackendConfig | None, step: str, *, stacklevel: int = 2
    ) -> ResolvedBackend:
        """What a flow entry point needs of ``backend_config``, asked once (``resolution``).

        ``None`` is this host's native backend among the installed ones (a
        ``NativeBackendWarning`` naming ``step`` and the plugin to install when there is
        none, pointing ``stacklevel`` frames up); a config gets the lowering rules,
        deployment and graph modes of the backend its name names, or none.

        Raises:
            PluginError: a plugin of the backend failed (the same error on every call).
        """
        if backend_config is None:
            native = host_native_backend(self.list_backends(), step, stacklevel=stacklevel + 1)
            assembled = self.assembled(native.name)
            config = copied_config(assembled.name, assembled.config.configs)
            return ResolvedBackend.of(config, assembled, native)
        if not backend_config.name:
            return ResolvedBackend(backend_config)  # an unnamed config has no plugins
        try:
            found: AssembledBackend | None = self.assembled(backend_config.name)
        except UnknownBackendError:
            found = None
        return ResolvedBackend.of(backend_config, found, None)

    def get_default_qconfig_mapping(self, name: str, is_qat: bool = False) -> Any:
        """The default ``QConfigMapping`` from the backend's plugins (asked on every call)."""
        return default_qconfig_mapping(self.assembled(name), is_qat)

    # --- explicit registration -----------------------------------------------------------------

    def register_plugin(self, plugin: object, backend: str) -> None:
        """Register ``plugin`` for ``backend`` now; checked at once, used from the next call."""
        backend = _backend_name(backend)
        name = _object_name(plugin)
        info = PluginInfo(backend, "(registered)", "", name, status=PluginStatus.OK)
        check_plugin_api(plugin, info.label)
        with self._lock:
            if any(e.plugin is plugin for e in self._registered_for(backend)):
                msg = f"{info.label} is already registered for backend {backend!r}"
                raise ConfigError(msg)
            entry = LoadedPlugin(info, plugin)
            hook_manager(backend, [entry])  # pluggy checks its hooks now
            self._registered.append(entry)
            self._backends.pop(backend, None)

    def unregister_plugin(self, plugin: object) -> None:
        """Remove ``plugin`` from every backend it was registered for."""
        with self._lock:
            gone = [e for e in self._registered if e.plugin is plugin]
            if not gone:
                msg = (
                    f"plugin {_object_name(plugin)!r} is not registered; only objects given to "
                    "register_plugin can be unregistered (use FXQUANT_DISABLE_PLUGINS for "
                    "installed ones)"
                )
                raise ConfigError(msg)
            self._registered = [e for e in self._registered if e.plugin is not plugin]
            for entry in gone:
                self._backends.pop(entry.info.backend, None)

    def refresh(self) -> None:
        """Forget everything scanned, loaded and assembled; keep registered objects."""
        with self._lock:
            importlib.invalidate_caches()  # a fresh pip install must be importable
            self._records = None
            self._loaded.clear()
            self._backends.clear()

    # --- reports for the command line ----------------------------------------------------------

    def report(self, name: str) -> BackendReport:
        """Load and assemble ``name`` and say how it went; never raises for a plugin's fault.

        Raises:
            UnknownBackendError: no plugin at all declares ``name``.
        """
        with self._lock:
            loaded = self._load_all(name)
        infos = tuple(p.info for p in [*loaded, *self._registered_for(name)])
        if not infos:
            raise self._unknown(name)
        incompatible = PluginStatus.INCOMPATIBLE
        if all(i.status in (PluginStatus.DISABLED, incompatible) for i in infos):
            # nothing to assemble: the first incompatible plugin says why, else the first one
            why = next((i for i in infos if i.status == incompatible), infos[0])
            return BackendReport(name, why.status, why.reason, infos, 0, 0)
        try:
            backend = self.assembled(name)
        except PluginError as error:
            failed = PluginStatus.FAILED
            return BackendReport(name, failed, str(error).splitlines()[0], infos, 0, 0)
        counts = (len(backend.config.configs), len(backend.lowering_rules))
        return BackendReport(name, PluginStatus.OK, "", infos, *counts)

    def reports(self) -> list[BackendReport]:
        """One report per backend found (disabled and incompatible ones included), sorted."""
        return [self.report(name) for name in self._all_names()]
