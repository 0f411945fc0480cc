"""Attention in bfloat16: find a transformer's attention blocks and ask for them in the mapping.

On a CPU with AMX-BF16 the float32 attention is the one part of an int8 BERT that
runs slower than in ``torch.compile(model.bfloat16())``: inductor fuses the
matmul / softmax / matmul of both into one flash-attention kernel, 1.4x slower in
float32 (BERT-base b8: 27% of the int8 model's time). :func:`attention_blocks`
finds each block in a traced graph::

    Linear q, k, v -> view/permute/transpose -> matmul(q, k^T) -> / sqrt(d) (+ mask)
        -> softmax (-> dropout) -> matmul(., v) -> permute/view -> Linear output

and :func:`fxquant_x86.qconfig.attention_bf16_qconfig_mapping` asks, in the
config's vocabulary, for q, k and v as int8 in, bfloat16 out (``LINEAR_BF16``)
and every op of the block in bfloat16 (``FLOAT_BF16``, the additive mask
included): ``explain`` names them, and the compiled deployment runs one bfloat16
flash-attention kernel per block.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

__all__ = ["AttentionBlock", "attention_blocks", "block_nodes", "why_no_blocks"]

_MATMULS: tuple[Any, ...] = (torch.matmul, operator.matmul, torch.bmm, "matmul", "bmm")
_SOFTMAX: tuple[Any, ...] = (F.softmax, torch.softmax, "softmax")
_RESHAPES: tuple[Any, ...] = (
    "view", "reshape", "permute", "transpose", "contiguous", "narrow", "unflatten",
    torch.reshape, torch.permute, torch.transpose, torch.narrow, torch.unflatten,
)  # fmt: skip
# between the scores matmul and the softmax: the scaling and the additive mask
_SCORES: tuple[Any, ...] = (
    operator.truediv, torch.div, "div", operator.mul, torch.mul, "mul",
    operator.add, torch.add, "add", operator.sub, "masked_fill", F.dropout,
)  # fmt: skip
# what else an attention module may compute: shapes, and the ops above
# torch.nn modules the tracer keeps whole (leaves): their attention is not in the graph
_LEAF_ATTENTION = (
    nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder,
    nn.TransformerEncoderLayer, nn.TransformerDecoderLayer,
)  # fmt: skip
_SHAPES: tuple[Any, ...] = ("size", getattr, operator.getitem, F.dropout)
# the new shape of the heads' merge (transformers: ``context.size()[:-2] + (hidden,)``)
_SHAPE_ARITHMETIC: tuple[Any, ...] = (
    operator.getitem, operator.add, operator.mul, operator.floordiv,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class AttentionBlock:
    """One attention block: the module running it and its query, key and value Linears.

    Example:
        >>> AttentionBlock("layers.0.attention", ("q", "k", "v")).module
        'layers.0.attention'
    """

    module: str
    """The module whose ``forward`` calls the block's matmuls and softmax."""
    projections: tuple[str, str, str]
    """The ``nn.Linear`` modules whose outputs are the query, key and value."""


def _owner(node: fx.Node) -> str:
    """The innermost module whose forward made the call (torch.fx's ``nn_module_stack``)."""
    stack = node.meta.get("nn_module_stack") or {}
    return str(next(reversed(stack.values()))[0]) if stack else ""


def _is(node: object, targets: tuple[Any, ...]) -> bool:
    return (
        isinstance(node, fx.Node)
        and node.op in ("call_function", "call_method")
        and node.target in targets
    )


def _first_tensor(node: fx.Node) -> fx.Node | None:
    return next((a for a in node.args if isinstance(a, fx.Node)), None)


def _projection(node: object, modules: dict[str, nn.Module]) -> fx.Node | None:
    """The Linear module call whose output ``node`` reshapes (the head split), or None."""
    while _is(node, _RESHAPES):
        node = _first_tensor(node)  # type: ignore[arg-type]  # a Node: _is checked it
    linear = (
        isinstance(node, fx.Node)
        and node.op == "call_module"
        and isinstance(modules.get(str(node.target)), nn.Linear)
    )
    return node if linear else None  # type: ignore[return-value]  # a Node when linear


def _scores_chain(softmax: fx.Node) -> tuple[fx.Node, list[fx.Node]] | None:
    """The matmul feeding ``softmax`` through scaling / mask ops, and those ops."""
    chain, node = [], _first_tensor(softmax)
    while _is(node, _SCORES):
        assert node is not None  # _is checked it
        chain.append(node)
        node = node.args[0] if isinstance(node.args[0], fx.Node) else _first_tensor(node)
    return (node, chain) if isinstance(node, fx.Node) and _is(node, _MATMULS) else None


def _context(softmax: fx.Node, modules: dict[str, nn.Module]) -> fx.Node | None:
    """The matmul of the probabilities and the values (through a dropout), or None."""
    node = softmax
    while len(node.users) == 1:
        (user,) = node.users
        module = modules.get(str(user.target)) if user.op == "call_module" else None
        if not (_is(user, (F.dropout,)) or isinstance(module, nn.Dropout)):
            break
        node = user
    return next((u for u in node.users if _is(u, _MATMULS) and u.args[0] is node), None)


