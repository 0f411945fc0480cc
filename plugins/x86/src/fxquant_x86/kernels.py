"""x86's lowering rules: fxquant-onednn's kernels, one rule per x86 pattern.

Plus attention in bfloat16 (the ``attention_bf16`` mode) as one kernel. Its reference
form rounds every op's result, ``.to(bfloat16).to(float32)``, and eager float32 ops
between those casts are slower than float32 attention's one SDPA call (BERT-base b1
1.34x, b8 1.81x). These rules match the ops with their roundings::

    k -> transpose -> R -> matmul(q, .) -> R -> / c -> R -> (+ mask -> R) -> softmax -> R
      -> (eval dropout -> R) -> matmul(., v) -> R      R: .to(bfloat16).to(float32)
    ==> F.scaled_dot_product_attention on q, k, v, mask cast to bfloat16 once

and :func:`exact_rounding_rule` leaves out the roundings of values that are bf16
already (the head split's view / permute, the head merge after the kernel).

q, k, v and the mask arrive rounded to bfloat16 already, so those casts are exact; the
kernel keeps the scores in float32 inside (one rounding fewer than the reference's
four on them), within bfloat16's rounding of the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from fxquant.config.pattern import MatchAllNode
from fxquant.lowering import LoweringMatch, LoweringRule
from fxquant_onednn.attention import Attention, attention_patterns
from fxquant_onednn.attention import _roles as attention_roles  # the same walk, past the casts
from fxquant_onednn.kernels import lowering_rules
from torch import fx, nn

from fxquant_x86.patterns import shared_pattern_configs

__all__ = ["bf16_attention_rules", "exact_rounding_rule", "x86_lowering_rules"]


def x86_lowering_rules() -> list[LoweringRule]:
    """A oneDNN kernel (or an integer / float op module) for every x86 pattern.

    Dynamic int8 LSTM / GRU / cells: torch's quantized recurrent ops on the ``x86``
    quantized engine (``fxquant_quantized_engine.recurrent``). Attention in bfloat16:
    :func:`bf16_attention_rules`.

    Example:
        >>> len(x86_lowering_rules()) > 100
        True
    """
    rules = lowering_rules(shared_pattern_configs(), recurrent_engine="x86")
    return [*rules, *bf16_attention_rules(), exact_rounding_rule()]


def _rounded(op: Any) -> Any:
    """``op`` then the reference model's rounding: ``.to(bfloat16).to(float32)``."""
    return ("to", ("to", op, MatchAllNode), MatchAllNode)


def _is_cast(node: Any, dtype: torch.dtype) -> bool:
    return (
        isinstance(node, fx.Node)
        and node.op == "call_method"
        and node.target == "to"
        and len(node.args) == 2
        and not node.kwargs
        and node.args[1] == dtype
    )


def _unrounded(node: Any) -> Any:
    """The op behind a ``.to(bfloat16).to(float32)`` pair."""
    return node.args[0].args[0] if _is_cast(node, torch.float32) else node


def _bf16_roundings(nodes: Sequence[fx.Node]) -> bool:
    """Whether every matched cast pair is ``.to(bfloat16).to(float32)``, not another dtype."""
    inside = set(nodes)
    casts = [n for n in nodes if n.op == "call_method" and n.target == "to"]
    outer = [n for n in casts if n.args[0] in inside and n.args[0] in casts]
    pairs = all(_is_cast(n, torch.float32) and _is_cast(n.args[0], torch.bfloat16) for n in outer)
    return pairs and 2 * len(outer) == len(casts)


def build_bf16_attention(match: LoweringMatch) -> nn.Module | None:
    """One bfloat16 SDPA kernel for attention rounded to bfloat16 op by op, or None.

    Example:
        >>> build_bf16_attention.__name__
        'build_bf16_attention'
    """
    if not _bf16_roundings(match.nodes):
        return None
    roles = attention_roles(match, _unrounded)
    return None if roles is None else Attention(match, roles, torch.bfloat16)


