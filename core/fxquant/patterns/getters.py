"""Root-node and extra-input getters for the complex (reversed nested tuple) patterns.

A fusion that replaces a graph (not a chain) must be told which matched node
the fused module takes the place of (the *root*, whose arguments it inherits)
and which other nodes become extra arguments. For ``conv + add``:

    pattern (add, conv, X)          matched nodes (add_node, conv_node, x_node)
    root -> conv_node               the fused ConvAdd2d is called with conv's input...
    extra inputs -> [x_node]        ...plus x: ConvAdd2d(conv_input, x)

The getters receive the matched nodes in the pattern's shape. A conv branch
is either the conv node or a ``(bn_node, conv_node)`` pair when a BatchNorm
sits between conv and add, hence :func:`_conv_node`. They are plain
module-level functions so a backend config using them serializes to JSON.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "conv_add_extra_inputs_left",
    "conv_add_extra_inputs_right",
    "conv_add_relu_extra_inputs_left",
    "conv_add_relu_extra_inputs_right",
    "conv_add_relu_root_left",
    "conv_add_relu_root_right",
    "conv_add_root_left",
    "conv_add_root_right",
]


def _conv_node(branch: Any) -> Any:
    # (bn, conv) in reversed nesting: the conv is last
    return branch[1] if isinstance(branch, tuple) else branch


def conv_add_root_left(pattern: Any) -> Any:
    """``(add, conv_branch, x)`` -> the conv node.

    Example:
        >>> conv_add_root_left(("add", ("bn", "conv"), "x"))
        'conv'
    """
    return _conv_node(pattern[1])


def conv_add_extra_inputs_left(pattern: Any) -> list[Any]:
    """``(add, conv_branch, x)`` -> ``[x]``.

    Example:
        >>> conv_add_extra_inputs_left(("add", "conv", "x"))
        ['x']
    """
    return [pattern[2]]


def conv_add_root_right(pattern: Any) -> Any:
    """``(add, x, conv_branch)`` -> the conv node.

    Example:
        >>> conv_add_root_right(("add", "x", "conv"))
        'conv'
    """
    return _conv_node(pattern[2])


def conv_add_extra_inputs_right(pattern: Any) -> list[Any]:
    """``(add, x, conv_branch)`` -> ``[x]``.

    Example:
        >>> conv_add_extra_inputs_right(("add", "x", ("bn", "conv")))
        ['x']
    """
    return [pattern[1]]


def conv_add_relu_root_left(pattern: Any) -> Any:
    """``(relu, (add, conv_branch, x))`` -> the conv node.

    Example:
        >>> conv_add_relu_root_left(("relu", ("add", "conv", "x")))
        'conv'
    """
    return conv_add_root_left(pattern[1])


def conv_add_relu_extra_inputs_left(pattern: Any) -> list[Any]:
    """``(relu, (add, conv_branch, x))`` -> ``[x]``.

    Example:
        >>> conv_add_relu_extra_inputs_left(("relu", ("add", "conv", "x")))
        ['x']
    """
    return conv_add_extra_inputs_left(pattern[1])


def conv_add_relu_root_right(pattern: Any) -> Any:
    """``(relu, (add, x, conv_branch))`` -> the conv node.

    Example:
        >>> conv_add_relu_root_right(("relu", ("add", "x", ("bn", "conv"))))
        'conv'
    """
    return conv_add_root_right(pattern[1])


def conv_add_relu_extra_inputs_right(pattern: Any) -> list[Any]:
    """``(relu, (add, x, conv_branch))`` -> ``[x]``.

    Example:
        >>> conv_add_relu_extra_inputs_right(("relu", ("add", "x", "conv")))
        ['x']
    """
    return conv_add_extra_inputs_right(pattern[1])
