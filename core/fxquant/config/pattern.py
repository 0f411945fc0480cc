"""Operator patterns: the two seed formats, validation, conversion, rendering.

A pattern names what the flow matches in a traced graph. Users write one of:

    simple   op | (op1, op2) | (op1, op2, op3)        ops in execution order
    complex  op | (op, argpattern, argpattern, ...)   "reversed nested tuple": the
             last op first, then one pattern per argument; MatchAllNode matches anything

An op is a module class (``torch.nn.Linear``), a function or builtin
(``torch.nn.functional.relu``, ``operator.add``, ``torch.add``), a method name
(``"relu"``) or :class:`MatchAllNode`. fxquant keys everything by the complex
form (``(Conv2d, ReLU)`` -> ``(ReLU, Conv2d)``); only a plain chain of at most
three ops converts back to the simple form.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeAlias

import torch

from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.torch_ao_names import is_torch_ao_match_all

__all__ = [
    "MatchAllNode",
    "Pattern",
    "complex_to_simple",
    "is_match_all",
    "op_kind",
    "pattern_str",
    "simple_to_complex",
    "validate_complex",
    "validate_op",
    "validate_simple",
]

Pattern: TypeAlias = Any
"""An op, or a (possibly nested) tuple of ops; see the module docstring."""

_SIMPLE_LENGTHS = (2, 3)


class MatchAllNode:
    """In a complex-format pattern, an argument slot that matches any node.

    Used as the class itself, never instantiated.

    Example:
        >>> import operator, torch
        >>> pattern = (operator.add, torch.nn.Conv2d, MatchAllNode)
        >>> pattern_str(pattern)
        '(operator.add, Conv2d, MatchAllNode)'
    """


def is_match_all(op: object) -> bool:
    """True for :class:`MatchAllNode` (fxquant's or torch.ao's).

    Example:
        >>> is_match_all(MatchAllNode)
        True
    """
    return op is MatchAllNode or is_torch_ao_match_all(op)


def op_kind(op: object) -> str:
    """Classify one op: ``"match_all"``, ``"module"``, ``"function"`` or ``"method"``.

    Raises:
        ConfigTypeError: for anything that cannot be a pattern op.

    Example:
        >>> op_kind(torch.nn.ReLU), op_kind("relu"), op_kind(torch.add)
        ('module', 'method', 'function')
    """
    if is_match_all(op):
        return "match_all"
    if isinstance(op, type):
        if issubclass(op, torch.nn.Module):
            return "module"
    elif isinstance(op, str):
        if op.isidentifier():
            return "method"
    elif callable(op):
        return "function"
    msg = (
        f"pattern op {op!r} of type {type(op).__name__} is not a module class, a function, "
        "a method name or MatchAllNode; e.g. torch.nn.Linear, torch.add, 'relu'"
    )
    raise ConfigTypeError(msg)


def validate_op(op: object) -> object:
    """Check one op and return it, with torch.ao's MatchAllNode replaced by fxquant's.

    Example:
        >>> validate_op(torch.nn.Linear) is torch.nn.Linear
        True
    """
    return MatchAllNode if op_kind(op) == "match_all" else op


def validate_simple(pattern: object) -> Pattern:
    """Check a simple-format pattern and return it (normalized, as a tuple if it is one).

    Raises:
        ConfigError: for a tuple that is not 2 or 3 ops long, or holds a nested tuple.
        ConfigTypeError: for an op of the wrong kind.

    Example:
        >>> validate_simple([torch.nn.Conv2d, torch.nn.ReLU])
        (<class 'torch.nn.modules.conv.Conv2d'>, <class 'torch.nn.modules.activation.ReLU'>)
    """
    if not isinstance(pattern, (tuple, list)):
        return validate_op(pattern)
    if len(pattern) not in _SIMPLE_LENGTHS:
        msg = (
            f"pattern {pattern_str(pattern)} has {len(pattern)} ops; the simple format takes "
            "one op or a tuple of 2 or 3 ops in execution order; write longer or branching "
            "patterns with _set_pattern_complex_format"
        )
        raise ConfigError(msg)
    if any(isinstance(op, (tuple, list)) for op in pattern):
        msg = (
            f"pattern {pattern_str(pattern)} nests a tuple; the simple format is a flat "
            "sequence of ops; use _set_pattern_complex_format for nested patterns"
        )
        raise ConfigError(msg)
    return tuple(validate_op(op) for op in pattern)


def validate_complex(pattern: object) -> Pattern:
    """Check a complex-format (reversed nested tuple) pattern and return it normalized.

    Lists become tuples and a one-element tuple ``(op,)`` becomes ``op`` (they match
    the same nodes), so equal patterns have one spelling.

    Raises:
        ConfigError: for an empty tuple or a tuple whose first item is a tuple.
        ConfigTypeError: for an op of the wrong kind.

    Example:
        >>> validate_complex((torch.nn.ReLU, [torch.nn.BatchNorm2d, torch.nn.Conv2d]))[1]
        (<class 'torch.nn.modules.batchnorm.BatchNorm2d'>, <class 'torch.nn.modules.conv.Conv2d'>)
    """
    if not isinstance(pattern, (tuple, list)):
        return validate_op(pattern)
    if not pattern or isinstance(pattern[0], (tuple, list)):
        msg = (
            f"complex pattern {pattern_str(pattern)} must start with an op followed by "
            "one pattern per argument, e.g. (torch.nn.ReLU, (torch.nn.BatchNorm2d, "
            "torch.nn.Conv2d))"
        )
        raise ConfigError(msg)
    head = validate_op(pattern[0])
    args = tuple(validate_complex(arg) for arg in pattern[1:])
    return (head, *args) if args else head


def simple_to_complex(pattern: object) -> Pattern:
    """Convert a simple-format pattern to the complex format.

    Example:
        >>> simple_to_complex(("conv", "bn", "relu"))
        ('relu', ('bn', 'conv'))
    """
    simple = validate_simple(pattern)
    if not isinstance(simple, tuple):
        return simple
    result: Pattern = simple[0]
    for op in simple[1:]:
        result = (op, result)
    return result


def complex_to_simple(pattern: object) -> Pattern | None:
    """Convert a complex-format pattern to the simple format, or None if it has none.

    Only a plain chain (each op has at most one argument pattern) of at most three
    ops has a simple form.

    Example:
        >>> complex_to_simple(("relu", ("bn", "conv")))
        ('conv', 'bn', 'relu')
        >>> complex_to_simple(("add", "conv", "relu")) is None
        True
    """
    current = validate_complex(pattern)
    chain: list[object] = []
    while isinstance(current, tuple):
        if len(current) != 2:
            return None
        chain.append(current[0])
        current = current[1]
    chain.append(current)
    if len(chain) == 1:
        return chain[0]
    if len(chain) > max(_SIMPLE_LENGTHS):
        return None
    return tuple(reversed(chain))


def pattern_str(pattern: object) -> str:
    """Render a pattern for messages: ``(Conv2d, BatchNorm2d, ReLU)``.

    Classes show their name, functions a short module prefix, method names are quoted.

    Example:
        >>> pattern_str((torch.nn.Conv2d, torch.nn.functional.relu, "relu"))
        "(Conv2d, F.relu, 'relu')"
    """
    if isinstance(pattern, (tuple, list)):
        return "(" + ", ".join(pattern_str(p) for p in pattern) + ")"
    if is_match_all(pattern):
        return "MatchAllNode"
    if isinstance(pattern, type):
        return pattern.__name__
    if callable(pattern):
        return _function_str(pattern)
    return repr(pattern)


_SHORT_PREFIX = {
    "_operator": "operator",
    "operator": "operator",
    "torch.nn.functional": "F",
    "torch._C._nn": "F",
    "torch": "torch",
    "torch._C._VariableFunctions": "torch",
}


def _function_str(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", None)
    if not isinstance(name, str):
        return repr(func)
    module = getattr(func, "__module__", None)
    if isinstance(func, (types.BuiltinFunctionType, types.FunctionType)) and module:
        prefix = _SHORT_PREFIX.get(module)
        return f"{prefix}.{name}" if prefix else f"{module}.{name}"
    return name
