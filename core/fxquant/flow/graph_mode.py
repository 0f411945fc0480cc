"""A backend's graph mode under the user's own mapping: what the user says wins, the mode fills.

A ``GraphMode`` (the ``fxquant_graph_mode`` hook) is the mapping a backend would quantize a
graph of one shape with. Its *parts* are what it changes against the backend's default
mapping, the base both start from. Prepare merges them into the user's mapping key by key,
a three-way merge whose base is the default (each level's keys: the global qconfig, an
object type, a module name, a regex, a call order)::

    user's key as the default's   the mode's part applies (the user said nothing there)
    user's key as the mode's      agreed
    user's key their own          the user's entry stays; the part is "not applied"

The mapping resolves the most specific level per node, so a user's ``set_module_name``
entry outranks the mode's object-type parts for the nodes under that module. The
equalization of a mode merges the same way into the user's ``_equalization_config``
(the base: none). A warning names the mode and each part not applied, and also when the
user's global qconfig is their own: the mode then changes a mapping that was not the
backend's, so they hear of it.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any, Final

from fxquant.config.qconfig import QConfigAny
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import GraphModeWarning
from fxquant.registry.answers import GraphMode

__all__ = ["ComposedMode", "compose"]

_ABSENT: Final = object()
"""A key a mapping has no entry for (an entry of ``None`` is a real answer: float)."""

_Key = tuple[str, Any]
"""``(level, key)``: ``("", "")`` for the global qconfig, ``("object_type", nn.Linear)``..."""


def _entries(mapping: QConfigMapping | None) -> dict[_Key, QConfigAny]:
    """Every entry of ``mapping`` by ``(level, key)``; ``None`` has none, not even a global."""
    if mapping is None:
        return {}
    entries: dict[_Key, QConfigAny] = {("", ""): mapping.global_qconfig}
    for level, table in mapping.to_dict().items():
        if not level:
            continue
        for entry in table:
            key = entry[0] if len(entry) == 2 else tuple(entry[:3])
            entries[(level, key)] = entry[-1]
    return entries


def _build(entries: dict[_Key, QConfigAny]) -> QConfigMapping:
    table: dict[str, list[tuple[Any, ...]]] = {}
    for (level, key), qconfig in entries.items():
        if level:
            table.setdefault(level, []).append(
                (*key, qconfig) if level.endswith("order") else (key, qconfig)
            )
    return QConfigMapping.from_dict(table).set_global(entries.get(("", "")))


_NAMESPACES: Final = ("torch", "torch.nn", "torch.nn.functional", "operator")
"""Where users name ops from: ``torch.add`` reads better than its ``__qualname__``."""


def _shown(item: Any) -> str:
    """``torch.add``, ``torch.nn.Linear``, ``'relu'``: a key as the user would write it."""
    if isinstance(item, str):
        return repr(item)
    if isinstance(item, tuple):
        return "(" + ", ".join(_shown(part) for part in item) + ")"
    name = getattr(item, "__name__", None)
    for namespace in _NAMESPACES:
        if name and getattr(sys.modules.get(namespace), name, None) is item:
            return f"{namespace}.{name}"
    module = getattr(item, "__module__", None)
    return f"{module}.{item.__qualname__}" if module and name else repr(item)


def _words(key: _Key) -> str:
    level, item = key
    return f"{level} {_shown(item)}" if level else "the global qconfig"


def _merge(
    user: dict[_Key, QConfigAny], base: dict[_Key, QConfigAny], mode: dict[_Key, QConfigAny]
) -> tuple[dict[_Key, QConfigAny], list[_Key], list[_Key]]:
    """(merged entries, the parts applied, the parts not applied: the user's own entry kept)."""
    merged = dict(user)
    applied, kept = [], []
    for key in dict.fromkeys([*mode, *base]):
        part = mode.get(key, _ABSENT)
        if part == base.get(key, _ABSENT):
            continue  # not the mode's: the default's own entry
        mine = user.get(key, _ABSENT)
        if mine != part and mine != base.get(key, _ABSENT):
            kept.append(key)  # the user's own entry
            continue
        applied.append(key)
        if mine != part:  # the user's is the default's entry: the mode's part replaces it
            if part is _ABSENT:
                merged.pop(key, None)
            else:
                merged[key] = mode[key]
    return merged, applied, kept


@dataclass(frozen=True, slots=True)
class ComposedMode:
    """A mode merged into the user's mapping: what prepare quantizes with, and what it kept.

    Example:
        >>> from fxquant.config.qconfig_mapping import QConfigMapping
        >>> mode = GraphMode("m", "why", QConfigMapping().set_object_type("add", None))
        >>> composed = compose(mode, QConfigMapping(), QConfigMapping(), None)
        >>> composed.applied, composed.kept
        (("object_type 'add'",), ())
    """

    mode: GraphMode
    qconfig_mapping: QConfigMapping
    equalization: QConfigMapping | None
    applied: tuple[str, ...]
    """The mode's parts that prepare uses, in words (``"object_type operator.add"``)."""
    kept: tuple[str, ...]
    """The mode's parts not applied: the user's own entry for the same key stays."""
    owned: tuple[str, ...]
    """The user's entries that differ from the default: they win where they apply."""
    own_global: bool
    """The user's global qconfig is not the default's: a custom mapping."""

    def lines(self) -> tuple[str, ...]:
        """The lines ``fxquant.explain`` prints for the mode, first under the table."""
        said = (
            ("your entries win where they apply", self.owned),
            ("not applied (your entries kept)", self.kept),
        )
        lines = (f"mode {self.mode.name}: {what}: {', '.join(keys)}" for what, keys in said if keys)
        return (self.mode.line(), *lines)

    def warning(self, backend: str, step: str) -> str | None:
        """The warning's words when the user should hear of the mode, else ``None``."""
        if not self.kept and not self.own_global:
            return None
        text = (
            f"{step}: backend {backend!r} quantizes this graph in its {self.mode.name!r} mode "
            f"({self.mode.reason}) under your own mapping"
        )
        if self.applied:
            text += f"; applied the mode's {', '.join(self.applied)}"
        if self.kept:
            text += f"; not applied, your entries kept: {', '.join(self.kept)}"
        return (
            f"{text}. Set an entry yourself to decide it (e.g. mapping.set_object_type("
            "operator.add, qconfig)); fxquant.explain(model) lists the mode's lines"
        )


def compose(
    mode: GraphMode,
    base: QConfigMapping,
    mapping: QConfigMapping,
    equalization: QConfigMapping | None,
) -> ComposedMode:
    """Merge ``mode``'s parts into the user's ``mapping`` and ``equalization`` (see the module).

    Args:
        mode: the backend's answer for this graph.
        base: the backend's default mapping (an empty one when it has none).
        mapping: the user's qconfig mapping.
        equalization: the user's ``_equalization_config``, or ``None``.
    """
    user, default = _entries(mapping), _entries(base)
    merged, applied, kept = _merge(user, default, _entries(mode.qconfig_mapping))
    mine = _entries(equalization)
    merged_eq, applied_eq, kept_eq = _merge(mine, {}, _entries(mode.equalization))
    has_eq = equalization is not None or mode.equalization is not None
    equalize = [f"equalization {_words(k)}" for k in applied_eq if k != ("", "")]
    return ComposedMode(
        mode=mode,
        qconfig_mapping=_build(merged),
        equalization=_build(merged_eq) if has_eq else None,
        applied=(*(_words(k) for k in applied), *equalize),
        kept=(*(_words(k) for k in kept), *(f"equalization {_words(k)}" for k in kept_eq)),
        # the user's keys that say something of their own (not the default's entry)
        owned=tuple(_words(k) for k in user if user[k] != default.get(k, _ABSENT)),
        own_global=user.get(("", "")) != default.get(("", ""), _ABSENT),
    )


def warn_composed(composed: ComposedMode, backend: str, step: str) -> None:
    """Warn (``GraphModeWarning``) when the user should hear of the mode: see the module."""
    text = composed.warning(backend, step)
    if text is not None:
        warnings.warn(text, GraphModeWarning, stacklevel=5)  # the user's prepare_fx call
