"""After the lowering rules: the steps between kernels, and what kernels take over.

Run by :func:`fxquant.flow.lower.lower` once every rule has run, in this order:

    shape_reads_from_integers   size()/dim()/.shape of a dequantize read the integers
    fast_boundaries             quantize steps that feed kernels -> the float32 boundary op
    drop_identities             nn.Identity kernels and eval-mode dropouts pass their input on
    absorb_epilogues            a kernel's ``absorb(step)`` takes what alone reads its output:
                                a module on it alone (``F.gelu`` offered as ``nn.GELU``),
                                Dequantize(q), then Quantize(q), a float add (AddInput)
    absorb_inputs               a kernel's ``absorb_input(Quantize(q))`` takes the quantize
                                step that alone feeds it
    merge_siblings              kernels of one class reading the same value as their only
                                argument -> the first one's ``merge(others)`` module

The protocol is the plugin author's (``fxquant.registry.hookspecs.LoweringRule``);
a kernel that declines leaves the graph as it was. The passes erase the calls they take
over; ``lower`` then drops the modules nothing calls any more.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node

from fxquant.flow.convert_qdq import node_qparams
from fxquant.flow.names import unique_name
from fxquant.lowering import DEQUANTIZE_OPS, QDQ_OPS, AddInput, Dequantize, Quantize
from fxquant.lowering.kernels import boundary

__all__ = [
    "OUTPUT_OF_KEY",
    "OUTPUT_QPARAMS_KEY",
    "absorb_epilogues",
    "absorb_inputs",
    "drop_identities",
    "fast_boundaries",
    "is_identity",
    "merge_siblings",
    "shape_reads_from_integers",
]

_OPS = torch.ops.fxquant

_BOUNDARY_QUANTIZE = (boundary.quantize_per_tensor, _OPS.quantize_per_tensor.default)


def fast_boundaries(gm: GraphModule) -> None:
    """Static quantize steps that feed a kernel -> the float32 boundary quantize.

    A quantize feeding only dequantize steps belongs to a pattern left in
    reference form, which keeps the reference numerics.
    """
    for node in gm.graph.nodes:
        static = node.op == "call_function" and node.target == _OPS.quantize_per_tensor.default
        if static and any(u.target not in QDQ_OPS for u in node.users):
            node.target = boundary.quantize_per_tensor


_ADDS = (operator.add, torch.add)

OUTPUT_OF_KEY = "fxquant_output_of"
"""``node.meta`` key on a kernel: the reference node whose value it computes (compare);
None where it returns a value no reference node has (requantized for the next op)."""

OUTPUT_QPARAMS_KEY = "fxquant_output_qparams"
"""``node.meta`` key on a kernel: the qparams of its integer output (compare)."""


def _inherit_output(kernel: Node, follower: Node, step: Any) -> None:
    """The kernel now computes what ``follower`` did: record whose value and its qparams."""
    if isinstance(step, Dequantize):
        return  # the same value, now in float
    if isinstance(step, Quantize):
        before = kernel.meta.get(OUTPUT_QPARAMS_KEY)
        if before is not None and before != step.qparams:
            # integers requantized onto the next op's grid: no node of the reference model
            # has this value (its node's own is on the first grid), so the kernel names none
            kernel.meta[OUTPUT_OF_KEY] = None
        kernel.meta[OUTPUT_QPARAMS_KEY] = step.qparams
        return
    kernel.meta[OUTPUT_OF_KEY] = follower.meta.get(OUTPUT_OF_KEY, follower.name)
    if OUTPUT_QPARAMS_KEY in follower.meta:
        kernel.meta[OUTPUT_QPARAMS_KEY] = follower.meta[OUTPUT_QPARAMS_KEY]
    else:
        kernel.meta.pop(OUTPUT_QPARAMS_KEY, None)


def _follower(gm: GraphModule, node: Node) -> tuple[Any, list[Node]] | None:
    """What alone reads ``node``'s output, as ``absorb`` receives it, and the nodes it is."""
    users = [u for u in node.users if not _reads_shape(u)]  # same shape either way
    if not users:
        return None
    if all(
        u.op == "call_function" and u.target == _OPS.dequantize_per_tensor.default for u in users
    ):
        if all(u.args[0] is node and u.args == users[0].args for u in users):
            return Dequantize(node_qparams(gm, users[0])), users
        return None
    (user,) = users if len(users) == 1 else (None,)
    if user is not None and _added_value(user, node) is not None:
        return AddInput(), [user]
    if user is None or user.args[:1] != (node,):
        return None
    if user.op == "call_module" and len(user.args) == 1 and not user.kwargs:
        return gm.get_submodule(str(user.target)), [user]
    if user.op == "call_function" and user.target in _BOUNDARY_QUANTIZE:
        return Quantize(node_qparams(gm, user)), [user]
    if user.op == "call_function" and len(user.args) == 1:
        module = _module_form(user)
        return None if module is None else (module, [user])
    return None


