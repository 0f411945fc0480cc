"""QConfig per node from the five QConfigMapping levels, in one pass.

Priority, highest first (torch.ao's order):

    module_name_object_type_order  (module path, op, index): index counts calls of
                                   that op per module (modules counted per parent)
    module_name                    the node's module path or its nearest named ancestor
    module_name_regex              first registered regex that re.match()es the path
    object type                    the module's class (a fused module also answers to
                                   the classes it fused); for function and method calls
                                   first the owning module's class, then the op
    global

An object-type entry for a fused module class (``fxquant.nn.intrinsic.ConvAdd2d``)
gives its qconfig to every node of a pattern that fuses into that class, over
the object-type and global qconfigs of the parts: a mapping can keep ``add``
float in general yet quantize the adds a conv absorbs (see ``qconfig_mismatch``).
Entries naming a module (name, regex, order) still win.

Entries naming modules (name, regex, order) that match nothing are returned too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

from fxquant.config.backend import BackendPatternConfig
from fxquant.config.pattern import pattern_str
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow.match import Match
from fxquant.flow.report import Reason
from fxquant.flow.state import node_info
from fxquant.nn.intrinsic import FusedModule

__all__ = ["QConfigAssignment", "assign_qconfigs", "qconfig_mismatch"]

_MISSING = object()


@dataclass(frozen=True, slots=True)
class QConfigAssignment:
    """The qconfig of every node, and the mapping entries that matched nothing.

    Example:
        >>> QConfigAssignment({}, ()).unused
        ()
    """

    qconfigs: Mapping[fx.Node, QConfig | None]
    unused: tuple[Reason, ...]
    named: frozenset[fx.Node] = frozenset()  # nodes whose qconfig a module-naming entry gave
    fused_types: Mapping[Any, QConfig | None] = dataclasses.field(default_factory=dict)


class _Resolver:
    def __init__(self, mapping: QConfigMapping) -> None:
        self.mapping = mapping
        self.regexes = [(re.compile(r), q) for r, q in mapping.module_name_regex_qconfigs.items()]
        self.orders_seen: set[tuple[str, Any, int]] = set()

    def by_name(self, path: str) -> Any:
        names = self.mapping.module_name_qconfigs
        parts = path.split(".") if path else []
        for n in range(len(parts), 0, -1):
            name = ".".join(parts[:n])
            if name in names:
                return names[name]
        for regex, qconfig in self.regexes:
            if regex.match(path):
                return qconfig
        return _MISSING

    def by_type(self, *types: Any) -> Any:
        table = self.mapping.object_type_qconfigs
        for t in types:
            if t is not None and t in table:
                return table[t]
        return _MISSING

    def resolve(
        self, path: str, types: tuple[Any, ...], order: tuple[Any, int] | None
    ) -> tuple[Any, bool]:
        """The qconfig, and whether an entry naming the module (not a type) gave it."""
        if order is not None:
            key = (path, order[0], order[1])
            self.orders_seen.add(key)
            orders = self.mapping.module_name_object_type_order_qconfigs
            if key in orders:
                return orders[key], True
        found = self.by_name(path)
        if found is not _MISSING:
            return found, True
        found = self.by_type(*types)
        return (self.mapping.global_qconfig if found is _MISSING else found), False


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def assign_qconfigs(
    gm: fx.GraphModule, modules: Mapping[str, nn.Module], mapping: QConfigMapping
) -> QConfigAssignment:
    """The qconfig of every call and get_attr node of ``gm`` (see the module docstring).

    Example:
        >>> import torch
        >>> from fxquant.config.qconfig import QConfig
        >>> q = QConfig(activation=torch.nn.Identity, weight=torch.nn.Identity)
        >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
        >>> mapping = QConfigMapping().set_module_name("0", q)
        >>> result = assign_qconfigs(gm, dict(gm.named_modules()), mapping)
        >>> [n.name for n, v in result.qconfigs.items() if v is q]
        ['_0']
    """
    resolver = _Resolver(mapping)
    counts: dict[tuple[str, Any], int] = {}
    qconfigs: dict[fx.Node, QConfig | None] = {}
    named: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        qconfigs[node], by_name = _node_qconfig(node, modules, resolver, counts)
        if by_name:
            named.add(node)
    fused_types = {
        t: q
        for t, q in mapping.object_type_qconfigs.items()
        if isinstance(t, type) and issubclass(t, FusedModule)
    }
    return QConfigAssignment(
        qconfigs, _unused(gm, modules, resolver), frozenset(named), fused_types
    )


def _node_qconfig(
    node: fx.Node,
    modules: Mapping[str, nn.Module],
    resolver: _Resolver,
    counts: dict[tuple[str, Any], int],
) -> tuple[Any, bool]:
    info = node_info(node)
    if node.op == "get_attr":
        owner = _parent(str(node.target))
        return resolver.resolve(owner, (type(modules.get(owner)),), None)
    if node.op == "call_module":
        path = str(node.target)
        module_type = type(modules[path])
        key: tuple[str, Any] = (_parent(path), module_type)
        order = (module_type, counts.get(key, 0))
        counts[key] = order[1] + 1
        return resolver.resolve(path, (module_type, *info.fused_from), order)
    if node.op == "call_function":
        key = (info.module_path, node.target)
        fn_order = (node.target, counts.get(key, 0))
        counts[key] = fn_order[1] + 1
        return resolver.resolve(info.module_path, (info.module_type, node.target), fn_order)
    return resolver.resolve(info.module_path, (info.module_type, node.target), None)


def _unused(
    gm: fx.GraphModule, modules: Mapping[str, nn.Module], resolver: _Resolver
) -> tuple[Reason, ...]:
    # object-type entries are exempt: default mappings list every op type a backend has
    paths = set(modules) | {node_info(n).module_path for n in gm.graph.nodes}
    prefixes = {p.rsplit(".", i)[0] for p in paths for i in range(p.count(".") + 1)}
    mapping = resolver.mapping
    unused = [
        Reason(
            "unused_qconfig_entry",
            f"module_name {name!r} names no module of the model",
            field="module_name",
            bound=name,
        )
        for name in mapping.module_name_qconfigs
        if name not in prefixes
    ]
    unused += [
        Reason(
            "unused_qconfig_entry",
            f"module_name_regex {regex.pattern!r} matches no module path of the model",
            field="module_name_regex",
            bound=regex.pattern,
        )
        for regex, _ in resolver.regexes
        if not any(regex.match(p) for p in paths)
    ]
    unused += [
        Reason(
            "unused_qconfig_entry",
            f"module_name_object_type_order {key!r} matches no call in the model",
            field="module_name_object_type_order",
            bound=key,
        )
        for key in mapping.module_name_object_type_order_qconfigs
        if key not in resolver.orders_seen
    ]
    return tuple(unused)


def qconfig_mismatch(
    match: Match[BackendPatternConfig],
    qconfigs: Mapping[fx.Node, Any],
    assignment: QConfigAssignment | None = None,
) -> Reason | None:
    """Why the nodes of ``match`` cannot be fused or quantized together, or None.

    All nodes of a pattern must share one qconfig (fusion and observation both
    refuse a match that breaks this, and the matcher tries shorter patterns).
    With ``assignment``, a mapping entry for the class the pattern fuses into
    stands for every node whose qconfig no module-naming entry gave.
    """
    found = [qconfigs.get(n) for n in match.nodes]
    fused = match.payload.fused_module
    if assignment is not None and fused in assignment.fused_types:
        entry = assignment.fused_types[fused]
        found = [
            q if n in assignment.named else entry for n, q in zip(match.nodes, found, strict=True)
        ]
    if all(q == found[0] for q in found):
        return None
    names = ", ".join(n.name for n in match.nodes)
    return Reason(
        "fusion_qconfig_mismatch",
        f"{pattern_str(match.payload.pattern or match.pattern)}: nodes {names} have different "
        "qconfigs, so they cannot be fused; give them one qconfig to fuse and quantize them",
        field="qconfig",
    )
