"""Convert's copy of the prepared model: the module tree and the graph, built once.

The prepared model is never modified. The copy shares what convert only reads
(observers, which it drops, and the weights of modules it replaces: ``from_float``
clones those) and copies the graph node by node with shallow metas (``NodeInfo``
records are immutable), so the extra memory stays about one copy of the weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import fx, nn
from torch.fx import GraphModule, Node

from fxquant.flow.convert_modules import is_observer, will_swap
from fxquant.flow.state import node_info

__all__ = ["ModelCopy", "copy_model", "observed_constant", "preserve"]


@dataclass(frozen=True, slots=True)
class ModelCopy:
    """Convert's copy of the prepared model: the module tree, its graph, and its modules by
    path (the steps that replace a module keep ``modules`` up to date)."""

    root: nn.Module
    graph: fx.Graph
    modules: dict[str, nn.Module]


def preserve(source: GraphModule, target: GraphModule, names: list[str]) -> None:
    """Copy the attributes ``names`` of ``source`` onto ``target`` (preserved attributes).

    Example:
        >>> source, target = fx.symbolic_trace(nn.ReLU()), fx.symbolic_trace(nn.ReLU())
        >>> source.note = "kept"; preserve(source, target, ["note"]); target.note
        'kept'
    """
    # a GraphModule built from a graph keeps only what the graph references
    for name in dict.fromkeys(names):
        if hasattr(source, name) and not hasattr(target, name):
            setattr(target, name, copy.deepcopy(getattr(source, name)))


def copy_model(gm: GraphModule, modules: dict[str, nn.Module], keep: set[str]) -> ModelCopy:
    """The module tree (deep-copied, sharing what convert only reads) and a copy of the graph.

    Observers are shared (convert only calls ``calculate_qparams`` on them, then drops
    them), except those observing a constant, which convert runs once more; so are
    the weights of modules that ``from_float`` replaces (it clones them).

    Example:
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.ReLU()))
        >>> sorted(copy_model(gm, dict(gm.named_modules()), set()).modules)
        ['', '0']
    """
    memo: dict[int, Any] = {}
    for node in gm.graph.nodes:
        if node.op != "call_module" or node.name in keep:
            continue
        module = modules.get(str(node.target))
        if module is None:
            continue
        if is_observer(module) and not observed_constant(node):
            memo[id(module)] = module  # only read (calculate_qparams), then dropped
        elif will_swap(node_info(node), module):
            memo.update((id(tensor), tensor) for tensor in module.parameters())
    # the module tree is deep-copied; the graph is copied node by node with shallow metas
    # (NodeInfo records are immutable): GraphModule's own deepcopy copies every meta deeply
    holder = nn.Module()
    # the prepared model's own mode (a fresh Module trains): the converted graph module takes
    # it, and a training-mode trace's graph reads it (flow.mode_flag: dropout calls)
    holder.training = gm.training
    for slot in ("_modules", "_parameters", "_buffers"):
        setattr(holder, slot, copy.deepcopy(getattr(gm, slot), memo))
    for node in gm.graph.nodes:
        head = str(node.target).split(".")[0]
        if node.op == "get_attr" and not hasattr(holder, head):
            setattr(holder, head, copy.deepcopy(getattr(gm, head), memo))
    graph = fx.Graph()
    graph._codegen = copy.deepcopy(gm.graph._codegen)  # pytree specs of inputs/outputs
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    # the GraphModule is built once at the end (building it compiles the code)
    return ModelCopy(holder, graph, dict(holder.named_modules()))


def observed_constant(node: Node) -> bool:
    """Whether the observer call ``node`` observes a ``get_attr`` (a functional's weight).

    Example:
        >>> observed_constant(fx.Graph().placeholder("x"))
        False
    """
    source = node.args[0] if node.args else None
    return isinstance(source, Node) and source.op == "get_attr"