def _on_shapes(node: fx.Node) -> bool:
    """Whether ``node`` computes on shapes only (``x.size()[:-2] + (d,)``), never on values."""
    if _is(node, ("size", getattr)):
        return True
    inputs = node.all_input_nodes
    return (
        _is(node, _SHAPE_ARITHMETIC)
        and bool(inputs)
        and all(isinstance(i, fx.Node) and _on_shapes(i) for i in inputs)
    )


def _block(softmax: fx.Node, modules: dict[str, nn.Module]) -> AttentionBlock | str:
    """The block around ``softmax``, or why there is none (the finder's words for a user)."""
    found, context = _scores_chain(softmax), _context(softmax, modules)
    if found is None or context is None:
        side = "no matmul feeds it" if found is None else "no matmul takes its output"
        return f"softmax {softmax.name!r} is not between two matmuls ({side})"
    scores, chain = found
    sources = (scores.args[0], scores.args[1], context.args[1])
    linears = [_projection(source, modules) for source in sources]
    owner = _owner(softmax)
    if not owner:
        return f"softmax {softmax.name!r} runs in the model's own forward, not in a submodule"
    if any(linear is None for linear in linears):
        return f"softmax {softmax.name!r}: its query, key or value is no reshaped nn.Linear output"
    allowed = {scores, context, softmax, *chain}
    for node in softmax.graph.nodes:
        if _owner(node) != owner or node.op not in ("call_function", "call_method"):
            continue
        if node not in allowed and not _is(node, _RESHAPES + _SHAPES) and not _on_shapes(node):
            op = getattr(node.target, "__name__", node.target)
            return (
                f"module {owner!r} computes {node.name!r} ({op}) beside its attention: a "
                "module-name entry would put that in bfloat16 too"
            )
    names = tuple(str(linear.target) for linear in linears if linear is not None)
    return AttentionBlock(owner, (names[0], names[1], names[2]))


def attention_blocks(model: fx.GraphModule) -> list[AttentionBlock]:
    """Every attention block of ``model`` that runs in a module of its own.

    A block is a softmax between two matmuls (scores: ``q @ k^T``, scaled and
    masked on the way; context: ``probs @ v``) whose q, k and v are reshaped
    ``nn.Linear`` outputs, inside a module that computes nothing else (its
    Linears and dropouts aside): a module-name entry for it then covers exactly
    the block. An attention written inline in a bigger module (with its residual
    add or LayerNorm) is left out, as is one through
    ``F.scaled_dot_product_attention`` (already one fused kernel).

    Example:
        >>> attention_blocks(fx.symbolic_trace(nn.Linear(2, 2)))
        []
    """
    modules = dict(model.named_modules())
    blocks = []
    for node in model.graph.nodes:
        if _is(node, _SOFTMAX):
            block = _block(node, modules)
            if isinstance(block, AttentionBlock) and block not in blocks:
                blocks.append(block)
    return blocks


def block_nodes(model: fx.GraphModule, block: AttentionBlock) -> list[fx.Node]:
    """The nodes ``block``'s module-name entries cover: its module's calls and submodules.

    Example:
        >>> block_nodes(fx.symbolic_trace(nn.Linear(2, 2)), AttentionBlock("x", ("a", "b", "c")))
        []
    """

    def inside(name: str) -> bool:
        return name == block.module or name.startswith(f"{block.module}.")

    return [
        node
        for node in model.graph.nodes
        if (node.op == "call_module" and inside(str(node.target)))
        or (node.op in ("call_function", "call_method") and inside(_owner(node)))
    ]


def why_no_blocks(model: fx.GraphModule) -> str:
    """Why :func:`attention_blocks` finds nothing in ``model``, in words for its user.

    Example:
        >>> why_no_blocks(fx.symbolic_trace(nn.Linear(2, 2)))
        'its graph has no softmax'
    """
    nodes = list(model.graph.nodes)
    fused = [n for n in nodes if _is(n, (F.scaled_dot_product_attention,))]
    if fused:
        return (
            f"it calls F.scaled_dot_product_attention ({len(fused)} call(s)), one fused "
            "float32 kernel that inductor compiles as it is (a transformers model loaded "
            "with attn_implementation='eager' shows the finder its matmuls and softmax)"
        )
    modules = dict(model.named_modules())
    for node in nodes:
        leaf = modules.get(str(node.target)) if node.op == "call_module" else None
        if isinstance(leaf, _LEAF_ATTENTION):
            return (
                f"its attention runs inside {type(leaf).__name__} {node.target!r}, a torch.nn "
                "module the tracer keeps whole: no matmul or softmax of it is in the graph"
            )
    softmaxes = [n for n in nodes if _is(n, _SOFTMAX)]
    if not softmaxes:
        return "its graph has no softmax"
    reason = _block(softmaxes[0], modules)
    return str(reason) if len(softmaxes) == 1 else f"{reason} (and {len(softmaxes) - 1} more)"
