"""Float attention as one kernel: ``softmax(q @ k^T * scale + mask) @ v`` -> SDPA.

The default mapping keeps attention's matmuls and softmax float (int8 would cost
a BERT ~17 dB and eager PyTorch has no int8 batched matmul on plain tensors).
Written out, they are five to seven ops with a [batch, heads, tokens, tokens]
score tensor between each: on a BERT-base layer (128 tokens, 1 thread) 1.0 ms
at batch 1 and 18 ms at batch 8, against 0.66 and 6.0 ms for
``F.scaled_dot_product_attention``, whose CPU kernel never materializes the
scores. These rules (``LoweringRule(quantized=False)``) match the ops only where
the mapping left every one of them float::

    k -> transpose(-1, -2) -> matmul(q, .) -> / c | * c -> (+ mask) -> softmax(-1)
      -> (eval dropout) -> matmul(., v)
    ==> Attention(q, k, v, mask) = scaled_dot_product_attention(q, k, v, mask, scale)

The kernel checks the values at run time (4-d float q/k/v, softmax over the
last axis, a mask that does not widen the scores) and otherwise replays the
ops as they were: the result is the float ops' own, up to float rounding.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.pattern import MatchAllNode
from fxquant.lowering import LoweringMatch, LoweringRule
from torch import fx, nn

from fxquant_onednn.kernels import _Replay  # the matched ops, replayable (the fallback)

__all__ = ["Attention", "attention_patterns", "attention_rules"]

_MATMULS = (torch.matmul, operator.matmul)
_SCALES = (operator.truediv, operator.mul)
# (softmax op, whether its dim is positional): F.softmax(x, dim=-1), x.softmax(-1), ...
_SOFTMAXES = (
    (F.softmax, False), (F.softmax, True), ("softmax", False), ("softmax", True),
    (torch.softmax, False), (torch.softmax, True), (nn.Softmax, False),
)  # fmt: skip
_ANY = MatchAllNode


def _same(value: Any) -> Any:
    return value


def _pattern(
    matmul: Any, scale: Any, masked: bool, dropout: bool, softmax: Any, wrap: Any = _same
) -> Any:
    """The attention pattern; ``wrap`` puts what the reference model adds after each op
    but the last (its rounding to a reduced float dtype) around that op's pattern."""
    op, positional_dim = softmax
    key_t = wrap(("transpose", _ANY, _ANY, _ANY))  # k.transpose(d0, d1): three arguments
    scores: Any = wrap((scale, wrap((matmul, _ANY, key_t)), _ANY))
    if masked:
        scores = wrap((operator.add, scores, _ANY))
    probs: Any = wrap((op, scores, _ANY) if positional_dim else (op, scores))
    if dropout:
        probs = wrap((nn.Dropout, probs))
    return (matmul, probs, _ANY)


@dataclass(frozen=True, slots=True)
class _Roles:
    """Where q, k, v and the mask are among the kernel's arguments, and the constants."""

    q: int
    k: int
    v: int
    mask: int | None
    scale: float
    key_dims: tuple[int, int]
    softmax_dim: int


def _arguments(nodes: Sequence[fx.Node]) -> list[tuple[fx.Node, int]]:
    """(consumer, position) of each kernel argument, in ``LoweringMatch.inputs`` order."""
    inside, found = set(nodes), []
    for node in nodes:
        for position, value in enumerate((*node.args, *node.kwargs.values())):
            if isinstance(value, fx.Node) and value not in inside:
                found.append((node, position))
    return found


def _softmax_dim(node: fx.Node, module: nn.Module | None) -> int | None:
    if isinstance(module, nn.Softmax):
        return module.dim
    if node.kwargs.get("dtype") is not None:
        return None  # a softmax in another dtype: not what SDPA computes
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return dim if isinstance(dim, int) else None


def _roles(match: LoweringMatch, strip: Any = _same) -> _Roles | None:
    """The roles of the matched attention, or None where the constants do not fit SDPA.

    ``strip(node)``: the op a matched argument comes from, past what ``_pattern``'s
    ``wrap`` put after it."""
    modules = dict(zip(match.nodes, match.modules, strict=True))
    outer = strip(match.anchor)
    node = strip(outer.args[0])
    assert isinstance(node, fx.Node)  # the pattern matched a node there
    dropout = modules.get(node)
    if isinstance(dropout, nn.Dropout):
        if dropout.training:
            return None  # a training dropout is not an identity
        node = strip(node.args[0])
    softmax_dim = _softmax_dim(node, modules.get(node))
    node = strip(node.args[0])
    mask = None
    if node.target is operator.add:
        mask, node = node, strip(node.args[0])
    constant = node.args[1]
    if softmax_dim is None or isinstance(constant, bool) or not isinstance(constant, (int, float)):
        return None
    if constant == 0:
        return None
    scale = 1.0 / constant if node.target is operator.truediv else float(constant)
    inner = strip(node.args[0])
    assert isinstance(inner, fx.Node)  # matched
    key_t = strip(inner.args[1])
    assert isinstance(key_t, fx.Node)  # matched
    dims = key_t.args[1:3]
    if not all(isinstance(d, int) for d in dims):
        return None
    where = {place: index for index, place in enumerate(_arguments(match.nodes))}
    return _Roles(
        q=where[(inner, 0)],
        k=where[(key_t, 0)],
        v=where[(outer, 1)],
        mask=None if mask is None else where[(mask, 1)],
        scale=scale,
        key_dims=(int(dims[0]), int(dims[1])),  # type: ignore[call-overload]  # ints, checked
        softmax_dim=softmax_dim,
    )


