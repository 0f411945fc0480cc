"""Entry points -> plugin objects, with every failure recorded instead of raised.

Two steps, so that listing never imports anything:

1. ``scan()`` reads the ``fxquant.backends`` entry points from installed
   metadata (one record per distribution and backend, the environment
   controls applied) - no plugin is imported. It uses ``importlib.metadata``
   distributions and reads only their ``entry_points.txt``: building every
   EntryPoint of every distribution (``entry_points()``) costs 20 ms for 140
   distributions, this costs a few.
2. ``load(record)`` checks the distribution's ``Requires-Dist`` on fxquant,
   imports the entry point and checks its plugin-API version; the outcome is a
   ``LoadedPlugin`` whose ``info`` says ok / failed / incompatible and why.
"""

from __future__ import annotations

import importlib.metadata
import os
import time
from dataclasses import dataclass, replace
from typing import Any

from fxquant.enums import StrEnum, member
from fxquant.errors import PluginAPIVersionError, PluginError
from fxquant.registry.compat import (
    check_plugin_api,
    fxquant_requirement,
    normalize_dist_name,
    version_satisfies,
)
from fxquant.version import VERSION

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "GROUP",
    "EntryPointRecord",
    "LoadedPlugin",
    "PluginInfo",
    "PluginStatus",
    "is_first_party",
    "load",
    "scan",
    "strict_plugins",
]

GROUP = "fxquant.backends"
BUILTIN_DISTRIBUTION = "fxquant"
# The core's own plugins, used when fxquant runs without installed metadata (a bare checkout).
_BUILTIN_ENTRY_POINTS = {"reference": "fxquant.registry.reference"}


class PluginStatus(StrEnum):
    """How loading a plugin (or assembling a backend) went; a member is its string value.

    Example:
        >>> PluginStatus("not loaded") is PluginStatus.NOT_LOADED
        True
    """

    OK = "ok"
    """Imported, API version accepted (a backend: assembled)."""
    FAILED = "failed"
    """Its import or a hook raised, or a hook answered wrongly."""
    DISABLED = "disabled"
    """Switched off by an environment control (FXQUANT_PLUGINS, FXQUANT_DISABLE_PLUGINS...)."""
    INCOMPATIBLE = "incompatible"
    """It targets a plugin-API version this fxquant does not offer."""
    NOT_LOADED = "not loaded"
    """Not imported yet: its backend was not needed."""


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """What ``fxquant backends`` shows about one plugin of one backend.

    Attributes:
        backend: the backend the plugin contributes to.
        distribution: the distribution that declares it, or ``"(registered)"``
            for a ``register_plugin`` object.
        version: the distribution's version ("" for registered objects).
        entry_point: ``"name = module"``, or the object's repr when registered.
        status: a :class:`PluginStatus` (its string value is accepted too).
        reason: one line saying why, for any status but ok.
        import_seconds: time spent importing the entry point.
        builtin: whether the plugin ships with the fxquant core.

    Example:
        >>> PluginInfo("demo", "fxquant-demo", "1.0", "demo = demo.plugin").label
        "fxquant-demo 1.0 (entry point 'demo = demo.plugin')"
    """

    backend: str
    distribution: str
    version: str
    entry_point: str
    status: PluginStatus = PluginStatus.NOT_LOADED
    reason: str = ""
    import_seconds: float = 0.0
    builtin: bool = False

    def __post_init__(self) -> None:
        status = member(PluginStatus, self.status, "PluginInfo status")
        object.__setattr__(self, "status", status)  # frozen: the checked member

    @property
    def label(self) -> str:
        """The plugin as error messages name it: distribution, version, entry point."""
        if not self.version:
            return f"plugin {self.entry_point!r} (registered with register_plugin)"
        return f"{self.distribution} {self.version} (entry point {self.entry_point!r})"

    @property
    def source(self) -> str:
        """The plugin as tables name it: its distribution, or the registered object's name."""
        return self.distribution if self.version else f"{self.entry_point} (registered)"


