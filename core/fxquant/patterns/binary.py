"""Binary ops (add, mul, optionally followed by relu) and matrix products.

How a binary op is observed depends on how many of its arguments are tensors:
``x + 1`` keeps ``x``'s qparams (a shift of a quantized tensor by a constant
stays on the same grid only if the output shares the input observer), while
``x + y`` needs its own output observer. The flow counts the tensor arguments
and looks the observation type up in ``num_tensor_args_to_observation_type``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig, ObservationType
from fxquant.patterns.builders import op_config

__all__ = [
    "BINARY_OPS",
    "MATMUL_OPS",
    "binary_op_configs",
    "default_num_tensor_args_to_observation_type",
    "matmul_configs",
]

BINARY_OPS: tuple[Callable[..., Any], ...] = (operator.add, torch.add, operator.mul, torch.mul)
"""The ops :func:`binary_op_configs` covers unless told otherwise."""

MATMUL_OPS: tuple[Callable[..., Any], ...] = (torch.matmul, operator.matmul, torch.bmm)
"""Matrix products: two tensor inputs, a fresh output observer."""

_RELUS: tuple[Any, ...] = (nn.ReLU, F.relu, torch.relu)


def default_num_tensor_args_to_observation_type() -> dict[int, ObservationType]:
    """How many tensor arguments -> how the output is observed.

    One tensor argument (``x + 1``) shares the input's observer; zero or two
    get an observer of their own.

    Example:
        >>> default_num_tensor_args_to_observation_type()[1].name
        'OUTPUT_SHARE_OBSERVER_WITH_INPUT'
    """
    different = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    return {0: different, 1: ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT, 2: different}


def binary_op_configs(
    dtype_configs: Sequence[DTypeConfig],
    num_tensor_args_to_observation_type: Mapping[int, ObservationType] | None = None,
    *,
    ops: Sequence[Callable[..., Any]] = BINARY_OPS,
) -> list[BackendPatternConfig]:
    """Each op in ``ops`` alone and followed by ``nn.ReLU``, ``F.relu`` or ``torch.relu``.

    Args:
        dtype_configs: the dtypes the backend accepts (non-weighted).
        num_tensor_args_to_observation_type: see the module docstring; ``None``
            uses :func:`default_num_tensor_args_to_observation_type`.
        ops: the binary ops; add ``operator.sub``/``torch.sub`` for backends
            with a quantized subtraction.

    Returns:
        Four configs per op, the op alone first.

    Example:
        >>> import operator
        >>> from fxquant.config.pattern import pattern_str
        >>> [pattern_str(c.pattern) for c in binary_op_configs([], ops=[operator.add])][:2]
        ['operator.add', '(operator.add, ReLU)']
    """
    counts = num_tensor_args_to_observation_type
    if counts is None:
        counts = default_num_tensor_args_to_observation_type()
    patterns = [pattern for op in ops for pattern in (op, *((op, relu) for relu in _RELUS))]
    return [
        op_config(pattern, dtype_configs)._set_num_tensor_args_to_observation_type(dict(counts))
        for pattern in patterns
    ]


def matmul_configs(
    dtype_configs: Sequence[DTypeConfig], *, ops: Sequence[Callable[..., Any]] = MATMUL_OPS
) -> list[BackendPatternConfig]:
    """``torch.matmul``, ``a @ b`` and ``torch.bmm``: both inputs and the output observed.

    Example:
        >>> [c.pattern for c in matmul_configs([])][0] is torch.matmul
        True
    """
    return [op_config(op, dtype_configs) for op in ops]
