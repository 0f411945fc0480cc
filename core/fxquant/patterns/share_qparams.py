"""Ops whose output stays on the input's quantization grid.

Pooling, reshaping, relu, clamp and the like only move, drop or clip values,
so a quantized input can flow through them unchanged: the output shares the
input's observer (``OUTPUT_SHARE_OBSERVER_WITH_INPUT``)::

    obs_0 -> max_pool2d -> obs_0        (one observer instance, one set of qparams)

Patterns are modules, functions, or method names (``x.view(...)`` is ``"view"``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig, ObservationType
from fxquant.patterns.builders import Pattern, op_config

__all__ = ["share_qparams_op_configs", "share_qparams_ops"]

_METHODS = (
    "clamp",
    "contiguous",
    "detach",
    "detach_",
    "flatten",
    "mean",
    "movedim",
    "narrow",
    "permute",
    "relu",
    "relu_",
    "repeat",
    "repeat_interleave",
    "reshape",
    "resize_",
    "squeeze",
    "squeeze_",
    "transpose",
    "unflatten",
    "unsqueeze",
    "unsqueeze_",
    "view",
)


def share_qparams_ops() -> tuple[Pattern, ...]:
    """The generic ops that keep their input's qparams: modules, then functions, then methods.

    Example:
        >>> "view" in share_qparams_ops() and torch.nn.MaxPool2d in share_qparams_ops()
        True
    """
    modules = (
        *(getattr(nn, f"{kind}{d}d") for kind in _POOLS for d in (1, 2, 3)),
        nn.Flatten,
        nn.Hardtanh,
        nn.Identity,
        nn.PixelShuffle,
        nn.PixelUnshuffle,
        nn.ReLU,
        nn.ReLU6,
    )
    functions = (
        F.adaptive_avg_pool1d,
        F.adaptive_avg_pool2d,
        F.adaptive_avg_pool3d,
        F.avg_pool1d,
        F.avg_pool2d,
        F.avg_pool3d,
        F.hardtanh,
        F.hardtanh_,
        F.interpolate,
        F.max_pool1d,
        F.max_pool2d,
        F.max_pool3d,
        F.pixel_shuffle,
        F.pixel_unshuffle,
        F.relu,
        F.relu6,
        torch.clamp,
        torch.flatten,
        torch.mean,
        torch.movedim,
        torch.narrow,
        torch.permute,
        torch.relu,
        torch.repeat_interleave,
        torch.squeeze,
        torch.stack,
        torch.transpose,
        torch.unflatten,
        torch.unsqueeze,
        operator.floordiv,
    )
    return (*modules, *functions, *_METHODS)


_POOLS = ("AdaptiveAvgPool", "AvgPool", "MaxPool")


def share_qparams_op_configs(
    dtype_configs: Sequence[DTypeConfig], *, ops: Sequence[Pattern] | None = None
) -> list[BackendPatternConfig]:
    """One config per op in ``ops``, its output sharing the input's observer.

    Args:
        dtype_configs: the dtypes the backend accepts (non-weighted).
        ops: the ops to configure (default :func:`share_qparams_ops`), for a
            backend whose list differs.

    Example:
        >>> configs = share_qparams_op_configs([], ops=["view"])
        >>> configs[0].observation_type.name
        'OUTPUT_SHARE_OBSERVER_WITH_INPUT'
    """
    shared = ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT
    chosen = share_qparams_ops() if ops is None else ops
    return [op_config(op, dtype_configs, shared) for op in chosen]
