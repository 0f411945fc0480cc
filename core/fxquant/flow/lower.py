"""Lower a reference model: reference patterns -> the backend's kernels on integer tensors.

The lowering rules of the backend (``fxquant_lowering_kernels``, read from the
flow's context: ``convert_fx`` resolved them by the backend's name) are matched
with the one matcher; a match is lowered when every node in it was quantized
at prepare and the rule's ``build`` returns a kernel::

    reference: q_x -> dequantize -> fc (reference.Linear) -> quantize -> q_y -> dequantize
    lowered:   q_x -> fc (kernel: int in, int out)                     -> q_y -> dequantize

The kernel takes the integers behind each ``dequantize`` input (the float tensor
behind a dynamic one) and replaces the output ``quantize``. Afterwards the
weights that feed a kernel through ``quantize(get_attr)`` are quantized once
and stored as integer buffers, quantize/dequantize steps left without users
are removed, and :mod:`fxquant.flow.epilogues` tidies the steps between kernels
(float32 boundary quantize, kernels taking over the steps next to them). The
report marks lowered nodes ``lowered`` and gives every other quantized node the
reason ``no_lowering_kernel``, in words that say whether a rule declined it (and
why: ``Declined``) or the backend has no rule for its pattern.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from fxquant.config.pattern import pattern_str
from fxquant.flow import epilogues
from fxquant.flow.context import FlowContext
from fxquant.flow.convert_qdq import node_qparams
from fxquant.flow.dtype_check import cast_output, float_side
from fxquant.flow.epilogues import OUTPUT_OF_KEY, OUTPUT_QPARAMS_KEY
from fxquant.flow.match import Match, PatternIndex, match_graph
from fxquant.flow.names import attribute_value, drop_unread_modules, unique_name
from fxquant.flow.report import NodeStatus, Reason, ReasonCode, Report
from fxquant.flow.state import node_info
from fxquant.lowering import (
    CHOOSE_QPARAMS_OP,
    CHOOSE_QPARAMS_PER_TOKEN_OP,
    QDQ_OPS,
    STATIC_DEQUANTIZE_OPS,
    STATIC_QUANTIZE_OPS,
    Declined,
    LoweringMatch,
    LoweringRule,
    QParams,
)

__all__ = ["lower"]

_DYNAMIC_DEQUANTIZE = torch.ops.fxquant.dequantize_per_tensor.tensor


@dataclass(frozen=True, slots=True)
class _Modules:
    """The reference model's modules before lowering, and how many nodes call each."""

    by_name: dict[str, nn.Module]
    uses: Counter[str]


def _input(gm: GraphModule, value: Node) -> tuple[Node, QParams | None]:
    """What the kernel receives for one external input, and its qparams."""
    if value.op == "call_function" and value.target in STATIC_DEQUANTIZE_OPS:
        source = value.args[0]
        assert isinstance(source, Node)  # convert feeds dequantize from a quantize node
        return source, node_qparams(gm, value)
    if value.op == "call_function" and value.target == _DYNAMIC_DEQUANTIZE:
        q = value.args[0]
        assert isinstance(q, Node)  # convert feeds dequantize from a quantize node
        _, scale, _, low, high, dtype = value.args
        # the range the qparams are chosen for (the observer's: 0..127 with reduce_range), as
        # the reference does; the values fit it, whatever the stored range. A kernel choosing
        # over 0..255 instead would differ from the reference and saturate on CPUs without
        # VNNI (AVX2: uint8 x int8 products added in pairs in int16)
        choose = scale.args[0] if isinstance(scale, Node) and scale.args else None
        if isinstance(choose, Node) and choose.target == CHOOSE_QPARAMS_OP:
            _, low, high, _ = choose.args
        x = q.args[0]
        assert isinstance(x, Node)  # the float input of the dynamic quantize
        return x, QParams(dtype, low, high, is_dynamic=True)  # type: ignore[arg-type]  # convert wrote these
    return value, None


def _external_inputs(nodes: Sequence[Node]) -> list[Node]:
    """Every read of a value from outside ``nodes``, in argument order (repeats kept)."""
    read: list[Node] = []
    for node in nodes:
        map_arg((node.args, node.kwargs), read.append)  # every Node, nested ones too
    inside = set(nodes)
    return [value for value in read if value not in inside]


def _output_quantize(anchor: Node) -> Node | None:
    users = list(anchor.users)  # an op overload is the target of call_function nodes only
    return users[0] if len(users) == 1 and users[0].target in STATIC_QUANTIZE_OPS else None


def _kernel_name(gm: GraphModule, match: Match[LoweringRule], modules: _Modules) -> str:
    node = match.nodes[0]
    if len(match.nodes) == 1 and node.op == "call_module" and modules.uses[str(node.target)] == 1:
        return str(node.target)  # the kernel takes the reference module's place
    return unique_name(gm, re.sub(r"\W", "_", f"{match.anchor.name}_{match.payload.name}"))


