"""Small constructors shared by the pattern builders, public for plugin authors.

Every builder in this package turns a list of patterns plus the backend's
dtype configs into :class:`BackendPatternConfig` objects. The shapes of config
that recur (a plain op, a weighted module with its QAT/reference counterparts, a
fusion, a fusion ending in either ReLU) each get one helper here so the builders
read as tables. A plugin with patterns of its own builds them with the same helpers
(``from fxquant.patterns.builders import Pattern, op_config``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch.nn.functional as F
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig, ObservationType
from fxquant.config.pattern import Pattern

__all__ = ["Pattern", "fusion_config", "module_config", "op_config", "relu_fusion_configs"]


def op_config(
    pattern: Pattern,
    dtype_configs: Sequence[DTypeConfig],
    observation_type: ObservationType | None = None,
    *,
    inputs: Mapping[str, int] | None = None,
) -> BackendPatternConfig:
    """A config for ``pattern`` with ``dtype_configs`` and, when given, ``observation_type``.

    Args:
        pattern: the op, module class, method name or tuple of them.
        dtype_configs: the dtypes the backend accepts for it.
        observation_type: how its output is observed; ``None`` keeps the config's
            default, an observer of its own (``OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT``).
        inputs: for a function that takes its weight and bias as positional inputs,
            their indices (``{"weight": 1, "bias": 2}`` for ``F.linear(x, weight, bias)``).

    Example:
        >>> import torch
        >>> op_config(torch.cat, []).pattern is torch.cat
        True
        >>> op_config(F.linear, [], inputs={"weight": 1, "bias": 2})._input_type_to_index
        {'weight': 1, 'bias': 2}
    """
    config = BackendPatternConfig(pattern).set_dtype_configs(list(dtype_configs))
    if observation_type is not None:
        config.set_observation_type(observation_type)
    if inputs is not None:
        config._set_input_type_to_index(dict(inputs))
    return config


def module_config(
    pattern: Pattern,
    dtype_configs: Sequence[DTypeConfig],
    *,
    root: type[Any],
    reference: type[Any] | None,
    qat: type[Any] | None = None,
) -> BackendPatternConfig:
    """A weighted module: observed as usual, its ``root`` swapped for ``reference`` on convert.

    Args:
        pattern: the float, fused or QAT module class that appears in the graph.
        dtype_configs: the dtypes the backend accepts for it.
        root: the weighted float module inside the pattern (``nn.Conv2d`` for ``ConvReLU2d``).
        reference: the reference quantized module ``root`` becomes; ``None`` leaves it float.
        qat: the module ``prepare_qat_fx`` swaps ``pattern`` for, if any.

    Example:
        >>> import torch
        >>> from fxquant.nn import reference
        >>> config = module_config(
        ...     torch.nn.Linear, [], root=torch.nn.Linear, reference=reference.Linear
        ... )
        >>> config.reference_quantized_module is reference.Linear
        True
    """
    # None is each setter's default: a None argument leaves that module unset
    return (
        op_config(pattern, dtype_configs)
        .set_root_module(root)
        .set_reference_quantized_module(reference)
        .set_qat_module(qat)
    )


def fusion_config(
    pattern: Pattern,
    dtype_configs: Sequence[DTypeConfig],
    *,
    fuser: Callable[..., Any],
    fused: type[Any] | None,
) -> BackendPatternConfig:
    """A sequence of modules that ``fuse_fx`` replaces by ``fuser(is_qat, *modules)``.

    Example:
        >>> import torch
        >>> from fxquant.nn import fusers, intrinsic
        >>> config = fusion_config(
        ...     (torch.nn.Conv2d, torch.nn.ReLU),
        ...     [],
        ...     fuser=fusers.fuse_conv_relu,
        ...     fused=intrinsic.ConvReLU2d,
        ... )
        >>> config.fused_module is intrinsic.ConvReLU2d
        True
    """
    return op_config(pattern, dtype_configs).set_fuser_method(fuser).set_fused_module(fused)


def relu_fusion_configs(
    ops: tuple[Any, ...],
    dtype_configs: Sequence[DTypeConfig],
    *,
    fuser: Callable[..., Any],
    fused: type[Any] | None,
) -> list[BackendPatternConfig]:
    """:func:`fusion_config` of ``(*ops, relu)`` for ``nn.ReLU`` and ``F.relu`` (2 configs).

    Example:
        >>> from fxquant.nn import fusers, intrinsic
        >>> configs = relu_fusion_configs(
        ...     (nn.Linear,), [], fuser=fusers.fuse_linear_relu, fused=intrinsic.LinearReLU
        ... )
        >>> [c.pattern[1] for c in configs] == [nn.ReLU, F.relu]
        True
    """
    relus = (nn.ReLU, F.relu)
    return [fusion_config((*ops, r), dtype_configs, fuser=fuser, fused=fused) for r in relus]