@dataclass(frozen=True, slots=True)
class EntryPointRecord:
    """One ``fxquant.backends`` entry point, read from metadata without importing anything.

    Attributes:
        backend: the entry-point name, i.e. the backend.
        value: the entry-point value, ``module`` or ``module:attribute``.
        dist_key: the distribution's normalized name (``fxquant-x86``).
        dist: the ``importlib.metadata.Distribution`` (None for the builtin fallback).
        disabled: why the environment controls switch it off ("" when they do not).

    Example:
        >>> EntryPointRecord("demo", "demo.plugin", "fxquant-demo", None).builtin
        False
    """

    backend: str
    value: str
    dist_key: str
    dist: Any
    disabled: str = ""

    @property
    def builtin(self) -> bool:
        """Whether the entry point belongs to the fxquant core itself."""
        return self.dist_key == BUILTIN_DISTRIBUTION

    def info(self) -> PluginInfo:
        """The record as ``fxquant backends`` shows it (reads the distribution's METADATA)."""
        if self.dist is None:
            name, version = BUILTIN_DISTRIBUTION, VERSION
        else:
            name, version = self.dist.name, self.dist.version
        return PluginInfo(
            backend=self.backend,
            distribution=name,
            version=version,
            entry_point=f"{self.backend} = {self.value}",
            status=PluginStatus.DISABLED if self.disabled else PluginStatus.NOT_LOADED,
            reason=self.disabled,
            builtin=self.builtin,
        )


@dataclass(frozen=True, slots=True)
class LoadedPlugin:
    """The outcome of loading one entry point: the plugin object when it loaded.

    Example:
        >>> info = PluginInfo("demo", "d", "1", "demo = m", status=PluginStatus.OK)
        >>> LoadedPlugin(info, object()).ok
        True
    """

    info: PluginInfo
    plugin: object | None = None
    error: PluginError | None = None

    @property
    def ok(self) -> bool:
        """Whether the plugin loaded and can be asked."""
        return self.info.status == PluginStatus.OK


def strict_plugins() -> bool:
    """Whether ``FXQUANT_STRICT_PLUGINS`` makes any failing plugin fail its backend.

    Example:
        >>> import os; os.environ.pop("FXQUANT_STRICT_PLUGINS", None) and None
        >>> strict_plugins()
        False
    """
    return os.environ.get("FXQUANT_STRICT_PLUGINS", "") not in ("", "0")


def is_first_party(info: PluginInfo, backend: str) -> bool:
    """Whether ``info`` is the backend's own plugin (``fxquant-NAME``, or the core's).

    Any other distribution contributing to ``backend`` extends it: when it fails, the
    backend loads without it.

    Example:
        >>> is_first_party(PluginInfo("x86", "fxquant-x86", "0.1", "x86 = m"), "x86")
        True
        >>> is_first_party(PluginInfo("x86", "acme-x86-extra", "1.0", "x86 = m"), "x86")
        False
    """
    if info.builtin or not info.version:  # the core's own, or a register_plugin object
        return True
    dist = normalize_dist_name(info.distribution)
    return dist in (normalize_dist_name(f"fxquant-{backend}"), normalize_dist_name(backend))


def _env_names(variable: str) -> frozenset[str] | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return frozenset(normalize_dist_name(n.strip()) for n in raw.split(",") if n.strip())


def _disabled_reason(dist_key: str) -> str:
    """Why the environment controls switch distribution ``dist_key`` off, or "" when they keep it.

    Read from the environment as it is now (each scan, so ``refresh()`` sees a change).

    Example:
        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"FXQUANT_DISABLE_PLUGIN_AUTOLOAD": "1"}):
        ...     _disabled_reason("fxquant-x86"), _disabled_reason("fxquant")
        ('FXQUANT_DISABLE_PLUGIN_AUTOLOAD is set', '')
    """
    if dist_key == BUILTIN_DISTRIBUTION:
        return ""  # the built-ins are the flow's defaults: never switched off
    if os.environ.get("FXQUANT_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0"):
        return "FXQUANT_DISABLE_PLUGIN_AUTOLOAD is set"
    keep, skip = _env_names("FXQUANT_PLUGINS"), _env_names("FXQUANT_DISABLE_PLUGINS")
    if keep is not None and dist_key not in keep:
        return "not listed in FXQUANT_PLUGINS"
    if skip is not None and dist_key in skip:
        return "listed in FXQUANT_DISABLE_PLUGINS"
    return ""


def _section(text: str) -> list[tuple[str, str]]:
    """The ``name = value`` lines of the ``[fxquant.backends]`` section of entry_points.txt."""
    entries = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            inside = line.strip("[]").strip() == GROUP
            continue
        name, equals, value = line.partition("=")
        if inside and equals:
            entries.append((name.strip(), value.strip()))
    return entries