def _install(
    gm: GraphModule,
    match: Match[LoweringRule],
    kernel: Callable[..., Any],
    modules: _Modules,
    args: list[Node],
    quantize: Node | None,
) -> None:
    anchor = match.anchor
    replaced = quantize or anchor
    with gm.graph.inserting_after(replaced):
        if isinstance(kernel, nn.Module):
            name = _kernel_name(gm, match, modules)
            gm.set_submodule(name, kernel)
            new = gm.graph.call_module(name, tuple(args))
        else:
            new = gm.graph.call_function(kernel, tuple(args))
    new.meta = dict(anchor.meta)
    # for fxquant.numerics.compare: whose value the kernel computes, and its integers' qparams
    new.meta[OUTPUT_OF_KEY] = anchor.name
    if quantize is not None:
        new.meta[OUTPUT_QPARAMS_KEY] = node_qparams(gm, quantize)
    replaced.replace_all_uses_with(new)
    # dict.fromkeys: when the output stays float, `replaced` is the anchor, also in nodes
    for node in dict.fromkeys([replaced, *reversed(match.nodes)]):
        if not node.users and node is not new and node.graph is gm.graph:
            gm.graph.erase_node(node)


def _reduced_float_side(node: Node) -> torch.dtype | None:
    """The dtype (bfloat16, float16) of a float op its qconfig asks in it, else None: such
    a node computes floats between casts, no integers."""
    config = node_info(node).dtype_config
    return float_side(config) if cast_output(config) is None else None


def _fits(match: Match[LoweringRule]) -> bool:
    """A rule for quantized ops takes only quantized nodes; a float rule only float ones
    (float32, or a float op in a reduced float dtype: its casts are in the pattern)."""
    if match.payload.quantized:
        return all(node_info(n).quantized for n in match.nodes)
    return not any(node_info(n).quantized and _reduced_float_side(n) is None for n in match.nodes)


def _lower_one(
    gm: GraphModule, match: Match[LoweringRule], backend: str, modules: _Modules
) -> str | None:
    """Lower one match; ``None`` when lowered, else why the rule declined."""
    external = _external_inputs(match.nodes)
    if match.payload.quantized:
        pairs = [_input(gm, value) for value in external]
        quantize = _output_quantize(match.anchor)
    else:  # float ops: the kernel takes the float values and returns floats
        pairs, quantize = [(value, None) for value in external], None
    lowering = LoweringMatch(
        rule=match.payload,
        backend=backend,
        nodes=match.nodes,
        modules=tuple(
            modules.by_name.get(str(n.target)) if n.op == "call_module" else None
            for n in match.nodes
        ),
        inputs=tuple(q for _, q in pairs),
        output=None if quantize is None else node_qparams(gm, quantize),
    )
    kernel = match.payload.build(lowering)
    if kernel is None:
        return "its build returned None, without a reason"
    if isinstance(kernel, Declined):  # the report gives the rule's reason
        return kernel.reason
    _install(gm, match, kernel, modules, [node for node, _ in pairs], quantize)
    return None


