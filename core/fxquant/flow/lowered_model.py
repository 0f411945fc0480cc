"""The model ``convert_fx`` returns: a GraphModule whose failing node names itself.

A kernel given an input it cannot take (another shape than the one its weights were
packed for) raises from oneDNN or FBGEMM with no word of the model. The call is wrapped
once, at the model: when a node raises, the generated ``forward``'s frame in the
traceback gives the line, torch.fx's line map the node, and the frame's locals the
shapes of the node's inputs. Nothing runs per node, and nothing on a call that succeeds.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

from fxquant.errors import KernelCallError
from fxquant.flow.state import node_info

__all__ = ["LoweredGraphModule", "as_lowered"]


class LoweredGraphModule(fx.GraphModule):
    """A ``GraphModule`` whose call names the node that raised (:class:`KernelCallError`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except KernelCallError:
            raise  # an inner lowered model named its node already
        except RuntimeError as error:
            raise _naming_node(self, error, args) from error


def as_lowered(gm: fx.GraphModule) -> LoweredGraphModule:
    """``gm`` itself, its class turned into a :class:`LoweredGraphModule` (code regenerated).

    Example:
        >>> gm = fx.symbolic_trace(torch.nn.ReLU())
        >>> isinstance(as_lowered(gm), LoweredGraphModule), gm(torch.ones(1)).tolist()
        (True, [1.0])
    """
    # fx gives each GraphModule a class of its own (its forward lives there); this one
    # derives from LoweredGraphModule, as fx's own __new__ would make it, so copies keep it
    name = type(gm).__name__  # fx names it after the user's model class: keep that name
    gm.__class__ = type("GraphModuleImpl", (LoweredGraphModule,), {})
    gm.__class__.__name__ = name
    gm.recompile()
    return gm  # type: ignore[return-value]  # its class was just set


def _failing_node(
    gm: fx.GraphModule, error: BaseException
) -> tuple[fx.Node, dict[str, Any]] | None:
    """The node whose line of the generated ``forward`` raised, and that frame's locals."""
    code = type(gm).forward.__code__
    frames = traceback.walk_tb(error.__traceback__)
    found = next(((frame, line) for frame, line in frames if frame.f_code is code), None)
    lines = getattr(gm, "_lineno_map", None)  # torch.fx's generated line -> node index
    index = lines.get(found[1] - code.co_firstlineno) if found and lines else None
    if found is None or index is None:
        return None
    return list(gm.graph.nodes)[index], found[0].f_locals


def _shape(value: object) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def _naming_node(gm: fx.GraphModule, error: RuntimeError, args: tuple[Any, ...]) -> Exception:
    found = _failing_node(gm, error)
    call = ", ".join(_shape(a) for a in args)
    words = str(error).strip()
    first_line = words.splitlines()[0] if words else type(error).__name__
    if found is None:
        return KernelCallError(f"the lowered model failed on inputs of shape {call}: {first_line}")
    node, frame_locals = found
    got = ", ".join(_shape(frame_locals.get(n.name)) for n in node.all_input_nodes)
    info = node_info(node)
    what = node.target
    if node.op == "call_module":
        what = type(gm.get_submodule(str(node.target))).__name__
    where = f"module path {info.module_path!r}" if info.module_path else "the root module"
    if info.source:
        where += f", {info.source}"
    # the name explain() shows: lowering renames the node it replaces ('fc' -> 'fc_1')
    name = info.anchor or node.name
    msg = (
        f"node {name!r} ({node.op} {what}, {where}) of the lowered model failed "
        f"on inputs of shape {got} (the model was called with {call}): {first_line.rstrip('.')}. "
        + (
            _dtype_hint(gm, node, frame_locals, args)
            or "A kernel takes the shapes its weights were packed for: check the call's inputs "
            "against the example inputs given to prepare_fx"
        )
    )
    return KernelCallError(msg)


def _float_dtypes(values: Iterable[object]) -> set[torch.dtype]:
    return {v.dtype for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_hint(
    gm: fx.GraphModule, node: fx.Node, frame_locals: dict[str, Any], args: tuple[Any, ...]
) -> str | None:
    """Why a float op failed when the model was called with another float dtype than its
    weights' (float64 reaching a float LayerNorm), or None. Its quantize steps take any
    float dtype, as the reference model's do; its float ops take the float model's."""
    reached = _float_dtypes(frame_locals.get(n.name) for n in node.all_input_nodes)
    seen = set(reached)
    if node.op == "call_module":  # a kernel's float64 scales are buffers: weights only
        seen |= _float_dtypes(gm.get_submodule(str(node.target)).parameters())
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    given = {n: v.dtype for n, v in zip(names, args, strict=False) if _float_dtypes([v])}
    odd = {n: d for n, d in given.items() if d in reached and seen - {d}}
    other = sorted(_dtype_name(d) for d in seen - set(odd.values()))
    if not odd or not other:
        return None
    inputs = ", ".join(f"{n!r} of dtype {_dtype_name(d)}" for n, d in odd.items())
    return (
        f"The model was called with {inputs}, and this node's other tensors are "
        f"{' and '.join(other)}: call it with {other[0]} inputs (x.to(torch.{other[0]})), "
        "as the float model takes them"
    )
