"""What each node of a traced graph produces: a float tensor, an integer tensor, a scalar, a mask.

Observers go on float tensors only (never on shapes, sizes, integer or boolean
tensors), and values carrying an additive attention mask stay in float: their
large negatives would set an observer's range, and the few float steps they
take (the add, the softmax) cost nothing next to an int8 error over the whole
range. The kinds (:class:`ValueKind`) are inferred in one pass in graph order
from the example inputs' dtypes and the ops' semantics.

The attention-mask rule, in full (``masked`` values stay float, reported
``additive_mask``):

1. A float tensor computed from integer or boolean tensors only (a cast,
   arithmetic with a float constant, a true division) is a ``mask``:
   ``(1 - attention_mask.float()) * -1e4``.
2. A ``mask`` added to or subtracted from a float tensor makes it ``masked``:
   ``scores + mask``, when the mask's computation stands for minus infinity
   somewhere (a number at most :data:`MASK_FILL_MAX`, ``finfo.min``, rules 3 and
   5-7); ``emb + ids.float() * 0.1`` is a plain float (it kept the whole model
   after it float, reported ``additive_mask``). Other ops on a mask and a float
   tensor (``x * mask``) give a plain float.
3. ``masked_fill`` of a float tensor with a constant at most
   :data:`MASK_FILL_MAX` (-1000) makes it ``masked``:
   ``scores.masked_fill(mask == 0, -1e9)``, ``float("-inf")``,
   ``torch.finfo(dtype).min``, or a tensor of one (``torch.tensor(finfo.min)``,
   DistilBERT's eager attention). Such a fill stands for minus infinity: softmax
   gives it exactly zero weight (``exp`` underflows to 0 below -104 in float32
   and -746 in float64), and no activation a model computes is that large. A
   fill above the bound is an ordinary value (clipping, padding) and the
   result a plain float.
4. A ``masked`` value stays ``masked`` through every op until a bounded one
   (softmax, sigmoid, tanh) maps it back into a float range, or
   ``F.scaled_dot_product_attention`` takes it as its mask.
5. ``torch.where(condition, a, b)`` with ``a`` or ``b`` standing for minus infinity
   (a number at most the bound, ``torch.finfo(dtype).min``, or a ``torch.full`` /
   ``torch.tensor`` of one) is rule 3 written another way: ``masked`` when the
   other value is a computed float (GPT-2's eager ``torch.where(causal, scores,
   finfo.min)``), a ``mask`` when it is a constant (transformers' ``eager_mask``:
   ``torch.where(keep, torch.tensor(0.0), finfo.min)``).
6. A constant holding minus infinity is a ``mask``: a tensor attribute (not a
   parameter) with a value at most the bound (a registered causal mask), or a
   ``torch.full`` of one (``torch.full((n, n), -inf).triu(1)``). Its add to the
   scores, observed, had a step wider than every score (16 dB, no warning).
7. A float input whose example value is an additive mask (a value at most the
   bound, none above 0: ``generate_square_subsequent_mask(n)`` passed to
   ``forward``) is a ``mask`` (the reference backend gave 15 dB with -1e9, 3.7
   with -inf, no warning). Inputs with positive values are data, whatever
   their range.
8. fxquant's own attention (``fxquant.flow.transformer``) builds its mask in one
   call, ``attention_mask(...)``: a ``mask``, whatever its inputs (a bool padding
   mask, a float causal one); its ``add_mask(scores, mask)`` makes the scores
   ``masked``.

    attention_mask (int) -> .to(float) -> (1 - m) * -1e4   : mask
    scores (float) + mask                                  : masked (until softmax)
    scores.masked_fill(m == 0, -1e9)                       : masked (until softmax)
    torch.where(keep, scores, finfo.min)                   : masked (until softmax)
    torch.where(keep, torch.tensor(0.0), finfo.min)        : mask
    self.causal_mask (a buffer of -inf above the diagonal) : mask
    forward(x, mask) with mask = generate_square_subsequent_mask(n) : mask
    x.size(0), x.shape, torch.finfo(x.dtype).min          : scalar
    torch._assert(...), the tracer's _assert_is_none(mask) : scalar (None)
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterator, Mapping
from typing import Any, Final, TypeGuard

import torch
from torch import fx, nn

from fxquant.enums import StrEnum
from fxquant.flow.inplace import on_copy
from fxquant.flow.names import attribute_value
from fxquant.flow.transformer import add_mask, attention_mask

__all__ = [
    "MASK_FILL_MAX",
    "ValueKind",
    "constant_nodes",
    "fills_a_mask",
    "node_args",
    "positioned_args",
    "splits",
    "value_kinds",
]


class ValueKind(StrEnum):
    """What a node produces; a member is its string value (``ValueKind.FLOAT == "float"``).

    Example:
        >>> [kind.value for kind in ValueKind]
        ['float', 'int', 'scalar', 'mask', 'masked']
    """

    FLOAT = "float"
    """A floating-point tensor: what observers observe."""
    INT = "int"
    """An integer or boolean tensor."""
    SCALAR = "scalar"
    """Not a tensor: a size, a shape, a Python number."""
    MASK = "mask"
    """A float tensor computed from integer or boolean tensors only (rule 1)."""
    MASKED = "masked"
    """A float tensor carrying an additive attention mask (rules 2 to 4)."""


FLOAT, INT, SCALAR, MASK, MASKED = tuple(ValueKind)  # the order of their declaration

MASK_FILL_MAX: Final = -1e3
"""The largest ``masked_fill`` value that stands for minus infinity (rule 3)."""

_MASKED_FILL = frozenset(
    {
        torch.masked_fill,
        torch.Tensor.masked_fill,
        torch.Tensor.masked_fill_,
        "masked_fill",
        "masked_fill_",
    }
)
_WHERE = frozenset({torch.where, "where"})
_FILLED: Final[dict[object, int]] = {  # the ops making a tensor of one value: its position
    torch.full: 1,
    torch.full_like: 1,
    "new_full": 2,
    torch.tensor: 0,
    "new_tensor": 1,
}
_SCALAR_METHODS = frozenset({"size", "dim", "numel", "nelement", "tolist", "item", "__len__"})
_VALUE_READS = frozenset({"tolist", "item"})  # scalars that read a tensor's values
_SHAPE_READS = _SCALAR_METHODS - _VALUE_READS
_METADATA = ("shape", "dtype", "device", "ndim")  # a tensor's attributes that are no values
# the fills: tensors of one value, the fill value (if any) their only read of values; torch's
# own functions by identity (a user's function of the same name is no fill)
_FILLS = frozenset({torch.zeros, torch.ones, torch.full, torch.empty})
_FILLS_LIKE = frozenset({torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like})
_FILL_METHODS = frozenset({"new_zeros", "new_ones", "new_full", "new_empty", "fill_", "zero_"})
_COMPARED = ("eq", "ne", "lt", "gt", "le", "ge")
_INT_METHODS = frozenset(
    {"long", "int", "bool", "byte", "short", "char", "argmax", "argmin", "nonzero"}
    | {*_COMPARED, *(f"__{name}__" for name in _COMPARED)}
)
_TYPE_INFO = (torch.finfo, torch.iinfo)
# checks the tracer writes (a specialized ``None`` argument) or a model makes: they return
# None, a value with nothing to observe or quantize
_CHECKS = frozenset({torch._assert, torch.fx._symbolic_trace._assert_is_none})
# ops returning a tuple of tensors, by name (torch.split, Tensor.split): a slice of the
# tuple is a tuple, an int index gives a tensor
_SPLITTING = frozenset(
    {"chunk", "split", "split_with_sizes", "tensor_split", "unbind", "unsafe_chunk", "unsafe_split"}
)
# methods giving their first tensor the second one's shape: the first one's values
_SHAPED_LIKE = frozenset({"expand_as", "view_as", "reshape_as"})
_FLOAT_METHODS = frozenset({"float", "half", "double", "bfloat16"})
_COMPARISONS = frozenset(
    {getattr(namespace, name) for namespace in (operator, torch) for name in _COMPARED}
    | {operator.not_, torch.logical_not, torch.logical_and, torch.logical_or}
    | {torch.argmax, torch.argmin, torch.isnan, torch.isinf}
)
_ADDITIVE = frozenset({operator.add, operator.sub, torch.add, torch.sub, "add", "sub", "__add__"})
# Python's own functions on numbers (operator.mul of two sizes, math.sqrt of a dim)
_PYTHON_NUMBERS = frozenset({"_operator", "operator", "builtins", "math"})
# sdpa takes its mask in: its output is a softmax-weighted mean of the values
_BOUNDED = frozenset(  # the functions, the modules, the method names
    {torch.softmax, torch.nn.functional.softmax, torch.sigmoid, torch.tanh}
    | {torch.nn.functional.scaled_dot_product_attention}
    | {nn.Softmax, nn.Sigmoid, nn.Tanh}
    | {"softmax", "sigmoid", "tanh"}
)


def node_args(node: fx.Node) -> Iterator[fx.Node]:
    """The nodes among ``node``'s args and kwargs, and in their lists and tuples (one level).

    Example:
        >>> gm = fx.symbolic_trace(nn.ReLU())
        >>> [n.name for n in node_args(list(gm.graph.nodes)[1])]
        ['input_1']
    """
    return (value for _, value in positioned_args(node))


def positioned_args(node: fx.Node) -> Iterator[tuple[int, fx.Node]]:
    """:func:`node_args` with each node's position among the args and kwargs.

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> list(positioned_args(g.call_function(torch.cat, ([x, x], 1))))
        [(0, x), (0, x)]
    """
    for position, value in enumerate((*node.args, *node.kwargs.values())):
        if isinstance(value, fx.Node):
            yield position, value
        elif isinstance(value, (list, tuple)):
            yield from ((position, v) for v in value if isinstance(v, fx.Node))


def constant_nodes(graph: fx.Graph, through: Collection[fx.Node] = ()) -> set[fx.Node]:
    """The nodes whose value reads no activation's values: constants for a given input shape.

    A node is one when it reads an attribute (``get_attr``), fills a tensor (``zeros``,
    ``torch.zeros_like(x)``, ``x.new_full(shape, 0.5)``, ``y.fill_(0)``: one value whatever
    ``x`` and ``y`` hold; a fill value read from an activation makes it none), reads a shape,
    a dtype or a device (``x.size(0)``, ``x.dtype``), or computes from such nodes and literals
    only. So a slice of a weight (a query projection's
    rows cut from MultiheadAttention's packed ``in_proj_weight``, which the op reading it
    quantizes as its weight) is one, and so is a tensor made in the input's size
    (transformers' ``torch.ones(input_shape)`` padding mask when no mask is passed);
    ``.item()`` and ``.tolist()`` read values. A node of ``through`` returns its input (a
    prepared model's observers): it is one when its input is. Prepare reports such a node
    it cannot match ``constant``, not skipped; convert names no observer of one that saw a
    single value.

    Example:
        >>> class Head(nn.Linear):
        ...     def forward(self, x):
        ...         return nn.functional.linear(x, self.weight[: x.size(-1)]) + torch.zeros_like(x)
        >>> gm = fx.symbolic_trace(Head(4, 4))
        >>> [n.name for n in gm.graph.nodes if n in constant_nodes(gm.graph)]
        ['weight', 'size', 'getitem', 'zeros_like']
    """
    found: set[fx.Node] = set()
    for node in graph.nodes:
        call = node.op in ("call_function", "call_method")
        if node.op == "get_attr" or (call and _reads_shape(node)):
            found.add(node)  # whatever its inputs hold
        elif (call or node in through) and all(a in found for a in _value_inputs(node)):
            found.add(node)
    return found


def _op_name(node: fx.Node) -> object:
    """A call's op by name: the method's, the function's ``__name__``."""
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _value_inputs(node: fx.Node) -> list[fx.Node]:
    """The inputs whose values ``node`` reads: all of them, but for a fill only its fill value
    (``torch.full_like(x, v)`` reads ``v``, and ``x``'s shape only)."""
    shaped = 0  # the arguments before the fill value: the tensor whose shape is copied
    if node.target is on_copy and node.args and node.args[0] in _FILL_METHODS:
        shaped = 2  # an in-place fill_ made functional at capture: (name, tensor, value)
    elif node.target in _FILLS_LIKE or (node.op == "call_method" and node.target in _FILL_METHODS):
        shaped = 1
    elif node.op != "call_function" or node.target not in _FILLS:
        return node.all_input_nodes
    found: list[fx.Node] = []
    fx.node.map_arg((node.args[shaped:], node.kwargs), found.append)
    return found


def _reads_shape(node: fx.Node) -> bool:
    """Whether the call ``node`` reads a tensor's shape, dtype or device, never its values."""
    if node.target is getattr:
        return node.args[1] in _METADATA
    return node.target is len or node.target in _SHAPE_READS


def _constants(node: fx.Node) -> list[Any]:
    return [v for v in (*node.args, *node.kwargs.values()) if not isinstance(v, fx.Node)]


def _kind_of_value(value: object) -> ValueKind:
    if isinstance(value, torch.Tensor):
        return FLOAT if value.is_floating_point() else INT
    return SCALAR


def _dtype_arg(node: fx.Node, kinds: Mapping[fx.Node, ValueKind]) -> torch.dtype | None:
    """The dtype a cast names: a constant, or a float tensor's traced ``.dtype``
    (transformers' ``mask.to(embeddings.dtype)``, float32 standing for it)."""
    constant = next((value for value in _constants(node) if isinstance(value, torch.dtype)), None)
    if constant is not None:
        return constant
    for value in node_args(node):
        if value.op == "call_function" and value.target is getattr and value.args[1] == "dtype":
            source = value.args[0]
            if isinstance(source, fx.Node) and kinds.get(source) in (FLOAT, MASK, MASKED):
                return torch.float32
    return None


def _call_kind(node: fx.Node, kinds: Mapping[fx.Node, ValueKind]) -> ValueKind:
    """The kind of a call's result from its op and its inputs' kinds."""
    args = [kinds.get(a, FLOAT) for a in node_args(node)]
    target = node.target
    if target in _SCALAR_METHODS or target is len or target in _TYPE_INFO or target in _CHECKS:
        return SCALAR  # torch.finfo(dtype).min is a Python float, never a tensor
    if target is attention_mask or target is add_mask:  # rule 8
        return MASK if target is attention_mask else MASKED
    if target is getattr:
        return SCALAR if node.args[1] in _METADATA else args[0]
    if target in _SHAPED_LIKE:
        return args[0] if args else SCALAR  # mask.expand_as(scores): the mask's values
    if target is operator.getitem:
        index = node.args[1] if len(node.args) > 1 else None
        if isinstance(index, slice) and splits(node.args[0]):
            return SCALAR  # y.chunk(2)[::-1]: a tuple of tensors, not one to observe
        return args[0] if args else SCALAR
    if target in _INT_METHODS or target in _COMPARISONS:
        return INT if any(k != SCALAR for k in args) else SCALAR
    cast = _dtype_arg(node, kinds) if target in ("to", "type") else None
    if target in _FLOAT_METHODS or (cast is not None and cast.is_floating_point):
        return MASK if args and args[0] in (INT, MASK) else FLOAT
    if cast is not None:
        return INT
    if target in _WHERE and len(node.args) == 3 and any(map(_minus_infinity, node.args[1:])):
        return _where_kind(node, kinds)
    if target in _FILLED and target not in (torch.tensor, "new_tensor") and _minus_infinity(node):
        return MASK  # rule 6: torch.full((n, n), -inf), then .triu(1) keeps it a mask
    return _mix(node, args, kinds)


def splits(node: object) -> bool:
    """Whether ``node`` calls an op returning a tuple of tensors (``chunk``, ``split``...).

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> splits(g.call_function(torch.chunk, (x, 2))), splits(g.call_method("relu", (x,)))
        (True, False)
    """
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method"):
        return False
    return _op_name(node) in _SPLITTING


def _minus_infinity(value: object) -> bool:
    """Whether ``value`` stands for minus infinity (rule 5): a number, ``finfo.min``, a fill."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value <= MASK_FILL_MAX
    if not isinstance(value, fx.Node) or value.op not in ("call_function", "call_method"):
        return False
    if value.target is getattr and value.args[1] == "min":
        source = value.args[0]
        return isinstance(source, fx.Node) and source.target is torch.finfo
    position = _FILLED.get(value.target)
    if position is None:
        return False
    fill = value.args[position] if len(value.args) > position else value.kwargs.get("fill_value")
    return _minus_infinity(fill)


def _where_kind(node: fx.Node, kinds: Mapping[fx.Node, ValueKind]) -> ValueKind:
    """Rule 5: ``torch.where`` with a minus-infinity value, by the kind of the other one."""
    others = [v for v in node.args[1:] if not _minus_infinity(v)]
    if not others or not isinstance(others[0], fx.Node):
        return MASK  # both fills, or a fill and a number: computed from the condition only
    other = others[0]
    kind = kinds.get(other, FLOAT)
    # a tensor attribute, or torch.tensor(0.0, device=..., dtype=...) made from sizes only
    constant = other.op == "get_attr" or (
        other.op == "call_function" and all(kinds.get(a) == SCALAR for a in node_args(other))
    )
    if kind == MASK or (kind == FLOAT and constant):
        return MASK
    return MASKED if kind in (FLOAT, MASKED) else MASK


def fills_a_mask(node: fx.Node) -> bool:
    """Whether ``node`` is a ``masked_fill`` whose value stands for minus infinity (rule 3).

    The value is a number at most :data:`MASK_FILL_MAX`, ``torch.finfo(dtype).min``, or a
    tensor of one (DistilBERT's ``torch.tensor(torch.finfo(dtype).min)``).

    Example:
        >>> class Attention(nn.Module):
        ...     def forward(self, scores, keep):
        ...         return scores.masked_fill(keep == 0, -1e9).masked_fill(keep == 2, -10.0)
        >>> gm = fx.symbolic_trace(Attention())
        >>> [fills_a_mask(n) for n in gm.graph.nodes if n.target == "masked_fill"]
        [True, False]
    """
    if node.op not in ("call_function", "call_method") or node.target not in _MASKED_FILL:
        return False
    fill = node.kwargs.get("value", node.args[2] if len(node.args) > 2 else None)
    return _minus_infinity(fill)


def _stands_for_minus_infinity(node: fx.Node, kinds: Mapping[fx.Node, ValueKind]) -> bool:
    """Whether a ``mask`` input of ``node`` is computed with a minus-infinity value (rule 2)."""
    seen: set[fx.Node] = set()
    todo = [a for a in node_args(node) if kinds.get(a) == MASK]
    while todo:
        mask = todo.pop()
        if mask in seen:
            continue
        seen.add(mask)
        values = (*mask.args, *mask.kwargs.values())
        if mask.op in ("placeholder", "get_attr") or fills_a_mask(mask):
            return True  # rules 6 and 7 hold these by value; rule 3
        if _minus_infinity(mask) or any(map(_minus_infinity, values)):
            return True  # (1 - m) * -1e4, * finfo.min, where(m, 0, -inf), full(-inf)
        todo += [a for a in node_args(mask) if kinds.get(a) == MASK]
    return False


def _mix(node: fx.Node, args: list[ValueKind], kinds: Mapping[fx.Node, ValueKind]) -> ValueKind:
    """Elementwise-style rule: float wins; masks spread (rules 1-4 of the module docstring)."""
    floats = [k for k in args if k in (FLOAT, MASK, MASKED)]
    if MASKED in floats:  # rule 4
        return FLOAT if node.target in _BOUNDED else MASKED
    if floats:
        if all(k == MASK for k in floats):  # rule 1: still computed from the integers only
            return MASK
        if fills_a_mask(node):  # rule 3
            return MASKED
        if MASK in floats:  # rule 2
            additive = node.target in _ADDITIVE or node.target in _MASKED_FILL
            return MASKED if additive and _stands_for_minus_infinity(node, kinds) else FLOAT
        return FLOAT
    if INT in args:
        # rule 1: an int tensor combined with a float constant is a float mask in the making
        has_float_const = any(isinstance(c, float) for c in _constants(node))
        return MASK if has_float_const or node.target is operator.truediv else INT
    python = getattr(node.target, "__module__", "") in _PYTHON_NUMBERS
    if args and node.op == "call_function" and python:
        return SCALAR
    return FLOAT if node.target is not torch.arange else INT


def value_kinds(
    gm: fx.GraphModule, modules: Mapping[str, nn.Module], example_inputs: tuple[Any, ...]
) -> dict[fx.Node, ValueKind]:
    """What each node produces (:class:`ValueKind`), by the rules of the module docstring.

    Example:
        >>> class M(nn.Module):
        ...     def forward(self, x):
        ...         return x.view(x.size(0), -1)
        >>> gm = fx.symbolic_trace(M())
        >>> kinds = value_kinds(gm, {}, (torch.randn(2, 3),))
        >>> [kinds[n].value for n in gm.graph.nodes if n.op != "output"]
        ['float', 'scalar', 'float']
    """
    kinds: dict[fx.Node, ValueKind] = {}
    inputs = iter(example_inputs)  # the placeholders' values, in order
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            value = next(inputs, None)
            kind = MASK if _is_mask_input(value) else _kind_of_value(value)
            kinds[node] = FLOAT if value is None else kind
        elif node.op == "get_attr":
            value = attribute_value(gm, node)
            kinds[node] = MASK if _holds_minus_infinity(value) else _kind_of_value(value)
        elif node.op == "call_module":
            module = modules.get(str(node.target))
            masked = any(kinds.get(a) == MASKED for a in node_args(node))
            kinds[node] = MASKED if masked and type(module) not in _BOUNDED else FLOAT
        elif node.op in ("call_function", "call_method"):
            kinds[node] = _call_kind(node, kinds)
        else:
            kinds[node] = SCALAR
    return kinds


def _is_mask_input(value: object) -> bool:
    """Rule 7: a float example input that is an additive mask (no value above 0, one at most
    :data:`MASK_FILL_MAX`): ``nn.Transformer.generate_square_subsequent_mask(n)`` passed to
    ``forward``. An unnormalized input (audio samples) has positive values too."""
    return _holds_minus_infinity(value) and not bool((value.detach() > 0).any())


def _holds_minus_infinity(value: object) -> TypeGuard[torch.Tensor]:
    """Rule 6: a float constant (not a parameter) with a value at most :data:`MASK_FILL_MAX`."""
    if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
        return False
    if not value.is_floating_point() or value.numel() == 0:
        return False
    return bool((value.detach() <= MASK_FILL_MAX).any())
