"""Capture of a model that is already a GraphModule: its graph as it is, never re-traced.

    user's GraphModule --copy graph, share leaves--> GraphModule with NodeInfo on every node

A GraphModule made by another tracer (transformers' ``HFTracer``, a custom
``fx.Tracer``) may hold calls that fxquant's tracer cannot follow again: its
generated code reads traced values where Python wants ints (a slice length),
or functions that tracer wrapped. So the flow takes its graph as it is. The
user's GraphModule is not modified: the flow works on a copy of the graph in a
new GraphModule that shares the leaf modules (every step that changes a leaf
works on a copy of it; for QAT the whole model is copied, as for any model).
Each node gets a :class:`NodeInfo`: the owning module from the
``nn_module_stack`` torch.fx's tracers record, the user's source line from
``stack_trace`` when the tracer recorded one. A GraphModule that fxquant made
(``fuse_fx``'s output) keeps its own records.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from torch import fx

from fxquant.errors import ConfigError
from fxquant.flow.context import FlowContext
from fxquant.flow.state import META_KEY, NodeInfo
from fxquant.flow.user_model import own_copy

__all__ = ["adopt"]

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def adopt(
    model: fx.GraphModule, ctx: FlowContext, is_internal: Callable[[str], bool]
) -> fx.GraphModule:
    """A copy of ``model``'s graph in a new GraphModule, each node with its ``NodeInfo``.

    Args:
        model: the user's GraphModule (left unmodified).
        ctx: the flow's context (PTQ copies the modules, sharing their parameters;
            ``is_qat`` copies the parameters too).
        is_internal: whether a file belongs to torch or fxquant (not the user's code).

    Raises:
        ConfigError: ``concrete_args`` was given (they choose how to trace, and a
            GraphModule is already traced), or a module the custom config keeps as
            one call (non-traceable, standalone) was traced through by the GraphModule's
            tracer.

    Example:
        >>> import torch
        >>> from fxquant.config.backend import BackendConfig
        >>> from fxquant.registry.resolution import ResolvedBackend
        >>> user = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
        >>> gm = adopt(user, FlowContext(ResolvedBackend(BackendConfig("b"))), lambda f: False)
        >>> gm.get_submodule("0").weight is user.get_submodule("0").weight, gm.graph is user.graph
        (True, False)
    """
    if ctx.concrete_args is not None:
        msg = (
            f"concrete_args={dict(ctx.concrete_args)!r} only applies when fxquant traces the "
            f"model; this model is already a GraphModule ({type(model).__name__}), which "
            "fxquant takes as it is: pass concrete_args to the tracer that made it, or pass "
            "the nn.Module"
        )
        raise ConfigError(msg)
    _check_leaves(model, ctx)
    # PTQ: parameters shared, buffers and modules the flow's own
    source = copy.deepcopy(model) if ctx.is_qat else own_copy(model)
    gm = fx.GraphModule(source, copy.deepcopy(model.graph), type(model).__name__)
    gm.train(model.training)
    if not any(META_KEY in node.meta for node in gm.graph.nodes):
        for node in gm.graph.nodes:
            node.meta[META_KEY] = _info(gm, node, is_internal)
    return gm


def _check_leaves(model: fx.GraphModule, ctx: FlowContext) -> None:
    config = ctx.prepare_custom_config
    calls = {str(n.target) for n in model.graph.nodes if n.op == "call_module"}
    for setting in ("non_traceable_module_names", "standalone_module_names"):
        traced = [name for name in getattr(config, setting) if name not in calls]
        if traced:
            msg = (
                f"prepare_custom_config {setting} lists {', '.join(map(repr, traced))}, but "
                f"this GraphModule has no call of it: its tracer traced through it, and "
                "fxquant takes a GraphModule as it is; make it a leaf of that tracer, or pass "
                "the nn.Module"
            )
            raise ConfigError(msg)


def _info(gm: fx.GraphModule, node: fx.Node, is_internal: Callable[[str], bool]) -> NodeInfo:
    owner: type | None
    if node.op == "call_module":
        path, owner = str(node.target), type(gm.get_submodule(str(node.target)))
    else:
        path, owner = _owner(node.meta.get("nn_module_stack"))
    trace = node.meta.get("stack_trace") if node.op.startswith("call") else None
    return NodeInfo(module_path=path, module_type=owner, source=_source(trace, is_internal))


def _owner(stack: Any) -> tuple[str, type | None]:
    """The innermost module of torch.fx's ``nn_module_stack`` (key -> (path, type))."""
    if not stack:
        return "", None
    path, owner = list(stack.values())[-1]
    return str(path), owner if isinstance(owner, type) else None


def _source(stack_trace: object, is_internal: Callable[[str], bool]) -> str | None:
    """``file:line`` of the innermost user frame of a recorded stack trace."""
    if not isinstance(stack_trace, str):
        return None
    frames = [(m["file"], m["line"]) for m in _FRAME.finditer(stack_trace)]
    user = [f"{file}:{line}" for file, line in frames if not is_internal(file)]
    return user[-1] if user else None
