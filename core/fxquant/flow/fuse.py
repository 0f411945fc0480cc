"""Fusion, driven only by the BackendConfig.

Every BackendPatternConfig with a ``fuser_method`` is a fusion pattern. For each
match (the one matcher), the root node (``_root_node_getter``, default: the
first op of the chain) takes the fused module; the anchor's users now read the
root; ``_extra_inputs_getter`` nodes become extra arguments::

    x -> conv -> bn -> relu        ==>   x -> conv(ConvReLU2d with the BN folded in)

Fusion needs one qconfig for all nodes of a pattern (when a qconfig mapping is
known); a mapping entry for the fused module's class counts for all of them. For
QAT, a weighted fused module needs a QAT module in the backend config (refused
with ``fusion_no_qat_module`` otherwise). A refused pattern makes the matcher
try the shorter candidates (conv -> bn -> add with a float add still fuses
conv -> bn); its nodes that nothing fused carry the reason, which prepare
reports for a node that no pattern quantizes on its own either.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxquant.config.backend import BackendPatternConfig
from fxquant.config.pattern import MatchAllNode, is_match_all
from fxquant.flow.context import FlowContext
from fxquant.flow.match import Match, PatternIndex, match_graph, module_table, root_node
from fxquant.flow.names import drop_unread_modules
from fxquant.flow.qconfig_assign import (
    QConfigAssignment,
    assign_qconfigs,
    fusion_mismatch,
    reassign_after_fusion,
)
from fxquant.flow.report import Reason, ReasonCode
from fxquant.flow.state import META_KEY, node_info, update_info

__all__ = ["RELU_SPELLINGS", "fuse", "fuse_assigned", "fusion_index"]

RELU_SPELLINGS: frozenset[Any] = frozenset({nn.ReLU, F.relu, torch.relu, "relu"})
"""One relu, four ways to write it: a fused pattern naming one fuses them all (torch.ao
fuses only the ways each backend lists, and conv + ``torch.relu`` nowhere). The in-place
ways (``torch.relu_``, ``F.relu(x, inplace=True)``) are out-of-place ones by then."""
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def fusion_index(ctx: FlowContext) -> PatternIndex[BackendPatternConfig]:
    """The backend's fusion patterns, indexed for the matcher.

    Example:
        >>> from fxquant.config.backend import BackendConfig
        >>> len(fusion_index(FlowContext.for_fuse(None, BackendConfig("empty"))))
        0
    """
    configs = ctx.backend_config.configs
    entries = ((c.normalized_pattern, c) for c in configs if c.fuser_method)
    return PatternIndex.build(entries, spellings=[RELU_SPELLINGS])


def _as_modules(
    pattern: Any, structure: Any, modules: Mapping[str, nn.Module], shared: set[str]
) -> Any:
    """The matched structure with modules (or functions) in place of nodes."""
    if isinstance(pattern, tuple):
        return tuple(
            _as_modules(p, s, modules, shared) for p, s in zip(pattern, structure, strict=True)
        )
    if is_match_all(pattern):
        return MatchAllNode
    node: fx.Node = structure
    if node.op == "call_module":
        module = modules[str(node.target)]
        # a module called from several places (one ReLU reused) must not end up inside
        # the fused module and at its old path too: named_modules() would list it once
        return copy.deepcopy(module) if str(node.target) in shared else module
    if node.target in RELU_SPELLINGS:
        return nn.ReLU()  # fusers take modules; a functional or method relu fuses as nn.ReLU
    return node.target


def _chain(structure: Any) -> list[Any]:
    items: list[Any] = []
    while isinstance(structure, tuple):
        items.append(structure[0])
        structure = structure[1]
    items.append(structure)
    return items[::-1]


def _fused_module(
    match: Match[BackendPatternConfig],
    modules: Mapping[str, nn.Module],
    shared: set[str],
    is_qat: bool,
) -> nn.Module:
    config = match.payload
    parts = _as_modules(match.pattern, match.structure, modules, shared)
    fuser: Callable[..., nn.Module] = config.fuser_method  # type: ignore[assignment]  # filtered
    # the simple format's fuser takes the ops in execution order
    return fuser(is_qat, *(_chain(parts) if config.pattern is not None else parts))


def _is_batch_norm(node: fx.Node, modules: Mapping[str, nn.Module]) -> bool:
    """Whether ``node`` is a BatchNorm, which fusion folds into the root's weights."""
    if node.op == "call_module":
        return isinstance(modules.get(str(node.target)), _BATCH_NORMS)
    return node.op == "call_function" and node.target is F.batch_norm


