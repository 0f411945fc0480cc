"""Patterns with no family of their own: default ops, cat, and tensor-info ops.

Default ops (elu, hardswish, leaky_relu, dropout, instance/group norm, ...)
get their own output observer. ``torch.cat`` shares one observer between its
inputs and its output, so concatenating quantized tensors needs no requantize.
``x.size()`` and ``x.shape`` return shapes, not tensors: nothing is observed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig, ObservationType
from fxquant.patterns.builders import Pattern, op_config

__all__ = ["cat_configs", "default_op_configs", "default_ops", "tensor_info_op_configs"]


def default_ops() -> tuple[Pattern, ...]:
    """Ops observed at input and output with no weight to quantize.

    Example:
        >>> torch.nn.Hardswish in default_ops()
        True
    """
    return (
        nn.ELU,
        nn.Dropout,
        nn.GroupNorm,
        nn.Hardswish,
        nn.InstanceNorm1d,
        nn.InstanceNorm2d,
        nn.InstanceNorm3d,
        nn.LeakyReLU,
        nn.PReLU,
        F.dropout,
        F.elu,
        F.hardswish,
        F.leaky_relu,
    )


def default_op_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """Each of :func:`default_ops`, plus ``F.group_norm`` and ``F.instance_norm`` (15 configs).

    The functional norms take their affine parameters as positional inputs
    (``F.group_norm(x, groups, weight, bias)``,
    ``F.instance_norm(x, mean, var, weight, bias)``), recorded in
    ``_input_type_to_index``.

    Example:
        >>> default_op_configs([])[-1].pattern is torch.nn.functional.instance_norm
        True
    """
    return [
        *(op_config(op, dtype_configs) for op in default_ops()),
        op_config(F.group_norm, dtype_configs, inputs={"weight": 2, "bias": 3}),
        op_config(F.instance_norm, dtype_configs, inputs={"weight": 3, "bias": 4}),
    ]


def cat_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """``torch.cat`` and its aliases ``torch.concat``/``torch.concatenate``, sharing one observer.

    Example:
        >>> [c.pattern for c in cat_configs([])][0] is torch.cat
        True
    """
    shared = ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT
    return [
        op_config(op, dtype_configs, shared) for op in (torch.cat, torch.concat, torch.concatenate)
    ]


def tensor_info_op_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """``x.shape`` and ``x.size()``: accept any input dtype, observe nothing.

    Example:
        >>> tensor_info_op_configs([])[0].observation_type.name
        'INPUT_OUTPUT_NOT_OBSERVED'
    """
    unobserved = ObservationType.INPUT_OUTPUT_NOT_OBSERVED
    return [op_config(op, dtype_configs, unobserved) for op in ("shape", "size")]
