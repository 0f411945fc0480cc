"""Conv patterns: conv1d/2d/3d modules and functionals, their fusions, QAT and reference modules.

For each dimensionality the configs cover four groups:

    Conv2d | qat.Conv2d | F.conv2d                         weighted op, reference on convert
    (Conv2d, ReLU) -> ConvReLU2d -> qat.ConvReLU2d         fusion, then weighted op
    (Conv2d, BatchNorm2d[, ReLU]) -> ConvBn[ReLU]2d        fusion; only QAT keeps the BN
    ConvTranspose2d | (ConvTranspose2d, BatchNorm2d)       weighted op; BN folded in eval

A fused ``ConvBn2d`` only survives fusion in training mode (in eval the BN is
folded into the conv), so it needs a QAT module but no reference module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.errors import ConfigError
from fxquant.nn import fusers, intrinsic, qat, reference
from fxquant.nn.intrinsic import qat as intrinsic_qat
from fxquant.patterns.builders import fusion_config, module_config, op_config, relu_fusion_configs

__all__ = ["ConvFamily", "conv_configs", "conv_family", "conv_transpose_configs"]

# Functional weight and bias are positional inputs 1 and 2: F.conv2d(input, weight, bias, ...)
_WEIGHT_BIAS_INDEX = {"weight": 1, "bias": 2}


@dataclass(frozen=True, slots=True)
class ConvFamily:
    """The float, fused, QAT and reference classes for one conv dimensionality.

    Example:
        >>> conv_family(2).conv_relu.__name__
        'ConvReLU2d'
    """

    conv: type[Any]
    transpose: type[Any]
    bn: type[Any]
    func: Callable[..., torch.Tensor]
    func_transpose: Callable[..., torch.Tensor]
    reference: type[Any]
    transpose_reference: type[Any]
    conv_relu: type[Any]
    conv_bn: type[Any]
    conv_bn_relu: type[Any]
    qat: type[Any]
    qat_relu: type[Any]
    qat_bn: type[Any]
    qat_bn_relu: type[Any]


def conv_family(dims: int) -> ConvFamily:
    """Look up the classes of ``dims``-dimensional convolution (1, 2 or 3).

    Raises:
        ConfigError: for any other ``dims``.

    Example:
        >>> conv_family(1).func is torch.nn.functional.conv1d
        True
    """
    if dims not in (1, 2, 3):
        msg = f"conv dims must be 1, 2 or 3, got {dims!r}"
        raise ConfigError(msg)
    d = f"{dims}d"
    return ConvFamily(
        conv=getattr(nn, f"Conv{d}"),
        transpose=getattr(nn, f"ConvTranspose{d}"),
        bn=getattr(nn, f"BatchNorm{d}"),
        func=getattr(F, f"conv{d}"),
        func_transpose=getattr(F, f"conv_transpose{d}"),
        reference=getattr(reference, f"Conv{d}"),
        transpose_reference=getattr(reference, f"ConvTranspose{d}"),
        conv_relu=getattr(intrinsic, f"ConvReLU{d}"),
        conv_bn=getattr(intrinsic, f"ConvBn{d}"),
        conv_bn_relu=getattr(intrinsic, f"ConvBnReLU{d}"),
        qat=getattr(qat, f"Conv{d}"),
        qat_relu=getattr(intrinsic_qat, f"ConvReLU{d}"),
        qat_bn=getattr(intrinsic_qat, f"ConvBn{d}"),
        qat_bn_relu=getattr(intrinsic_qat, f"ConvBnReLU{d}"),
    )


def conv_configs(
    dtype_configs: Sequence[DTypeConfig],
    *,
    dims: Sequence[int] = (1, 2, 3),
    transpose: bool = True,
) -> list[BackendPatternConfig]:
    """Every conv pattern of the given dimensionalities.

    Args:
        dtype_configs: the dtypes the backend accepts for conv (weighted: input,
            output, weight and bias).
        dims: which of conv1d/2d/3d to include.
        transpose: also include the transposed convolutions (see
            :func:`conv_transpose_configs`).

    Returns:
        19 configs per dimensionality with ``transpose``, 16 without.

    Example:
        >>> from fxquant.config.backend import DTypeConfig
        >>> int8 = DTypeConfig(
        ...     input_dtype=torch.uint8, output_dtype=torch.uint8,
        ...     weight_dtype=torch.int8, bias_dtype=torch.float,
        ... )
        >>> len(conv_configs([int8], dims=(2,)))
        19
    """
    configs: list[BackendPatternConfig] = []
    for family in map(conv_family, dims):
        configs += _conv_relu_configs(family, dtype_configs)
        configs += _conv_bn_configs(family, dtype_configs)
    if transpose:
        configs += conv_transpose_configs(dtype_configs, dims=dims)
    return configs


def conv_transpose_configs(
    dtype_configs: Sequence[DTypeConfig], *, dims: Sequence[int] = (1, 2, 3)
) -> list[BackendPatternConfig]:
    """Transposed convolutions: the module, its BN folding, and the functional.

    ``(ConvTranspose2d, BatchNorm2d)`` folds the BN into the conv (eval only),
    so the fusion config itself names the root and reference modules.

    Example:
        >>> from fxquant.config.pattern import pattern_str
        >>> [pattern_str(c.pattern) for c in conv_transpose_configs([], dims=(1,))]
        ['ConvTranspose1d', '(ConvTranspose1d, BatchNorm1d)', 'torch.conv_transpose1d']
    """
    configs: list[BackendPatternConfig] = []
    for family in map(conv_family, dims):
        root = {"root": family.transpose, "reference": family.transpose_reference}
        fold = module_config((family.transpose, family.bn), dtype_configs, **root)
        configs += [
            module_config(family.transpose, dtype_configs, **root),
            fold.set_fuser_method(fusers.fuse_convtranspose_bn),
            op_config(family.func_transpose, dtype_configs, inputs=_WEIGHT_BIAS_INDEX),
        ]
    return configs


def _conv_relu_configs(
    family: ConvFamily, dtype_configs: Sequence[DTypeConfig]
) -> list[BackendPatternConfig]:
    """The conv alone (module, QAT module, functional), then fused with a ReLU."""
    root = {"root": family.conv, "reference": family.reference}
    relu_fusions = relu_fusion_configs(
        (family.conv,), dtype_configs, fuser=fusers.fuse_conv_relu, fused=family.conv_relu
    )
    return [
        module_config(family.conv, dtype_configs, qat=family.qat, **root),
        module_config(family.qat, dtype_configs, **root),
        op_config(family.func, dtype_configs, inputs=_WEIGHT_BIAS_INDEX),
        *relu_fusions,
        module_config(family.conv_relu, dtype_configs, qat=family.qat_relu, **root),
        module_config(family.qat_relu, dtype_configs, **root),
        # functional conv + relu: observed as one op, nothing to fuse
        op_config((family.func, nn.ReLU), dtype_configs),
        op_config((family.func, F.relu), dtype_configs),
    ]


def _conv_bn_configs(
    family: ConvFamily, dtype_configs: Sequence[DTypeConfig]
) -> list[BackendPatternConfig]:
    root = {"root": family.conv, "reference": family.reference}
    bn_relu = [
        config.set_root_module(family.conv)
        for config in relu_fusion_configs(
            (family.conv, family.bn),
            dtype_configs,
            fuser=fusers.fuse_conv_bn_relu,
            fused=family.conv_bn_relu,
        )
    ]
    return [
        fusion_config(
            (family.conv, family.bn),
            dtype_configs,
            fuser=fusers.fuse_conv_bn,
            fused=family.conv_bn,
        ),
        *bn_relu,
        # the fused float modules only exist in training mode: QAT swaps them
        op_config(family.conv_bn, dtype_configs).set_qat_module(family.qat_bn),
        op_config(family.conv_bn_relu, dtype_configs).set_qat_module(family.qat_bn_relu),
        module_config(family.qat_bn, dtype_configs, **root),
        module_config(family.qat_bn_relu, dtype_configs, **root),
    ]