def _root_first(match: Match[BackendPatternConfig], root: fx.Node) -> tuple[Any, ...]:
    """The ops of the pattern, the root's first: the fused module answers to its type."""
    heads = _chain(match.pattern)  # the chain's items are its ops (nodes): never tuples
    at = next((i for i, node in enumerate(_chain(match.structure)) if node is root), 0)
    return (heads[at], *heads[:at], *heads[at + 1 :])


def _apply(gm: fx.GraphModule, match: Match[BackendPatternConfig], fused: nn.Module) -> fx.Node:
    config = match.payload
    root = root_node(match)  # returned: it holds the fused module
    extra = (
        list(config._extra_inputs_getter(match.structure)) if config._extra_inputs_getter else []
    )
    # the fused module answers to the order keys of every call it replaces
    orders = tuple(key for node in match.nodes for key in node_info(node).call_orders)
    heads = _root_first(match, root)
    gm.set_submodule(str(root.target), fused)
    if root is not match.anchor:
        match.anchor.prepend(root)  # extra inputs may be defined after the root
        match.anchor.replace_all_uses_with(root)
    root.args = (*root.args, *extra)
    for node in reversed(match.nodes):
        if node is not root:
            node.graph.erase_node(node)
    update_info(
        root,
        module_type=type(fused),
        fused_from=heads,
        anchor=root.name,
        is_root=True,
        call_orders=orders,
    )
    return root


def _trainable_fusions(ctx: FlowContext) -> Callable[[Match[BackendPatternConfig]], Reason | None]:
    """For QAT: why a fusion cannot train (its weighted fused module has no QAT module in
    the backend config, e.g. conv + bn + add), or None. Such a fusion is refused and the
    matcher falls back to shorter patterns (conv + bn), instead of the fuser failing."""
    configs = ctx.backend_config.configs
    weighted = {c.pattern for c in configs if isinstance(c.pattern, type) and c.root_module}
    with_qat = {c.pattern for c in configs if isinstance(c.pattern, type) and c.qat_module}

    def reason(match: Match[BackendPatternConfig]) -> Reason | None:
        fused = match.payload.fused_module
        if not ctx.is_qat or fused not in weighted or fused in with_qat:
            return None
        names = ", ".join(n.name for n in match.nodes)
        words = (
            f"{fused.__name__} ({names}) has no QAT module in backend "
            f"{ctx.backend_config.name!r}, so it cannot train fused; its parts are "
            "prepared on their own (a shorter fusion when the backend has one)"
        )
        return Reason(ReasonCode.FUSION_NO_QAT_MODULE, words, field="qat_module")

    return reason


def _reads_itself(match: Match[BackendPatternConfig]) -> bool:
    """Whether an extra input of the fusion is one of its own nodes: ``y = conv(x); y + y``
    matches conv -> add with ``y`` as the add's other operand, which the fused module
    would have to read before computing it."""
    getter = match.payload._extra_inputs_getter
    return getter is not None and not set(match.nodes).isdisjoint(getter(match.structure))


def fuse(gm: fx.GraphModule, ctx: FlowContext, *, recompile: bool = True) -> fx.GraphModule:
    """Fuse every fusion pattern of the backend in ``gm`` (in place) and return it.

    ``recompile=False`` leaves the generated code stale, for a caller that edits the
    graph again and recompiles once at the end.

    Example:
        >>> import fxquant
        >>> m = nn.Sequential(nn.Conv2d(1, 1, 1), nn.ReLU()).eval()
        >>> from fxquant.flow.trace import trace
        >>> ctx = FlowContext.for_fuse(None, fxquant.get_backend_config("reference"))
        >>> [type(m).__name__ for m in fuse(trace(m, ctx), ctx).children()]
        ['ConvReLU2d']
    """
    return fuse_assigned(gm, ctx, recompile=recompile)[0]