def _dist_key(dist: Any) -> str:
    # importlib.metadata derives _normalized_name from the folder name; dist.name would parse
    # METADATA, ten times slower, and listing must stay under 10 ms for 100 plugins
    name = getattr(dist, "_normalized_name", None) or dist.name
    return normalize_dist_name(name)


def _entry_points_text(dist: Any) -> str | None:
    path = getattr(dist, "_path", None)
    if path is None:
        text: str | None = dist.read_text("entry_points.txt")
        return text
    # a plain open: Distribution.read_text goes through pathlib, 2-3x slower per file
    try:
        with open(os.path.join(path, "entry_points.txt"), encoding="utf-8") as file:
            return file.read()
    except OSError:
        return None


def _records_of(dist: Any, key: str) -> list[EntryPointRecord]:
    text = _entry_points_text(dist)
    if not text or GROUP not in text:  # most distributions: skip without parsing
        return []
    disabled = _disabled_reason(key)
    return [EntryPointRecord(name, value, key, dist, disabled) for name, value in _section(text)]


def scan() -> list[EntryPointRecord]:
    """Read every ``fxquant.backends`` entry point from metadata; imports no plugin.

    Reads ``entry_points.txt`` of each installed distribution through
    ``importlib.metadata`` (no METADATA parsing, no import), and applies the
    environment controls.

    Returns:
        One record per (distribution, backend), builtin first then sorted by
        distribution name. A distribution visible twice on ``sys.path`` appears
        once (the first one found wins, as for imports).

    Example:
        >>> [r.backend for r in scan() if r.builtin]
        ['reference']
    """
    first: dict[str, Any] = {}
    records = []
    for dist in importlib.metadata.distributions():
        key = _dist_key(dist)
        if first.setdefault(key, dist) is not dist:
            continue  # the same distribution again, further down sys.path
        records.extend(_records_of(dist, key))
    seen = {r.backend for r in records if r.builtin}  # the core's metadata, when installed
    records += [
        EntryPointRecord(backend, value, BUILTIN_DISTRIBUTION, None)
        for backend, value in _BUILTIN_ENTRY_POINTS.items()
        if backend not in seen
    ]
    return sorted(records, key=lambda r: (not r.builtin, r.dist_key))


def _incompatible_reason(record: EntryPointRecord) -> str:
    if record.dist is None or record.builtin:
        return ""
    specifier = fxquant_requirement(record.dist.requires)
    if specifier is None or version_satisfies(VERSION, specifier):
        return ""
    return f"requires fxquant{specifier}, installed fxquant is {VERSION}"


def _failure(info: PluginInfo, error: BaseException, what: str) -> LoadedPlugin:
    described = f"{type(error).__name__}: {error}"
    wrapped = PluginError(f"{info.label} for backend {info.backend!r} failed {what}: {described}")
    wrapped.__cause__ = error
    failed = replace(info, status=PluginStatus.FAILED, reason=described.splitlines()[0])
    return LoadedPlugin(failed, None, wrapped)


def load(record: EntryPointRecord) -> LoadedPlugin:
    """Import one entry point after checking that it is enabled and compatible.

    Never raises for a plugin's fault: the outcome carries the status and, for
    a failure, a ``PluginError`` naming the distribution, version, entry point
    with the original exception chained.

    Example:
        >>> [load(r).ok for r in scan() if r.builtin]
        [True]
    """
    info = record.info()
    if record.disabled:
        return LoadedPlugin(info)
    reason = _incompatible_reason(record)
    if reason:
        return LoadedPlugin(replace(info, status=PluginStatus.INCOMPATIBLE, reason=reason))
    start = time.perf_counter()
    try:
        entry_point = importlib.metadata.EntryPoint(record.backend, record.value, GROUP)
        plugin: object = entry_point.load()
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit too: a plugin's sys.exit() is its failure
        return _failure(info, error, "to import")
    imported = replace(info, status=PluginStatus.OK, import_seconds=time.perf_counter() - start)
    try:
        check_plugin_api(plugin, info.label)
    except PluginAPIVersionError as error:
        failed = replace(imported, status=PluginStatus.FAILED, reason=str(error))
        return LoadedPlugin(failed, None, error)
    return LoadedPlugin(imported, plugin)
