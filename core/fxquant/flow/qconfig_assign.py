"""QConfig per node from the five QConfigMapping levels, in one pass.

The priority rules are :meth:`QConfigMapping.resolve`'s (the one implementation);
this module says what each node answers to:

    node            module name        object types                    order keys
    call_module     its target         its class, a fused one's root    NodeInfo.call_orders
    call_function   owning module      owning module's class, target   NodeInfo.call_orders
    call_method     owning module      owning module's class, name     NodeInfo.call_orders
    get_attr        owning module      owning module's class           -

Order keys (``set_module_name_object_type_order``) are numbered once, on the graph
as captured (:func:`number_calls`, before fusion), and kept in ``NodeInfo``: a
fused module keeps the keys of every module it replaced, a QAT module those of
the module it swapped, so fusion, QAT swaps and observers do not shift the index.
A call is counted in the module whose ``forward`` makes it: ``("", nn.Conv2d, 3)``
is the fourth Conv2d the root calls, also when the convs sit in a ModuleList.

An object-type entry for a fused module class (``fxquant.nn.intrinsic.ConvAdd2d``)
gives its qconfig to every node of a pattern that fuses into that class, over
the object-type and global qconfigs of the parts: a mapping can keep ``add``
float in general yet quantize the adds a conv absorbs (see ``qconfig_mismatch``).
Entries naming a module (name, regex, order) still win. Otherwise a fused module
takes its root's qconfig (the conv's, for conv + BN + ReLU), over the global qconfig
of its parts (see ``fusion_mismatch``).

Entries naming modules (name, regex, order) that match nothing are returned too.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

from fxquant.config.backend import BackendPatternConfig
from fxquant.config.pattern import pattern_str
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import (
    GLOBAL_KEY,
    OrderKey,
    QConfigChoice,
    QConfigMapping,
    order_scope,
)
from fxquant.flow.match import Match
from fxquant.flow.report import Reason
from fxquant.flow.state import META_KEY, node_info
from fxquant.nn.intrinsic import FusedModule

__all__ = [
    "QConfigAssignment",
    "assign_qconfigs",
    "fusion_mismatch",
    "number_calls",
    "qconfig_mismatch",
    "reassign_after_fusion",
]


@dataclass(frozen=True, slots=True)
class QConfigAssignment:
    """What the mapping chose for every node, and the mapping entries that matched nothing.

    Example:
        >>> QConfigAssignment({}, ()).unused
        ()
    """

    choices: Mapping[fx.Node, QConfigChoice]
    unused: tuple[Reason, ...]
    fused_types: Mapping[Any, QConfig | None] = dataclasses.field(default_factory=dict)
    qconfigs: Mapping[fx.Node, QConfig | None] = dataclasses.field(init=False)
    named: frozenset[fx.Node] = dataclasses.field(init=False)  # given by an entry naming a module
    defaulted: frozenset[fx.Node] = dataclasses.field(init=False)  # given the global qconfig

    def __post_init__(self) -> None:  # frozen: the views of ``choices``, read per match
        choices = self.choices.items()
        object.__setattr__(self, "qconfigs", {n: choice.qconfig for n, choice in choices})
        object.__setattr__(self, "named", frozenset(n for n, c in choices if c.names_module))
        object.__setattr__(
            self, "defaulted", frozenset(n for n, c in choices if c.level == GLOBAL_KEY)
        )


def _scopes(node: fx.Node, modules: Mapping[str, nn.Module]) -> tuple[tuple[str, ...], Any]:
    """The scopes that count a call node, and its object type; no scopes for other nodes.

    A module call counts in the module whose ``forward`` makes it (torch.fx's
    ``nn_module_stack``, one entry up) and, where that differs, in its parent by
    path, torch.ao's count: a module in a ``ModuleList`` (no ``forward`` of its
    own) is the n-th of its type for the list's owner and for the list.
    """
    if node.op == "call_module":
        path = str(node.target)
        module = modules.get(path)
        if module is None:
            return (), None
        parent = order_scope(path, type(module))
        stack = node.meta.get("nn_module_stack")
        callers = [value[0] for value in stack.values()][:-1] if stack else None
        caller = (callers[-1] if callers else "") if callers is not None else parent
        return tuple(dict.fromkeys((caller, parent))), type(module)
    if node.op in ("call_function", "call_method"):
        return (node_info(node).module_path,), node.target
    return (), None


def number_calls(
    graph: fx.Graph, modules: Mapping[str, nn.Module]
) -> dict[fx.Node, tuple[OrderKey, ...]]:
    """The order keys of every call node: its index among same-type calls of its scope.

    A function or method call is counted in the module making it, a module call
    in the module calling it (and in its parent by path, see ``_scopes``). Run
    on the graph as captured (trace keeps the result in ``NodeInfo.call_orders``).

    Example:
        >>> import torch
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.ReLU(), nn.ReLU()))
        >>> list(number_calls(gm.graph, dict(gm.named_modules())).values())[1]
        (('', <class 'torch.nn.modules.activation.ReLU'>, 1),)
    """
    counters: defaultdict[tuple[str, Any], Iterator[int]] = defaultdict(itertools.count)
    numbered: dict[fx.Node, tuple[OrderKey, ...]] = {}
    for node in graph.nodes:
        scopes, object_type = _scopes(node, modules)
        keys = tuple((scope, object_type, next(counters[scope, object_type])) for scope in scopes)
        if keys:
            numbered[node] = keys
    return numbered


def _orders(gm: fx.GraphModule, modules: Mapping[str, nn.Module]) -> Mapping[fx.Node, Any]:
    if any(META_KEY in n.meta for n in gm.graph.nodes):
        return {n: node_info(n).call_orders for n in gm.graph.nodes}
    return number_calls(gm.graph, modules)  # a graph the flow did not capture (tests, doctests)


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
    fused_types = {
        t: mapping.object_type_qconfigs[_deciding_type(mapping, t)]
        for t in mapping.object_type_qconfigs
        if isinstance(t, type) and issubclass(t, FusedModule)
    }
    empty = QConfigAssignment({}, (), fused_types)
    return _assign(gm, modules, mapping, empty, lambda node: True)


def reassign_after_fusion(
    assignment: QConfigAssignment,
    gm: fx.GraphModule,
    modules: Mapping[str, nn.Module],
    mapping: QConfigMapping,
    roots: Collection[fx.Node],
) -> QConfigAssignment:
    """``assignment``, made before fusion, for ``gm`` after it (``modules``: its modules now).

    Only what fusion changed is resolved again: the ``roots`` holding fused modules
    (which answer to their class and the classes they fused) and any other node
    reading a module at a root's path; erased nodes drop out, every other node keeps
    its qconfig (fusion keeps each node's ``NodeInfo``, order keys included), and the
    entries that name nothing are counted on the fused graph.

    Example:
        >>> import torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
        >>> modules, mapping = dict(gm.named_modules()), QConfigMapping()
        >>> before = assign_qconfigs(gm, modules, mapping)
        >>> reassign_after_fusion(before, gm, modules, mapping, ()).qconfigs == before.qconfigs
        True
    """
    changed = {str(root.target) for root in roots}

    def fused(node: fx.Node) -> bool:
        if node in roots or (node.op == "call_module" and str(node.target) in changed):
            return True
        return node.op == "get_attr" and str(node.target).rpartition(".")[0] in changed

    return _assign(gm, modules, mapping, assignment, fused)


def _assign(
    gm: fx.GraphModule,
    modules: Mapping[str, nn.Module],
    mapping: QConfigMapping,
    known: QConfigAssignment,
    resolve: Callable[[fx.Node], bool],
) -> QConfigAssignment:
    """``known``'s qconfigs, but for the nodes ``resolve`` picks, resolved from ``mapping``."""
    orders = _orders(gm, modules)
    choices = {
        node: _resolve(node, modules, mapping, orders.get(node, ()))
        if resolve(node)
        else known.choices[node]
        for node in gm.graph.nodes
        if node.op not in ("placeholder", "output")
    }
    seen = {key for keys in orders.values() for key in keys}
    return QConfigAssignment(choices, _unused(gm, modules, mapping, seen), known.fused_types)


def _resolve(
    node: fx.Node,
    modules: Mapping[str, nn.Module],
    mapping: QConfigMapping,
    orders: tuple[OrderKey, ...],
) -> QConfigChoice:
    info = node_info(node)
    if node.op == "get_attr":
        owner = str(node.target).rpartition(".")[0]
        return mapping.resolve(owner, (type(modules.get(owner)),))
    if node.op == "call_module":
        path = str(node.target)
        # a fused module answers to its class and its root's (fused_from[0]), whose
        # qconfig fusion gave it (see fusion_mismatch); the other parts' types do not
        fused = type(modules[path])
        deciding = _deciding_type(mapping, fused)
        return mapping.resolve(path, (deciding, fused, *info.fused_from[:1]), orders)
    return mapping.resolve(info.module_path, (info.module_type, node.target), orders)


def _unused(
    gm: fx.GraphModule,
    modules: Mapping[str, nn.Module],
    mapping: QConfigMapping,
    seen: set[OrderKey],
) -> tuple[Reason, ...]:
    # object-type entries are exempt: default mappings list every op type a backend has
    paths = set(modules) | {node_info(n).module_path for n in gm.graph.nodes}
    prefixes = {p.rsplit(".", i)[0] for p in paths for i in range(p.count(".") + 1)}
    entries: tuple[tuple[str, Iterable[Any], Callable[[Any], bool], str], ...] = (
        (
            "module_name",
            mapping.module_name_qconfigs,
            prefixes.__contains__,
            "names no module of the model",
        ),
        (
            "module_name_regex",
            mapping.module_name_regex_qconfigs,
            lambda regex: any(re.match(regex, p) for p in paths),
            "matches no module path of the model",
        ),
        (
            "module_name_object_type_order",
            mapping.module_name_object_type_order_qconfigs,
            seen.__contains__,
            "matches no call in the model (the index counts calls of that type made by that "
            "module's forward; a module is counted in its parent)",
        ),
    )
    return tuple(
        Reason("unused_qconfig_entry", f"{field} {key!r} {words}", field=field, bound=key)
        for field, keys, used, words in entries
        for key in keys
        if not used(key)
    )


def _deciding_type(mapping: QConfigMapping, fused: type) -> Any:
    """Of a fused module class and the type it is built around, the one whose entry was set
    last: a backend's default may give ``LinearReLU`` its own entry, and a user's later
    ``set_object_type(nn.Linear, ...)`` must still reach the linears that fuse with a relu."""
    parts = getattr(fused, "PARTS", ())
    entries = list(mapping.object_type_qconfigs)
    if not parts or parts[0][1] not in entries:
        return fused
    root = parts[0][1]
    return root if fused not in entries or entries.index(root) > entries.index(fused) else fused


def _with_fused_type(
    match: Match[BackendPatternConfig],
    qconfigs: Mapping[fx.Node, Any],
    assignment: QConfigAssignment | None,
) -> dict[fx.Node, Any]:
    """Each node's qconfig, the fused-class entry standing in for the unnamed ones."""
    found = {n: qconfigs.get(n) for n in match.nodes}
    fused = match.payload.fused_module
    if assignment is not None and fused in assignment.fused_types:
        entry = assignment.fused_types[fused]
        found = {n: q if n in assignment.named else entry for n, q in found.items()}
    return found


def _mismatch_reason(
    match: Match[BackendPatternConfig], odd: Collection[fx.Node], found: Mapping[fx.Node, Any]
) -> Reason:
    names = ", ".join(n.name for n in match.nodes)
    named = ", ".join(n.name for n in odd)
    differ = "differs" if len(odd) == 1 else "differ"
    # a part the mapping keeps float (a residual add in fbgemm's and qnnpack's defaults):
    # one qconfig would undo that choice, so the note says what runs instead of advising it
    kept = [n.name for n in match.nodes if found[n] is None]
    advice = (
        f"{', '.join(kept)} kept float by the mapping (qconfig None), the rest quantized alone"
        if kept
        else "give them one qconfig to fuse and quantize them"
    )
    return Reason(
        "fusion_qconfig_mismatch",
        f"{pattern_str(match.payload.pattern or match.pattern)}: nodes {names} have different "
        f"qconfigs ({named} {differ}), so they cannot be fused; {advice}",
        field="qconfig",
    )


def qconfig_mismatch(
    match: Match[BackendPatternConfig],
    qconfigs: Mapping[fx.Node, Any],
    assignment: QConfigAssignment | None = None,
) -> Reason | None:
    """Why the nodes of ``match`` cannot be quantized together as one pattern, or None.

    All nodes of a pattern must share one qconfig (observation refuses a match that
    breaks this, and the matcher tries shorter patterns). With ``assignment``, a
    mapping entry for the class the pattern fuses into stands for every node whose
    qconfig no module-naming entry gave. Fusion asks :func:`fusion_mismatch`.
    """
    found = _with_fused_type(match, qconfigs, assignment)
    first = found[match.nodes[0]]
    odd = [n for n, q in found.items() if q != first]
    return _mismatch_reason(match, odd, found) if odd else None


def fusion_mismatch(
    match: Match[BackendPatternConfig],
    root: fx.Node,
    qconfigs: Mapping[fx.Node, Any],
    assignment: QConfigAssignment | None,
    folded: Collection[fx.Node] = (),
) -> Reason | None:
    """Why the nodes of fusion ``match`` cannot be fused, or None.

    The fused module takes the qconfig of the pattern's ``root`` (the conv or linear
    it is built around), as torch.ao's fused modules answer to their first op's
    entry: a mapping that sets a qconfig on ``nn.Conv2d`` means the conv + BN + ReLU
    that fuse into it. A part whose qconfig differs refuses the fusion only where a
    mapping entry speaks for that part (its module, its type), or where one of the
    two is None (that op is kept float), not where the global qconfig does; a part
    ``folded`` into the root's weights (a BatchNorm, never observed) refuses only
    when an entry names its module.
    """
    found = _with_fused_type(match, qconfigs, assignment)
    decided = found[root]
    named = assignment.named if assignment is not None else frozenset()
    defaulted = assignment.defaulted if assignment is not None else frozenset()

    def refuses(node: fx.Node, qconfig: Any) -> bool:
        if qconfig == decided:
            return False
        if node in named:
            return True
        spoken = node not in defaulted or None in (qconfig, decided)  # None: kept float
        return node not in folded and spoken

    odd = [n for n, q in found.items() if refuses(n, q)]
    return _mismatch_reason(match, odd, found) if odd else None
