"""Which top-level packages belong to installed plugins: asked by ``config/serialize`` (a JSON
name under a plugin's package is trusted), answered by the registry.

The registry owns discovery and sits above the configs, so the configs cannot import it: the
registry installs its answer here when it is imported (``import fxquant`` does), and
serialize reads it. Before that, no plugin package is trusted.

Example:
    >>> import fxquant
    >>> "fxquant" in plugin_roots()  # the built-in reference backend's entry point
    True
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["answer_with", "plugin_roots"]

_provider: list[Callable[[], frozenset[str]]] = []


def answer_with(provider: Callable[[], frozenset[str]]) -> None:
    """Make ``provider`` the answer of :func:`plugin_roots` (the registry calls this once)."""
    _provider[:] = [provider]


def plugin_roots() -> frozenset[str]:
    """The top-level packages of installed, enabled plugins' entry points."""
    return _provider[0]() if _provider else frozenset()
