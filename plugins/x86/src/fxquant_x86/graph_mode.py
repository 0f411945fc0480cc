"""x86's graph mode: a transformer's attention in bfloat16 by default, where the CPU computes it.

On a CPU with AMX-BF16 or AVX512-BF16 (:func:`fxquant_x86.precision.bf16_accelerated`),
a graph with attention blocks (:func:`fxquant_x86.attention.attention_blocks`: a softmax
between two matmuls in a module of its own, BERT's self-attention) gets the
``attention_bf16`` mode: the mapping of
:func:`fxquant_x86.qconfig.attention_bf16_qconfig_mapping`, one set of module-name entries
per block (q, k, v Linears int8 in, bfloat16 out; scores, mask, softmax and context
matmul bfloat16). The compiled deployment runs each block as one bfloat16
flash-attention kernel (BERT-base b8: 0.653x bf16 + torch.compile's latency, against
0.703x with the attention in float32; plugins/x86/README.md). Elsewhere, on QAT, and on
graphs without such a block, there is no mode: the default mapping as it is; nor where
the user's mapping decides every block (below).

The user's mapping decides first: a block where it gives any node another qconfig than
x86's default mapping does (an object type, a module name or regex above the block, a
call order), or names a module of it at all (``set_module_name(block, ...)``, even with
the default's qconfig: a way to keep one block float32), is left to it, and the mode's
line in ``explain`` says so.
"""

from __future__ import annotations

import os

from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow.qconfig_assign import assign_qconfigs
from fxquant.registry import GraphMode
from torch import fx

from fxquant_x86 import precision
from fxquant_x86.attention import (
    _MATMULS,
    _SHAPES,
    _SOFTMAX,
    AttentionBlock,
    attention_blocks,
    block_nodes,
)
from fxquant_x86.qconfig import default_qconfig_mapping, with_bf16_attention

__all__ = ["MODE", "graph_mode"]

MODE = "attention_bf16"
"""The mode's name, as ``explain`` prints it (``mode: attention_bf16 (...)``)."""


def _decided_by_user(
    model: fx.GraphModule, blocks: list[AttentionBlock], mapping: QConfigMapping
) -> dict[str, str]:
    """Per block module the user's mapping decides, a node whose qconfig it sets its own way
    (``module 'path'`` or ``node 'name'``)."""
    modules = dict(model.named_modules())
    mine = assign_qconfigs(model, modules, mapping)
    default = assign_qconfigs(model, modules, default_qconfig_mapping(False))
    moded = with_bf16_attention(default_qconfig_mapping(False), model, blocks)
    bf16 = assign_qconfigs(model, modules, moded).qconfigs

    def own(node: fx.Node) -> bool:
        # another qconfig, or the default's by an entry of the user's naming the module
        named = node in mine.named and node not in default.named
        return named or mine.qconfigs.get(node) != default.qconfigs.get(node)

    decided = {}
    for block in blocks:
        nodes = block_nodes(model, block)
        if all(mine.qconfigs.get(node) == bf16.get(node) for node in nodes):
            continue  # the user asked for this block in bf16 themselves: agreed
        own_nodes = [node for node in nodes if own(node)]
        if own_nodes:
            decided[block.module] = _recognised(own_nodes)
    return decided


def _recognised(nodes: list[fx.Node]) -> str:
    """The block's node the line names, as its user knows it: a module by its path (what the
    mapping's entries name), else a matmul or softmax, else an op that is not a shape read:
    a module-name entry covers every node of the block, and the first is a ``size()`` call
    the user never wrote."""
    modules = [node for node in nodes if node.op == "call_module"]
    if modules:
        return f"module {str(modules[0].target)!r}"
    attention = [node for node in nodes if node.target in (*_MATMULS, *_SOFTMAX)]
    values = [node for node in nodes if node.target not in _SHAPES]
    return f"node {(attention or values or nodes)[0].name!r}"


def _reason(blocks: list[AttentionBlock], decided: dict[str, str]) -> str:
    flags = [flag for flag in precision.BF16_FLAGS if flag in precision.cpu_flags()]
    cpu = f"this CPU has {', '.join(flags) or 'bfloat16 arithmetic'}"
    if os.environ.get(precision.BF16_ENV):
        cpu = f"{precision.BF16_ENV}=1"
    taken = len(blocks) - len(decided)
    words = (
        f"{taken} of {len(blocks)} attention block(s) in bfloat16, {cpu}: "
        "q, k, v Linear int8 in, bfloat16 out; scores, mask, softmax and context matmul "
        "bfloat16 (one flash-attention kernel each when compiled)"
    )
    if decided:
        module, node = next(iter(decided.items()))
        words += (
            f"; {len(decided)} left as your mapping says (block {module!r}: your qconfig "
            f"for {node})"
        )
    return words


def graph_mode(model: fx.GraphModule, mapping: QConfigMapping, is_qat: bool) -> GraphMode | None:
    """The ``attention_bf16`` mode for a graph with attention blocks on a bfloat16 CPU, else None.

    Args:
        model: the traced graph (read only).
        mapping: the user's mapping: blocks where it sets a node its own way are left to it.
        is_qat: ``prepare_qat_fx``: no mode (the bfloat16 side is a post-training choice).

    Example:
        >>> from torch import nn
        >>> graph_mode(fx.symbolic_trace(nn.Linear(2, 2)), QConfigMapping(), False) is None
        True
    """
    if is_qat or not precision.bf16_accelerated():
        return None
    blocks = attention_blocks(model)
    if not blocks:
        return None
    decided = _decided_by_user(model, blocks, mapping)
    chosen = [block for block in blocks if block.module not in decided]
    if not chosen:
        # the user's mapping decides every block: the mode would add nothing but a warning
        return None
    modes = with_bf16_attention(default_qconfig_mapping(False), model, chosen)
    return GraphMode(MODE, _reason(blocks, decided), modes)
