"""Compatibility checks done before a plugin is imported, and the plugin-API check after.

A distribution's ``Requires-Dist: fxquant>=0.2,<0.3`` is read from its
metadata; when the installed fxquant falls outside it, the plugin is marked
incompatible and never imported. The specifier subset is the one packaging
metadata uses in practice (``== != < <= > >= ~=`` and ``==X.*``); it is
parsed here because the core depends on torch, pluggy and importlib-metadata
only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from fxquant.errors import PluginAPIVersionError
from fxquant.registry.hookspecs import PLUGIN_API_VERSIONS

__all__ = [
    "check_plugin_api",
    "fxquant_requirement",
    "normalize_dist_name",
    "version_satisfies",
]

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*")
_CLAUSE = re.compile(r"\s*(~=|===|==|!=|<=|>=|<|>)\s*([0-9A-Za-z.*+!_-]+)\s*$")
_RELEASE = re.compile(r"v?(\d+(?:\.\d+)*)")


def normalize_dist_name(name: str) -> str:
    """The PEP 503 form of a distribution name, for comparisons.

    Example:
        >>> normalize_dist_name("FXQuant_X86")
        'fxquant-x86'
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def fxquant_requirement(requires: Iterable[str] | None) -> str | None:
    """The version specifier a distribution puts on fxquant, or None when it has none.

    Requirements behind an ``extra`` marker do not count: they are optional.

    Example:
        >>> fxquant_requirement(["torch", "fxquant>=0.1,<0.2", "pytest; extra == 'test'"])
        '>=0.1,<0.2'
    """
    for line in requires or ():
        requirement, _, marker = line.partition(";")
        match = _NAME.match(requirement)
        if match is None or normalize_dist_name(match.group(1)) != "fxquant" or "extra" in marker:
            continue
        return requirement[match.end() :].strip().strip("()").strip()
    return None


def _release(version: str) -> tuple[int, ...]:
    match = _RELEASE.match(version.strip())
    if match is None:
        return ()
    return tuple(int(part) for part in match.group(1).split("."))


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def _clause_holds(operator: str, wanted: str, installed: tuple[int, ...]) -> bool:
    if wanted.endswith(".*"):
        prefix = _release(wanted[:-2])
        same = installed[: len(prefix)] == prefix
        return same if operator == "==" else not same
    have, want = _padded(installed, _release(wanted))
    if operator == "~=":
        prefix = _release(wanted)[:-1]
        return have >= want and installed[: len(prefix)] == prefix
    results = {
        "==": have == want,
        "===": have == want,
        "!=": have != want,
        "<": have < want,
        "<=": have <= want,
        ">": have > want,
        ">=": have >= want,
    }
    return results[operator]


def version_satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` satisfies every clause of ``specifier`` (release numbers only).

    An unparsable clause counts as satisfied: a plugin is refused only for a
    requirement we understand.

    Example:
        >>> version_satisfies("0.1.0", ">=0.1,<0.2")
        True
        >>> version_satisfies("0.1.0", "~=0.2")
        False
    """
    installed = _release(version)
    matches = (_CLAUSE.match(clause) for clause in specifier.split(","))  # None: unparsable
    return all(_clause_holds(m[1], m[2], installed) for m in matches if m is not None)


def check_plugin_api(plugin: object, label: str) -> None:
    """Refuse a plugin whose ``fxquant_plugin_api`` names no version this fxquant offers.

    Args:
        plugin: the plugin module or object.
        label: how to name the plugin in the message.

    Raises:
        PluginAPIVersionError: when the declared versions and ours do not overlap.

    Example:
        >>> import types
        >>> check_plugin_api(types.SimpleNamespace(fxquant_plugin_api=1), "demo")
    """
    declared = getattr(plugin, "fxquant_plugin_api", 1)
    wanted = (declared,) if isinstance(declared, int) else tuple(declared)
    if any(isinstance(v, int) and v in PLUGIN_API_VERSIONS for v in wanted):
        return
    offered = ", ".join(str(v) for v in PLUGIN_API_VERSIONS)
    needs = ", ".join(repr(v) for v in wanted)
    msg = (
        f"{label} targets fxquant plugin API {needs}, but this fxquant offers {offered}; "
        "install a version of the plugin built for it, or a matching fxquant"
    )
    raise PluginAPIVersionError(msg)