def fuse_assigned(
    gm: fx.GraphModule, ctx: FlowContext, *, recompile: bool = True
) -> tuple[fx.GraphModule, QConfigAssignment | None]:
    """:func:`fuse`, and the qconfig of every node of the fused graph, for prepare.

    Fusion needs the qconfigs of the graph before it; the nodes it changes are
    resolved again after it (``reassign_after_fusion``), so prepare does not assign
    the whole graph a second time. ``None`` without a qconfig mapping (``fuse_fx``),
    or for a graph the flow did not capture (no ``NodeInfo``: prepare assigns it).

    Example:
        >>> import fxquant
        >>> m = nn.Sequential(nn.Conv2d(1, 1, 1), nn.ReLU()).eval()
        >>> from fxquant.flow.trace import trace
        >>> ctx = FlowContext.for_prepare(fxquant.QConfigMapping(), (), None,
        ...     fxquant.get_backend_config("reference"), is_qat=False, strict=False)
        >>> gm, assignment = fuse_assigned(trace(m, ctx), ctx)
        >>> [n.name for n in assignment.qconfigs]
        ['_0']
    """
    mapping = ctx.qconfig_mapping
    modules = module_table(gm)
    captured = any(META_KEY in n.meta for n in gm.graph.nodes)  # order keys in NodeInfo
    assignment = None if mapping is None else assign_qconfigs(gm, modules, mapping)
    index = fusion_index(ctx)
    roots = _fuse_matches(gm, ctx, index, modules, assignment) if len(index) else []
    if roots and recompile:
        gm.recompile()
    if mapping is None or assignment is None or not captured:
        return gm, None
    if roots:
        assignment = reassign_after_fusion(assignment, gm, module_table(gm), mapping, roots)
    return gm, assignment


def _fuse_matches(
    gm: fx.GraphModule,
    ctx: FlowContext,
    index: PatternIndex[BackendPatternConfig],
    modules: Mapping[str, nn.Module],
    assignment: QConfigAssignment | None,
) -> list[fx.Node]:
    """Fuse what the matcher accepts in ``gm``; return the nodes now holding fused modules."""
    qconfigs: Mapping[fx.Node, Any] = {} if assignment is None else assignment.qconfigs
    refused: dict[fx.Node, tuple[Match[BackendPatternConfig], Reason]] = {}  # by anchor
    trainable = _trainable_fusions(ctx)

    def one_qconfig(match: Match[BackendPatternConfig]) -> bool:
        if _reads_itself(match):
            return False  # the shorter patterns fuse what can be
        root = root_node(match)
        folded = [n for n in match.nodes if _is_batch_norm(n, modules)]
        reason = fusion_mismatch(match, root, qconfigs, assignment, folded) or trainable(match)
        if reason is not None:
            refused.setdefault(match.anchor, (match, reason))
        return reason is None

    claimed = match_graph(gm, index, modules=modules, accept=one_qconfig)
    for match, reason in refused.values():
        for node in match.nodes:
            if node not in claimed:  # prepare reports it if nothing quantizes the node
                update_info(node, fusion_reason=reason)
    matches = {m.anchor: m for m in claimed.values()}
    if not matches:
        return []
    calls = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_module")
    shared = {target for target, count in calls.items() if count > 1}
    roots = [_apply(gm, m, _fused_module(m, modules, shared, ctx.is_qat)) for m in matches.values()]
    gm.graph.lint()
    # the modules fusion absorbed, unless still called (a root calls its fused module)
    called = [str(n.target) for m in matches.values() for n in m.nodes if n.op == "call_module"]
    drop_unread_modules(gm, called)
    return roots