def _widened(value: Any, low: torch.dtype) -> Any:
    return value.float() if isinstance(value, torch.Tensor) and value.dtype == low else value


class Attention(_Replay):
    """``softmax(q @ k.transpose(d0, d1) * scale + mask) @ v`` as one SDPA call.

    Built by the attention rules from the matched float ops, which it replays
    when the values do not fit (not 4-d, softmax over another axis, a mask that
    broadcasts the scores wider, mixed dtypes).

    Example:
        >>> q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
        >>> class Eager(nn.Module):
        ...     def forward(self, q, k, v, mask):
        ...         scores = torch.matmul(q, k.transpose(-1, -2)) / 2.0 + mask
        ...         return torch.matmul(F.softmax(scores, dim=-1), v)
        >>> gm = fx.symbolic_trace(Eager())
        >>> rules = attention_rules()
        >>> mask = torch.zeros(1, 1, 1, 5)
        >>> nodes = tuple(n for n in gm.graph.nodes if n.op == "call_function" or
        ...               n.op == "call_method")
        >>> match = LoweringMatch(rules[0], "onednn", nodes, (None,) * len(nodes),
        ...                       (None,) * 4, None)
        >>> kernel = build_attention(match)
        >>> torch.allclose(kernel(k, q, mask, v), Eager()(q, k, v, mask), atol=1e-6)
        True
    """

    def __init__(
        self, match: LoweringMatch, roles: _Roles, compute_dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(match)
        self.roles = roles
        # a reduced float dtype the matched ops round each result to: SDPA runs in it
        self.compute_dtype = compute_dtype

    def forward(self, *inputs: Any) -> Any:
        """SDPA on (q, k, v, mask) when they fit, else the matched ops replayed."""
        roles = self.roles
        q, k, v = inputs[roles.q], inputs[roles.k], inputs[roles.v]
        mask = None if roles.mask is None else inputs[roles.mask]
        low = self.compute_dtype
        if low is not None:  # values rounded to it: the casts (none for `low` inputs) are exact
            q, k, v = (t.to(low) if isinstance(t, torch.Tensor) else t for t in (q, k, v))
            floats = isinstance(mask, torch.Tensor) and mask.is_floating_point()
            mask = mask.to(low) if floats else mask
        key = self._key(q, k, v, mask)
        if key is None:
            if low is not None:  # replayed as they were: on float32 (values of `low`)
                inputs = tuple(_widened(t, low) for t in inputs)
            return self.replay(inputs)
        if mask is not None and not mask.is_floating_point():
            mask = mask.to(q.dtype)  # `scores + mask` promotes a bool/int mask the same way
        out = F.scaled_dot_product_attention(q, key, v, attn_mask=mask, scale=roles.scale)
        return out if low is None else out.float()  # the matched ops end in .to(float32)

    def _key(self, q: Any, k: Any, v: Any, mask: Any) -> torch.Tensor | None:
        """k as SDPA takes it ([..., tokens, features]), or None when SDPA does not fit."""
        tensors = (q, k, v)
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
            return None
        if not q.is_floating_point() or k.dtype != q.dtype or v.dtype != q.dtype:
            return None
        if self.roles.softmax_dim not in (-1, 3):
            return None
        # q @ k.transpose(d0, d1) == q @ key.transpose(-2, -1) for this key, whatever d0, d1 are
        key: torch.Tensor = k.transpose(*self.roles.key_dims).transpose(-2, -1)
        if q.shape[:2] != key.shape[:2] or v.shape[:2] != q.shape[:2]:
            return None  # batch dims that broadcast: the eager ops decide the shape
        if q.shape[-1] != key.shape[-1] or v.shape[-2] != key.shape[-2]:
            return None
        if mask is not None:
            if not isinstance(mask, torch.Tensor) or mask.dtype not in (q.dtype, torch.bool):
                return None  # a float64 mask would promote the scores
            scores = (*q.shape[:-1], key.shape[-2])
            if mask.dim() > 4 or torch.broadcast_shapes(mask.shape, scores) != scores:
                return None
        return key


def build_attention(match: LoweringMatch) -> nn.Module | None:
    """An :class:`Attention` kernel for a matched float attention, or None.

    Example:
        >>> build_attention.__name__
        'build_attention'
    """
    roles = _roles(match)
    return None if roles is None else Attention(match, roles)


def attention_rules() -> list[LoweringRule]:
    """Float-op rules for attention written out as matmul, scale, mask, softmax, matmul.

    Every spelling of the same computation: ``torch.matmul`` or ``@``, ``/ c`` or
    ``* c``, with or without an additive mask, an eval dropout, and each way of
    calling softmax.

    Example:
        >>> rules = attention_rules()
        >>> len(rules), rules[0].name, rules[0].quantized
        (112, 'scaled_dot_product_attention', False)
    """
    return [
        LoweringRule(
            pattern,
            build=build_attention,
            name="scaled_dot_product_attention",
            complex_format=True,
            quantized=False,
        )
        for pattern in attention_patterns()
    ]


def attention_patterns(wrap: Any = _same) -> list[Any]:
    """The attention patterns of :func:`attention_rules`, each op but the last in ``wrap``.

    Example:
        >>> len(attention_patterns(lambda op: ("to", ("to", op, MatchAllNode), MatchAllNode)))
        112
    """
    return [
        _pattern(matmul, scale, masked, dropout, softmax, wrap)
        for matmul, scale, masked, dropout, softmax in itertools.product(
            _MATMULS, _SCALES, (True, False), (False, True), _SOFTMAXES
        )
    ]