def _added_value(user: Node, node: Node) -> Node | None:
    """The other value of ``user`` when it is ``node + value`` (either order), else None."""
    if user.op != "call_function" or user.target not in _ADDS or user.kwargs:
        return None
    if len(user.args) != 2 or list(user.args).count(node) != 1:
        return None
    other = user.args[1] if user.args[0] is node else user.args[0]
    return other if isinstance(other, Node) else None


def _module_form(node: Node) -> nn.Module | None:
    """The module a functional call computes, offered as that module: Hugging Face models
    call ``F.gelu`` (their ``GELUActivation`` is traced through), not ``nn.GELU``."""
    if node.target is F.gelu and set(node.kwargs) <= {"approximate"}:
        approximate = node.kwargs.get("approximate", "none")
        return nn.GELU(approximate) if isinstance(approximate, str) else None
    return None


def absorb_epilogues(gm: GraphModule) -> None:
    """Offer each kernel what alone follows it, until it declines (see ``LoweringRule``)."""
    absorbed: set[Node] = set()
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or node in absorbed:
            continue
        absorb = getattr(gm.get_submodule(str(node.target)), "absorb", None)
        while absorb is not None and (found := _follower(gm, node)) is not None:
            step, steps = found
            if not absorb(step):
                break
            if isinstance(step, AddInput):  # the value added becomes the kernel's last argument
                (add,) = steps
                add.prepend(node)  # after every input of both: the add read them all
                node.args = (*node.args, _added_value(add, node))
            for follower in steps:
                _inherit_output(node, follower, step)
                follower.replace_all_uses_with(node)
                gm.graph.erase_node(follower)
                absorbed.add(follower)


def is_identity(module: nn.Module) -> bool:
    """Whether ``module`` passes its input on: ``nn.Identity``, a dropout in eval mode.

    Example:
        >>> is_identity(nn.Dropout(0.1).eval()), is_identity(nn.Dropout(0.1))
        (True, False)
    """
    dropout = isinstance(module, nn.modules.dropout._DropoutNd) and not module.training
    return dropout or isinstance(module, nn.Identity)


def absorb_inputs(gm: GraphModule) -> None:
    """Offer a kernel with ``absorb_input`` the quantize step that alone feeds its first
    argument from float values (see ``LoweringRule``)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _BOUNDARY_QUANTIZE:
            continue
        users = list(node.users)
        if len(users) != 1 or users[0].op != "call_module" or users[0].args[:1] != (node,):
            continue
        (kernel,) = users
        if node in (*kernel.args[1:], *kernel.kwargs.values()):
            continue
        absorb_input = getattr(gm.get_submodule(str(kernel.target)), "absorb_input", None)
        if absorb_input is not None and absorb_input(Quantize(node_qparams(gm, node))):
            kernel.replace_input_with(node, node.args[0])
            gm.graph.erase_node(node)


def merge_siblings(gm: GraphModule) -> None:
    """Kernels of one class that each take the same value as their only argument are
    offered to the first one's ``merge(others)``; a module it returns runs in their place
    and returns one result per kernel, in graph order (see ``LoweringRule``)."""
    order = {node: index for index, node in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        groups: dict[type, list[Node]] = {}
        for user in sorted(node.users, key=lambda u: order.get(u, len(order))):
            if user.op == "call_module" and user.args == (node,) and not user.kwargs:
                module = gm.get_submodule(str(user.target))
                if hasattr(module, "merge"):
                    groups.setdefault(type(module), []).append(user)
        for users in groups.values():
            if len(users) > 1:
                _merge(gm, users)


def _merge(gm: GraphModule, users: list[Node]) -> None:
    first, *rest = users
    merge: Any = gm.get_submodule(str(first.target)).merge  # checked by the caller
    merged = merge([gm.get_submodule(str(u.target)) for u in rest])
    if not isinstance(merged, nn.Module):
        return
    name = unique_name(gm, f"{first.target}_merged".replace(".", "_"))
    gm.add_submodule(name, merged)
    with gm.graph.inserting_before(first):
        call = gm.graph.call_module(name, first.args)
        results = [gm.graph.call_function(operator.getitem, (call, i)) for i in range(len(users))]
    for user, result in zip(users, results, strict=True):
        result.meta = dict(user.meta)
        user.replace_all_uses_with(result)
        gm.graph.erase_node(user)


def drop_identities(gm: GraphModule) -> None:
    """``nn.Identity`` kernels and eval-mode dropouts (no-ops at inference) pass their input on,
    so a kernel before them can take over the steps after them."""
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
            continue
        if is_identity(gm.get_submodule(str(node.target))):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)


def _reads_shape(node: Node) -> bool:
    return (node.op == "call_method" and node.target in ("size", "dim")) or (
        node.op == "call_function" and node.target is getattr and node.args[1:] == ("shape",)
    )


def shape_reads_from_integers(gm: GraphModule) -> None:
    """``size()``/``dim()``/``.shape`` of a dequantize read the integers (same shape), so a
    dequantize kept only for them dies."""
    for node in gm.graph.nodes:
        source = node.args[0] if node.args else None
        if _reads_shape(node) and isinstance(source, Node) and source.target in DEQUANTIZE_OPS:
            node.replace_input_with(source, source.args[0])
