"""The one pattern matcher: fusion, observation and lowering all use it.

Patterns are in the complex (reversed nested tuple) form: ``(op, argpattern...)``,
``MatchAllNode`` matching anything. A match is anchored at its last node and
traced back through ``node.args``::

    pattern (ReLU, (BatchNorm2d, Conv2d))     graph  x -> conv -> bn -> relu
    anchor relu; bn and conv must have no user outside the match

Nodes are visited last to first; a node belongs to at most one match. The
index buckets patterns by their anchor op (longest first), so the cost is
linear in graph size: each node tries only the patterns ending in its op.
An index built with ``spellings`` matches an op written any of its ways
(``torch.relu(x)``, ``x.relu()``, ``F.relu(x)``, ``nn.ReLU``) wherever a
pattern names one of them; a pattern written the node's own way wins a tie.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from torch import fx, nn

from fxquant.config.pattern import is_match_all

__all__ = ["Match", "PatternIndex", "match_graph", "module_table", "node_op", "pattern_size"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, eq=False)  # identity: one match is one place
class Match(Generic[T]):
    """One place where a pattern matched.

    Attributes:
        anchor: the last node of the pattern.
        nodes: every node the pattern covers, in graph order (MatchAllNode
            positions and the pattern's external inputs excluded).
        pattern: the normalized pattern that matched.
        payload: what the index stored with the pattern (a BackendPatternConfig...).
        bindings: position in the flattened pattern (pre-order) -> node.
        structure: the matched nodes in the pattern's shape, e.g.
            ``(relu_node, (bn_node, conv_node))``, as root-node getters, extra-input
            getters and fusers expect.

    Example:
        >>> import torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
        >>> index = PatternIndex.build([(torch.nn.ReLU, "relu")])
        >>> [m.payload for m in match_graph(gm, index).values()]
        ['relu']
    """

    anchor: fx.Node
    nodes: tuple[fx.Node, ...]
    pattern: Hashable
    payload: T
    bindings: Mapping[int, fx.Node]
    structure: Any = None


def root_node(match: Match[Any]) -> fx.Node:
    """The node the pattern's config calls its root (the conv of conv -> bn -> relu): its
    ``_root_node_getter``'s answer, else the pattern's first op.

    Example:
        >>> import torch
        >>> m = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU())
        >>> gm = torch.fx.symbolic_trace(m)
        >>> index = PatternIndex.build([((torch.nn.ReLU, torch.nn.Conv2d), "conv-relu")])
        >>> root_node(next(iter(match_graph(gm, index).values()))).name
        '_0'
    """
    getter = getattr(match.payload, "_root_node_getter", None)
    if getter is not None:
        root: fx.Node = getter(match.structure)
        return root
    structure = match.structure
    while isinstance(structure, tuple):
        structure = structure[-1]
    return structure if isinstance(structure, fx.Node) else match.anchor


def module_table(gm: nn.Module) -> dict[str, nn.Module]:
    """Every submodule by every path it has (a module used twice keeps both paths).

    ``named_modules()`` lists a shared module once; after fusion wraps a shared
    ReLU, its other call sites would be missing from that table.

    Example:
        >>> relu = nn.ReLU()
        >>> sorted(module_table(nn.Sequential(relu, relu)))
        ['', '0', '1']
    """
    return dict(gm.named_modules(remove_duplicate=False))


def pattern_size(pattern: object, *, match_all: bool = False) -> int:
    """Number of ops in a pattern, MatchAllNode excluded (counted too with ``match_all``:
    the positions of the flattened pattern).

    Example:
        >>> from fxquant.config.pattern import MatchAllNode
        >>> pattern_size(("relu", ("bn", "conv"))), pattern_size(("add", "conv", MatchAllNode))
        (3, 2)
        >>> pattern_size(("add", "conv", MatchAllNode), match_all=True)
        3
    """
    if isinstance(pattern, tuple):
        return sum(pattern_size(p, match_all=match_all) for p in pattern)
    return 1 if match_all or not is_match_all(pattern) else 0


@dataclass(frozen=True, slots=True, eq=False, repr=False)  # identity, as Match; repr: huge
class PatternIndex(Generic[T]):
    """Patterns bucketed by anchor op, longest first within a bucket.

    ``spellings``: each op written differently elsewhere -> the group of its spellings; a
    node matches a pattern naming any op of its group.

    Example:
        >>> import torch
        >>> index = PatternIndex.build([("relu", 1), (("relu", "add"), 2)])
        >>> [payload for _, payload in index.candidates("relu")]
        [2, 1]
        >>> index = PatternIndex.build([(torch.relu, 1)], spellings=[{torch.relu, "relu"}])
        >>> [payload for _, payload in index.candidates("relu")]
        [1]
    """

    buckets: Mapping[Hashable, list[tuple[Hashable, T]]]
    spellings: Mapping[Hashable, frozenset[Hashable]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        entries: Iterable[tuple[Hashable, T]],
        *,
        spellings: Iterable[Collection[Hashable]] = (),
    ) -> PatternIndex[T]:
        """Index ``(normalized pattern, payload)`` pairs; earlier entries win ties."""
        buckets: dict[Hashable, list[tuple[Hashable, T]]] = {}
        for pattern, payload in entries:
            head = pattern[0] if isinstance(pattern, tuple) else pattern
            if is_match_all(head):
                continue  # nothing to anchor on
            buckets.setdefault(head, []).append((pattern, payload))
        for bucket in buckets.values():
            bucket.sort(key=lambda entry: -pattern_size(entry[0]))  # stable: ties keep order
        groups = [frozenset(group) for group in spellings]
        return cls(buckets, {op: group for group in groups for op in group})

    def candidates(self, op: Hashable) -> list[tuple[Hashable, T]]:
        """The patterns anchored at ``op`` (or another spelling of it), longest first."""
        own = self.buckets.get(op, [])
        others = [
            e
            for alias in self.spellings.get(op, ())
            if alias != op
            for e in self.buckets.get(alias, [])
        ]
        return sorted([*own, *others], key=lambda entry: -pattern_size(entry[0])) if others else own

    def same_op(self, op: Hashable | None, head: object) -> bool:
        """Whether a node whose op is ``op`` matches a pattern op ``head``."""
        return op == head or head in self.spellings.get(op, ())

    def __len__(self) -> int:
        return sum(len(b) for b in self.buckets.values())


def node_op(node: fx.Node, modules: Mapping[str, nn.Module]) -> Hashable | None:
    """The op identity of a node: module class, function, or method name.

    Example:
        >>> import torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
        >>> [node_op(n, dict(gm.named_modules())) for n in gm.graph.nodes][1]
        <class 'torch.nn.modules.activation.ReLU'>
    """
    if node.op == "call_module":
        module = modules.get(str(node.target))
        # classes hash by identity; mypy sees Module's __hash__ possibly set to None
        return cast(Hashable, type(module)) if module is not None else None
    if node.op in ("call_function", "call_method"):
        return node.target
    return None


@dataclass
class _Matcher:
    """One attempt to match one pattern at one anchor."""

    modules: Mapping[str, nn.Module]
    claimed: set[fx.Node]
    same_op: Callable[[Hashable | None, object], bool]
    bindings: dict[int, fx.Node] = field(default_factory=dict)
    nodes: list[fx.Node] = field(default_factory=list)
    position: int = 0

    def match(self, value: object, pattern: object, *, is_anchor: bool) -> Any:
        """The matched structure, or ``_FAIL``."""
        position = self.position
        self.position += 1
        head, arg_patterns = (
            (pattern[0], pattern[1:]) if isinstance(pattern, tuple) else (pattern, ())
        )
        if is_match_all(head):
            if isinstance(value, fx.Node):
                self.bindings[position] = value
            self.position += sum(pattern_size(p, match_all=True) for p in arg_patterns)
            return value
        if not isinstance(value, fx.Node):
            return value if value == pattern else _FAIL
        if value in self.claimed or (not is_anchor and len(value.users) > 1):
            return _FAIL
        if not self.same_op(node_op(value, self.modules), head):
            return _FAIL
        self.bindings[position] = value
        self.nodes.append(value)
        if not arg_patterns:
            return value
        if len(arg_patterns) != len(value.args):
            return _FAIL
        parts: list[Any] = [value]
        for arg, sub in zip(value.args, arg_patterns, strict=True):
            part = self.match(arg, sub, is_anchor=False)
            if part is _FAIL:
                return _FAIL
            parts.append(part)
        return tuple(parts)


_FAIL = object()


def match_graph(
    gm: fx.GraphModule,
    index: PatternIndex[T],
    *,
    claimed: set[fx.Node] | None = None,
    modules: Mapping[str, nn.Module] | None = None,
    accept: Callable[[Match[T]], bool] | None = None,
) -> dict[fx.Node, Match[T]]:
    """Match every node of ``gm`` against ``index``, last node first.

    Args:
        gm: the graph module.
        index: the patterns.
        claimed: nodes that must not be part of any match (updated in place).
        modules: ``dict(gm.named_modules())`` if the caller already has it.
        accept: a veto on a structural match (e.g. fusion's one-qconfig rule); a
            refused match frees its nodes for the next, shorter candidates.

    Returns:
        node -> the match that claimed it (every node of a match maps to it).

    Example:
        >>> import torch
        >>> m = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU())
        >>> gm = torch.fx.symbolic_trace(m)
        >>> index = PatternIndex.build([((torch.nn.ReLU, torch.nn.Conv2d), "conv-relu")])
        >>> sorted(n.name for n in match_graph(gm, index))
        ['_0', '_1']
    """
    modules = module_table(gm) if modules is None else modules
    taken: set[fx.Node] = set() if claimed is None else claimed
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    result: dict[fx.Node, Match[T]] = {}
    for node in reversed(gm.graph.nodes):
        op = node_op(node, modules)
        if node in taken or op is None:
            continue
        for pattern, payload in index.candidates(op):
            matcher = _Matcher(modules, taken, index.same_op)
            structure = matcher.match(node, pattern, is_anchor=True)
            if structure is _FAIL:
                continue
            nodes = tuple(sorted(set(matcher.nodes), key=order.__getitem__))
            found = Match(node, nodes, pattern, payload, dict(matcher.bindings), structure)
            if accept is not None and not accept(found):
                continue
            taken.update(nodes)
            result.update(dict.fromkeys(nodes, found))
            break
    return result