def _fold_weights(gm: GraphModule) -> None:
    """``quantize(get_attr)`` feeding anything but a dequantize -> an integer buffer."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in STATIC_QUANTIZE_OPS:
            continue
        inputs = [a for a in node.args if isinstance(a, Node)]
        if not all(a.op == "get_attr" for a in inputs) or not inputs:
            continue
        if all(u.op == "call_function" and u.target in QDQ_OPS for u in node.users):
            continue  # still reference form: keep the float weight and its quantize
        args = tuple(attribute_value(gm, a) for a in node.args)
        with torch.no_grad():
            value = node.target(*args)
        name = re.sub(r"\W", "_", f"{node.name}_int")
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(node):
            buffer = gm.graph.get_attr(name)
        node.replace_all_uses_with(buffer)
        gm.graph.erase_node(node)


_REMOVABLE = frozenset({*QDQ_OPS, CHOOSE_QPARAMS_OP, CHOOSE_QPARAMS_PER_TOKEN_OP, operator.getitem})


def _kept_when_unused(node: Node) -> bool:
    """Only what lowering itself leaves unused goes: a dead op of the user's model stays, as
    it does in the reference model (torch.fx's default would also drop dead float calls)."""
    removable = node.op == "call_function" and node.target in _REMOVABLE
    return not (removable or node.op == "get_attr")


def _ops_and_float_sides(gm: GraphModule) -> tuple[dict[str, str], dict[str, str]]:
    """Each node's op as reports name it (``Linear``, ``operator.add``, ``'relu'``), and the
    nodes whose dtype config asks for a float op in bfloat16 or float16 (no integer side),
    with that dtype's name."""
    ops: dict[str, str] = {}
    sides: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            ops[node.name] = type(gm.get_submodule(str(node.target))).__name__
        elif node.op in ("call_function", "call_method"):
            ops[node.name] = pattern_str(node.target)
        if (side := _reduced_float_side(node)) is not None:
            sides[node.name] = str(side).removeprefix("torch.")
    return ops, sides


def _update_report(
    report: Report,
    outcomes: dict[str, str | None],
    ctx: FlowContext,
    ops_and_sides: tuple[dict[str, str], dict[str, str]],
) -> Report:
    """Lowered nodes (``None`` in ``outcomes``) -> ``lowered``; other quantized ones say which
    rule declined (their words in ``outcomes``), or that none exists for their pattern: a user
    fixes those two differently. A float op on a reduced float side (``ops_and_sides[1]``: its
    dtype) has no integer to compute: its reference form (the op between casts to that dtype)
    is what its qconfig asks, not a miss for strict mode; a note says so."""
    ops, sides = ops_and_sides
    backend = ctx.backend_config.name
    quiet = ctx.deployed and not ctx.lowering_rules  # its toolchain takes the reference form
    changes: dict[str, dict[str, Any]] = {}
    kept: list[str] = []
    for entry in report.entries():
        if entry.node in outcomes and outcomes[entry.node] is None:
            changes[entry.node] = {"status": NodeStatus.LOWERED, "reason": None}
        elif entry.status == NodeStatus.REFERENCE and entry.node in sides:
            if entry.reason is not None or not quiet:
                changes[entry.node] = {"reason": None}
                kept.append(entry.node)
        elif entry.status == NodeStatus.REFERENCE and not quiet:
            what = entry.pattern or ops.get(entry.node, entry.op)
            why = outcomes.get(entry.node) or f"no lowering rule in backend {backend!r} for {what}"
            words = f"{why}; it stays in reference form"
            changes[entry.node] = {"reason": Reason(ReasonCode.NO_LOWERING_KERNEL, words)}
    if not kept:
        return report.with_changes(changes)
    dtypes = " / ".join(sorted({sides[node] for node in kept}))
    note = (
        f"{len(kept)} node(s) run as float ops in {dtypes}, as their qconfig asks: no integer "
        f"kernel applies to them, so they keep their reference form (eager computes them "
        f"between casts to {dtypes}; a deployment that compiles the reference form runs them "
        "in that dtype)"
    )
    return report.with_changes(changes).with_notes([note])


def lower(gm: GraphModule, ctx: FlowContext, report: Report) -> Report:
    """Lower ``gm`` (a reference model) in place with ``ctx.lowering_rules``; return the report.

    ``ctx.deployed``: the backend runs its models outside PyTorch (a
    ``Deployment``); with no rules, its reference form is the intended result
    and no node is reported ``no_lowering_kernel``.

    Example:
        >>> # see tests/flow/test_lower.py: a test backend lowers linear, conv and add
    """
    rules, backend = ctx.lowering_rules, ctx.backend_config.name
    outcomes: dict[str, str | None] = {}  # by node: None lowered, else why a rule declined it
    ops_and_sides = _ops_and_float_sides(gm)  # before lowering replaces the nodes
    if rules:
        by_name = dict(gm.named_modules())
        uses = Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_module")
        modules = _Modules(by_name, uses)
        index: PatternIndex[LoweringRule] = PatternIndex.build((r.key, r) for r in rules)
        # the veto frees a structural match of the wrong kind for the shorter patterns
        found = match_graph(gm, index, modules=by_name, accept=_fits)
        for match in {id(m): m for m in found.values()}.values():
            why, rule = _lower_one(gm, match, backend, modules), match.payload
            # a float rule's float32 nodes were never quantized; reduced float ones now run in
            # the kernel, and a float rule that declines leaves nothing to report
            names = [n.name for n in match.nodes if rule.quantized or node_info(n).quantized]
            if why is None or rule.quantized:
                words = None if why is None else f"lowering rule {rule.name} declined: {why}"
                outcomes.update(dict.fromkeys(names, words))
        _fold_weights(gm)
        epilogues.shape_reads_from_integers(gm)
        # first: a dead dequantize would count as a second reader
        gm.graph.eliminate_dead_code(is_impure_node=_kept_when_unused)
        called = [str(n.target) for n in gm.graph.nodes if n.op == "call_module"]
        epilogues.fast_boundaries(gm)
        epilogues.drop_identities(gm)
        epilogues.absorb_epilogues(gm)
        epilogues.absorb_inputs(gm)
        epilogues.merge_siblings(gm)
        gm.graph.eliminate_dead_code(is_impure_node=_kept_when_unused)
        # the modules the epilogues stopped calling, and the reference modules (children of
        # the root) that kernels replaced
        replaced = [n for n, m in gm.named_children() if getattr(m, "_IS_REFERENCE", False)]
        drop_unread_modules(gm, [*called, *replaced])
    return _update_report(report, outcomes, ctx, ops_and_sides)
