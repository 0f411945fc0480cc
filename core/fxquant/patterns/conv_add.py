"""``conv2d (+ bn) + add (+ relu)`` fusions into ``ConvAdd2d`` / ``ConvAddReLU2d`` (oneDNN).

The conv can be either argument of the add, and a BatchNorm may sit between
conv and add, so each fused module has eight complex-format patterns::

    (add, conv, X)  (add, (bn, conv), X)  (add, X, conv)  (add, X, (bn, conv))
    (relu, (add, ...)) for each of the four         add in {torch.add, operator.add}

``X`` (MatchAllNode) is the other tensor; it becomes the fused module's
extra input (see :mod:`fxquant.patterns.getters`). The BN is folded into the
conv, which only PTQ allows: these fusers refuse QAT.

The fusers receive the matched modules in the pattern's nesting, a
``(bn, conv)`` pair standing for a conv branch with BatchNorm.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.config.pattern import MatchAllNode
from fxquant.errors import ConfigError
from fxquant.nn import fusers, intrinsic, reference
from fxquant.patterns import getters
from fxquant.patterns.builders import Pattern, module_config

__all__ = [
    "conv_add_configs",
    "fuse_conv_add_left",
    "fuse_conv_add_relu_left",
    "fuse_conv_add_relu_right",
    "fuse_conv_add_right",
]

# (fuser, root node getter, extra inputs getter) of one pattern shape
_Functions = tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]

_ADD_OPS: tuple[Callable[..., Any], ...] = (torch.add, operator.add)


def _conv_of(is_qat: bool, branch: Any) -> nn.Conv2d:
    if not isinstance(branch, tuple):
        return branch  # type: ignore[no-any-return]  # the matched nn.Conv2d
    bn, conv = branch
    if is_qat:
        msg = (
            f"cannot fuse {conv!r}, {bn!r} and add for QAT: the BatchNorm would have to be "
            "folded while training; leave conv+bn+add patterns out of the QAT backend config"
        )
        raise ConfigError(msg)
    folded: nn.Conv2d = fusers.fold_bn_into_conv(conv, bn)  # type: ignore[assignment]  # Conv2d in, Conv2d out
    return folded


def fuse_conv_add_left(is_qat: bool, add: Any, conv_branch: Any, extra: Any) -> nn.Module:
    """``(add, conv_branch, X)`` -> ``ConvAdd2d``, folding a BatchNorm in the branch.

    Example:
        >>> import torch
        >>> type(fuse_conv_add_left(False, torch.add, nn.Conv2d(1, 1, 1), None)).__name__
        'ConvAdd2d'
    """
    del extra  # the other tensor is an input of the fused module, not a part
    return intrinsic.ConvAdd2d(_conv_of(is_qat, conv_branch), add)


def fuse_conv_add_right(is_qat: bool, add: Any, extra: Any, conv_branch: Any) -> nn.Module:
    """``(add, X, conv_branch)`` -> ``ConvAdd2d``.

    Example:
        >>> import torch
        >>> bn = nn.BatchNorm2d(1).eval()
        >>> type(fuse_conv_add_right(False, torch.add, None, (bn, nn.Conv2d(1, 1, 1)))).__name__
        'ConvAdd2d'
    """
    del extra
    return intrinsic.ConvAdd2d(_conv_of(is_qat, conv_branch), add)


def fuse_conv_add_relu_left(is_qat: bool, relu: nn.ReLU, add_pattern: Any) -> nn.Module:
    """``(relu, (add, conv_branch, X))`` -> ``ConvAddReLU2d``.

    Example:
        >>> import torch
        >>> m = fuse_conv_add_relu_left(False, nn.ReLU(), (torch.add, nn.Conv2d(1, 1, 1), None))
        >>> type(m).__name__
        'ConvAddReLU2d'
    """
    add, conv_branch, _ = add_pattern
    return intrinsic.ConvAddReLU2d(_conv_of(is_qat, conv_branch), add, relu)


def fuse_conv_add_relu_right(is_qat: bool, relu: nn.ReLU, add_pattern: Any) -> nn.Module:
    """``(relu, (add, X, conv_branch))`` -> ``ConvAddReLU2d``.

    Example:
        >>> import torch
        >>> m = fuse_conv_add_relu_right(False, nn.ReLU(), (torch.add, None, nn.Conv2d(1, 1, 1)))
        >>> type(m).__name__
        'ConvAddReLU2d'
    """
    add, _, conv_branch = add_pattern
    return intrinsic.ConvAddReLU2d(_conv_of(is_qat, conv_branch), add, relu)


def _fusion(
    pattern: Pattern,
    dtype_configs: Sequence[DTypeConfig],
    functions: _Functions,
    fused: type[nn.Module],
) -> BackendPatternConfig:
    fuser, root_getter, extra_getter = functions
    return (
        BackendPatternConfig()
        ._set_pattern_complex_format(pattern)
        .set_dtype_configs(list(dtype_configs))
        .set_fuser_method(fuser)
        ._set_root_node_getter(root_getter)
        ._set_extra_inputs_getter(extra_getter)
        .set_fused_module(fused)
    )


def conv_add_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """The 16 conv+add(+relu) fusion patterns and the two fused modules (18 configs).

    Example:
        >>> configs = conv_add_configs([])
        >>> len(configs), configs[-1].pattern is intrinsic.ConvAddReLU2d
        (18, True)
    """
    g = getters
    # the conv branch left, then right, of the add: (fuser, root getter, extra inputs getter)
    plain: tuple[_Functions, ...] = (
        (fuse_conv_add_left, g.conv_add_root_left, g.conv_add_extra_inputs_left),
        (fuse_conv_add_right, g.conv_add_root_right, g.conv_add_extra_inputs_right),
    )
    under_relu: tuple[_Functions, ...] = (
        (fuse_conv_add_relu_left, g.conv_add_relu_root_left, g.conv_add_relu_extra_inputs_left),
        (fuse_conv_add_relu_right, g.conv_add_relu_root_right, g.conv_add_relu_extra_inputs_right),
    )
    configs: list[BackendPatternConfig] = []
    for add, conv in itertools.product(_ADD_OPS, (nn.Conv2d, (nn.BatchNorm2d, nn.Conv2d))):
        sides = ((add, conv, MatchAllNode), (add, MatchAllNode, conv))
        for side, functions in zip(sides, plain, strict=True):
            configs.append(_fusion(side, dtype_configs, functions, intrinsic.ConvAdd2d))
        for side, functions in zip(sides, under_relu, strict=True):
            configs.append(
                _fusion((nn.ReLU, side), dtype_configs, functions, intrinsic.ConvAddReLU2d)
            )
    root = {"root": nn.Conv2d, "reference": reference.Conv2d}
    configs.append(module_config(intrinsic.ConvAdd2d, dtype_configs, **root))
    configs.append(module_config(intrinsic.ConvAddReLU2d, dtype_configs, **root))
    return configs
