"""What each node of a traced graph produces: a float tensor, an integer tensor, a scalar, a mask.

Observers go on float tensors only (never on shapes, sizes, integer or boolean
tensors), and values carrying an additive attention mask stay in float: their
large negatives would set an observer's range. The kinds are inferred in one
pass in graph order from the example inputs' dtypes and the ops' semantics:

    attention_mask (int) -> .to(float) -> (1 - m) * -1e4   : mask
    scores (float) + mask                                  : masked (until softmax)
    x.size(0), x.shape                                     : scalar
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import fx, nn

__all__ = ["FLOAT", "INT", "MASK", "MASKED", "SCALAR", "node_args", "value_kinds"]

FLOAT, INT, SCALAR, MASK, MASKED = "float", "int", "scalar", "mask", "masked"

_SCALAR_METHODS = frozenset({"size", "dim", "numel", "nelement", "tolist", "item", "__len__"})
_INT_METHODS = frozenset(
    {
        "long",
        "int",
        "bool",
        "byte",
        "short",
        "char",
        "eq",
        "ne",
        "lt",
        "gt",
        "le",
        "ge",
        "argmax",
        "argmin",
        "nonzero",
        "__eq__",
        "__ne__",
        "__lt__",
        "__gt__",
        "__le__",
        "__ge__",
    }
)
_FLOAT_METHODS = frozenset({"float", "half", "double", "bfloat16"})
_COMPARISONS = frozenset(
    {
        operator.eq,
        operator.ne,
        operator.lt,
        operator.gt,
        operator.le,
        operator.ge,
        operator.not_,
        torch.eq,
        torch.ne,
        torch.lt,
        torch.gt,
        torch.le,
        torch.ge,
        torch.logical_not,
        torch.logical_and,
        torch.logical_or,
        torch.argmax,
        torch.argmin,
        torch.isnan,
        torch.isinf,
    }
)
_ADDITIVE = frozenset({operator.add, operator.sub, torch.add, torch.sub, "add", "sub", "__add__"})
_BOUNDED = frozenset(
    {
        torch.softmax,
        torch.nn.functional.softmax,
        "softmax",
        torch.sigmoid,
        "sigmoid",
        torch.tanh,
        "tanh",
        nn.Softmax,
        nn.Sigmoid,
        nn.Tanh,
    }
)
_BIG_NEGATIVE = -1e3


def node_args(node: fx.Node) -> Iterator[fx.Node]:
    """The nodes among ``node``'s direct args and kwargs (not inside lists).

    Example:
        >>> gm = fx.symbolic_trace(nn.ReLU())
        >>> [n.name for n in node_args(list(gm.graph.nodes)[1])]
        ['input_1']
    """
    for value in (*node.args, *node.kwargs.values()):
        if isinstance(value, fx.Node):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, fx.Node))


def _constants(node: fx.Node) -> list[Any]:
    return [v for v in (*node.args, *node.kwargs.values()) if not isinstance(v, fx.Node)]


def _kind_of_value(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return FLOAT if value.is_floating_point() else INT
    return SCALAR


def _dtype_arg(node: fx.Node) -> torch.dtype | None:
    for value in _constants(node):
        if isinstance(value, torch.dtype):
            return value
    return None


def _call_kind(node: fx.Node, kinds: Mapping[fx.Node, str]) -> str:
    """The kind of a call's result from its op and its inputs' kinds."""
    args = [kinds.get(a, FLOAT) for a in node_args(node)]
    target = node.target
    if target in _SCALAR_METHODS or target is len:
        return SCALAR
    if target is getattr:
        return SCALAR if node.args[1] in ("shape", "dtype", "device", "ndim") else args[0]
    if target is operator.getitem:
        return args[0] if args else SCALAR
    if target in _INT_METHODS or target in _COMPARISONS:
        return INT if any(k != SCALAR for k in args) else SCALAR
    cast = _dtype_arg(node) if target in ("to", "type") else None
    if target in _FLOAT_METHODS or (cast is not None and cast.is_floating_point):
        return MASK if args and args[0] in (INT, MASK) else FLOAT
    if cast is not None:
        return INT
    return _mix(node, args)


def _mix(node: fx.Node, args: list[str]) -> str:
    """Elementwise-style rule: float wins; masks spread; an added mask taints."""
    floats = [k for k in args if k in (FLOAT, MASK, MASKED)]
    if MASKED in floats:
        return FLOAT if node.target in _BOUNDED else MASKED
    if floats:
        if all(k == MASK for k in floats):
            return MASK
        big = any(isinstance(c, float) and c <= _BIG_NEGATIVE for c in _constants(node))
        if MASK in floats or (big and "masked_fill" in str(node.target)):
            return (
                MASKED if node.target in _ADDITIVE or "masked_fill" in str(node.target) else FLOAT
            )
        return FLOAT
    if INT in args:
        # int tensor combined with a float constant: a float mask in the making
        has_float_const = any(isinstance(c, float) for c in _constants(node))
        return MASK if has_float_const or node.target is operator.truediv else INT
    if (
        args
        and node.op == "call_function"
        and getattr(node.target, "__module__", "")
        in (
            "_operator",
            "operator",
            "builtins",
            "math",
        )
    ):
        return SCALAR
    return FLOAT if node.target is not torch.arange else INT


def value_kinds(
    gm: fx.GraphModule, modules: Mapping[str, nn.Module], example_inputs: tuple[Any, ...]
) -> dict[fx.Node, str]:
    """What each node produces: float, int (integer/bool tensor), scalar, mask, masked.

    ``mask`` is a float tensor computed from integer/bool inputs only (an attention
    mask turned additive); ``masked`` is a float tensor with such a mask added.

    Example:
        >>> class M(nn.Module):
        ...     def forward(self, x):
        ...         return x.view(x.size(0), -1)
        >>> gm = fx.symbolic_trace(M())
        >>> [k for n, k in value_kinds(gm, {}, (torch.randn(2, 3),)).items() if n.op != "output"]
        ['float', 'scalar', 'float']
    """
    kinds: dict[fx.Node, str] = {}
    position = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            value = example_inputs[position] if position < len(example_inputs) else None
            kinds[node] = FLOAT if value is None else _kind_of_value(value)
            position += 1
        elif node.op == "get_attr":
            kinds[node] = _kind_of_value(_attribute(gm, str(node.target)))
        elif node.op == "call_module":
            module = modules.get(str(node.target))
            masked = any(kinds.get(a) == MASKED for a in node_args(node))
            kinds[node] = MASKED if masked and type(module) not in _BOUNDED else FLOAT
        elif node.op in ("call_function", "call_method"):
            kinds[node] = _call_kind(node, kinds)
        else:
            kinds[node] = SCALAR
    return kinds


def _attribute(gm: nn.Module, target: str) -> object:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value