def bf16_attention_rules() -> list[LoweringRule]:
    """Float-op rules for attention in bfloat16: each op of it followed by its rounding.

    Example:
        >>> rules = bf16_attention_rules()
        >>> len(rules), rules[0].name, rules[0].quantized
        (112, 'bf16_scaled_dot_product_attention', False)
    """
    return [
        LoweringRule(
            pattern,
            build=build_bf16_attention,
            name="bf16_scaled_dot_product_attention",
            complex_format=True,
            quantized=False,
        )
        for pattern in map(_rounded, attention_patterns(_rounded))
    ]


# ops that move or pick values without computing new ones: bf16 values stay bf16 values
_SHAPE_METHODS = frozenset(
    {"view", "reshape", "permute", "transpose", "contiguous", "flatten", "squeeze", "unsqueeze"}
)
_SHAPE_FUNCTIONS = frozenset(
    {torch.reshape, torch.permute, torch.transpose, torch.flatten, torch.squeeze, torch.unsqueeze}
)


def _bf16_values(node: Any) -> bool:
    """Whether ``node``'s float32 values are bfloat16 values: a rounding's, moved around."""
    while isinstance(node, fx.Node):
        if _is_cast(node, torch.float32) and _is_cast(node.args[0], torch.bfloat16):
            return True
        shape_op = node.op == "call_method" and node.target in _SHAPE_METHODS
        if not (shape_op or (node.op == "call_function" and node.target in _SHAPE_FUNCTIONS)):
            return False
        node = node.args[0]
    return False


class ToBFloat16(nn.Module):
    """``x.to(torch.bfloat16)``: a rounding whose readers all take bfloat16 tensors."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded to bfloat16, in that dtype."""
        return x.to(torch.bfloat16)


def _bf16_attention(gm: Any, node: fx.Node) -> bool | None:
    """For a module call: True for a bf16 attention kernel, None for an identity, else False."""
    module = gm.get_submodule(str(node.target))
    if isinstance(module, nn.Identity):
        return None
    return isinstance(module, Attention) and module.compute_dtype == torch.bfloat16


def _read_as_bf16(node: fx.Node) -> bool:
    """Whether bf16 attention kernels read ``node``, through shape ops and identities, and
    nothing else does but a size, a cast: each of them takes a bfloat16 tensor as it is."""
    gm, found = node.graph.owning_module, False
    readers = list(node.users)
    while readers:
        user = readers.pop()
        if user.op == "call_method" and user.target in ("size", "to"):
            if user.target == "to" and not isinstance(user.args[-1], torch.dtype):
                return False
            continue
        shape_op = user.op == "call_method" and user.target in _SHAPE_METHODS
        if shape_op or (user.op == "call_function" and user.target in _SHAPE_FUNCTIONS):
            readers += list(user.users)
            continue
        kernel = _bf16_attention(gm, user) if user.op == "call_module" else False
        if kernel is False:
            return False
        found = found or kernel is True
        readers += [] if kernel else list(user.users)
    return found


def build_exact_rounding(match: LoweringMatch) -> nn.Module | None:
    """``nn.Identity`` (removed) for a rounding of values rounded already, ``ToBFloat16``
    for one only bf16 attention kernels read (they would cast it again), else None.

    Runs after the rules downstream (lowering walks the graph backwards), so the readers
    are kernels by then, and before the ones upstream, so the inputs are still roundings.

    Example:
        >>> build_exact_rounding.__name__
        'build_exact_rounding'
    """
    inner, outer = match.nodes
    if not (_is_cast(inner, torch.bfloat16) and _is_cast(outer, torch.float32)):
        return None
    if _bf16_values(inner.args[0]):
        return nn.Identity()
    return ToBFloat16() if _read_as_bf16(outer) else None


def exact_rounding_rule() -> LoweringRule:
    """``.to(bfloat16).to(float32)`` of values rounded to bfloat16 already: left out.

    The reference model rounds after every bf16 op, a head split's view and permute
    included; on their input's bf16 values those casts copy the tensor twice and change
    nothing (an eager BERT-base layer in bf16 attention has ten such pairs).

    Example:
        >>> exact_rounding_rule().name
        'bf16_exact_rounding'
    """
    return LoweringRule(
        _rounded(MatchAllNode),
        build=build_exact_rounding,
        name="bf16_exact_rounding",
        complex_format=True,
        quantized=False,
    )
