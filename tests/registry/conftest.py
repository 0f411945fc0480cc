"""Fake installed plugins: entry points with fake distributions, plugin modules in memory."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.registry import hookimpl
from fxquant.registry.loading import GROUP
from fxquant.registry.manager import Registry

INT8 = DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)


def config(pattern: Any) -> BackendPatternConfig:
    """A weighted-int8 pattern config for ``pattern`` (simple format)."""
    return BackendPatternConfig(pattern).add_dtype_config(INT8)


@dataclass
class FakeDist:
    """The parts of an importlib.metadata Distribution the registry reads."""

    name: str
    version: str = "1.0"
    requires: list[str] | None = None
    entry_points: list[tuple[str, str]] = field(default_factory=list)

    def read_text(self, filename: str) -> str | None:
        if filename != "entry_points.txt" or not self.entry_points:
            return None
        lines = [f"{name} = {value}" for name, value in self.entry_points]
        return "\n".join(["[console_scripts]", "tool = x:y", f"[{GROUP}]", *lines, ""])


@dataclass
class Installed:
    """What `importlib.metadata.distributions` reports, editable by a test."""

    monkeypatch: pytest.MonkeyPatch
    dists: list[FakeDist] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)

    def install(self) -> None:
        """Make `importlib.metadata.distributions()` report `dists` (in install order)."""
        self.monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter(self.dists))

    def module(self, name: str, **hooks: Callable[..., Any]) -> types.ModuleType:
        """A plugin module `name` with the given hook functions, importable by its name."""
        module = types.ModuleType(name)
        for hook_name, function in hooks.items():
            setattr(module, hook_name, hookimpl(function))
        self.monkeypatch.setitem(sys.modules, name, module)
        return module

    def add(
        self,
        backend: str,
        module: str,
        dist: str = "fxquant-demo",
        version: str = "1.0",
        requires: list[str] | None = None,
    ) -> None:
        """Declare entry point `backend = module` of distribution `dist`."""
        found = next((d for d in self.dists if d.name == dist), None)
        if found is None:
            found = FakeDist(dist, version, requires)
            self.dists.append(found)
        found.entry_points.append((backend, module))

    def patterns(self, backend: str, dist: str, *patterns: Any, **extra: Any) -> types.ModuleType:
        """Install a distribution whose plugin gives `patterns` for `backend` (and nothing else)."""
        name = f"plugin_{dist.replace('-', '_')}_{backend}"

        def fxquant_pattern_configs(backend: str) -> list[Any] | None:
            self.imported.append(name)
            return [config(p) for p in patterns] if backend == wanted else None

        wanted = backend
        module = self.module(name, fxquant_pattern_configs=fxquant_pattern_configs, **extra)
        self.add(backend, name, dist)
        return module


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Installed]:
    """No installed plugin but the ones a test adds (the core's `reference` stays built in)."""
    for variable in (
        "FXQUANT_DISABLE_PLUGIN_AUTOLOAD",
        "FXQUANT_PLUGINS",
        "FXQUANT_DISABLE_PLUGINS",
    ):
        monkeypatch.delenv(variable, raising=False)
    state = Installed(monkeypatch)
    state.install()
    return state


@pytest.fixture
def registry(installed: Installed) -> Registry:
    """A fresh registry reading the fake metadata of `installed`."""
    return Registry()
