"""What the ``onednn`` backend quantizes: fxquant's shared pattern builders with oneDNN's dtypes.

Beyond the shared builders, oneDNN fuses linear with leaky_relu and tanh
(``LinearLeakyReLU``, ``LinearTanh``, defined here) and conv2d with add (+ relu).

    weighted ops    uint8 activations, int8 weights (symmetric), float bias
    linear          uint8 in, float out (the kernel returns fp32; a quantized consumer's
                    quantize step becomes its output requantization), + dynamic int8
                    and fp16 weights (float activations)
    other ops       uint8 in and out
    layer norm      uint8 in and out, float affine weights
    embedding       weight-only int8
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.backend import BackendPatternConfig, DTypeConfig, ObservationType
from fxquant.nn import reference
from fxquant.nn.intrinsic import FusedModule
from fxquant.patterns import (
    binary_op_configs,
    bn_configs,
    cat_configs,
    conv_add_configs,
    conv_configs,
    default_op_configs,
    embedding_configs,
    fixed_qparams_op_configs,
    linear_configs,
    ln_configs,
    matmul_configs,
    rnn_configs,
    share_qparams_op_configs,
)
from torch import nn

__all__ = [
    "DYNAMIC_FP16",
    "DYNAMIC_INT8",
    "LINEAR_INT8",
    "STATIC_INT8",
    "WEIGHTED_INT8",
    "LinearLeakyReLU",
    "LinearTanh",
    "linear_eltwise_configs",
    "pattern_configs",
]

WEIGHTED_INT8 = DTypeConfig(
    input_dtype=torch.uint8,
    output_dtype=torch.uint8,
    weight_dtype=torch.int8,
    bias_dtype=torch.float,
)
# oneDNN's qlinear returns fp32 unless told to requantize: the reference model of a Linear
# leaves its output float too, so it computes what the kernel does. Where a quantized
# op reads the output, its input quantize step is absorbed by the kernel (uint8 output)
LINEAR_INT8 = DTypeConfig(
    input_dtype=torch.uint8,
    output_dtype=torch.float,
    weight_dtype=torch.int8,
    bias_dtype=torch.float,
)
STATIC_INT8 = DTypeConfig(input_dtype=torch.uint8, output_dtype=torch.uint8)
DYNAMIC_INT8 = DTypeConfig(
    input_dtype=torch.uint8,
    output_dtype=torch.float,
    weight_dtype=torch.int8,
    bias_dtype=torch.float,
    is_dynamic=True,
)
DYNAMIC_FP16 = DTypeConfig(
    input_dtype=torch.float16,
    output_dtype=torch.float,
    weight_dtype=torch.float16,
    bias_dtype=torch.float,
    is_dynamic=True,
)
_LAYER_NORM = DTypeConfig(
    input_dtype=torch.uint8,
    output_dtype=torch.uint8,
    weight_dtype=torch.float,
    bias_dtype=torch.float,
)
_WEIGHT_ONLY_INT8 = DTypeConfig(
    input_dtype=torch.float, output_dtype=torch.float, weight_dtype=torch.int8
)


class LinearLeakyReLU(FusedModule):
    """``Linear`` followed by leaky_relu (a module, or the function with its defaults).

    Example:
        >>> m = LinearLeakyReLU(nn.Linear(2, 2), nn.LeakyReLU(0.2))
        >>> m(torch.ones(1, 2)).shape
        torch.Size([1, 2])
    """

    PARTS = (("linear", nn.Linear),)

    def __init__(self, linear: nn.Linear, act: Any) -> None:
        super().__init__(linear)
        self.act = act if isinstance(act, nn.Module) else nn.LeakyReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Linear, then leaky_relu."""
        result: torch.Tensor = self.act(self[0](x))
        return result


class LinearTanh(FusedModule):
    """``Linear`` followed by tanh.

    Example:
        >>> LinearTanh(nn.Linear(2, 2), torch.tanh)(torch.ones(1, 2)).abs().max() < 1
        tensor(True)
    """

    PARTS = (("linear", nn.Linear),)

    def __init__(self, linear: nn.Linear, act: Any) -> None:
        super().__init__(linear)
        self.act = act if isinstance(act, nn.Module) else nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Linear, then tanh."""
        result: torch.Tensor = self.act(self[0](x))
        return result


def _fuser(fused: type[FusedModule]) -> Callable[..., nn.Module]:
    def fuse(is_qat: bool, *modules: Any) -> nn.Module:
        if is_qat:
            msg = f"{fused.__name__} fusion is for post-training quantization only; got is_qat=True"
            raise NotImplementedError(msg)
        linear, *rest = modules
        if len(rest) == 2:  # (linear, bn, act): fold the batch norm first
            linear = nn.utils.fusion.fuse_linear_bn_eval(linear, rest[0])
        return fused(linear, rest[-1])

    return fuse


def linear_eltwise_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """Linear + leaky_relu / tanh fusions (oneDNN post ops), module and functional forms.

    Example:
        >>> len(linear_eltwise_configs([WEIGHTED_INT8]))
        11
    """
    observed = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    configs: list[BackendPatternConfig] = []
    for fused, module, function in (
        (LinearLeakyReLU, nn.LeakyReLU, F.leaky_relu),
        (LinearTanh, nn.Tanh, torch.tanh),
    ):
        for post in (module, function):
            configs.append(
                BackendPatternConfig((nn.Linear, post))
                .set_dtype_configs(dtype_configs)
                .set_fuser_method(_fuser(fused))
                .set_fused_module(fused)
            )
            configs.append(
                BackendPatternConfig((F.linear, post))
                .set_observation_type(observed)
                .set_dtype_configs(dtype_configs)
            )
        configs.append(
            BackendPatternConfig(fused)
            .set_observation_type(observed)
            .set_dtype_configs(dtype_configs)
            .set_root_module(nn.Linear)
            .set_reference_quantized_module(reference.Linear)
        )
    configs.append(
        BackendPatternConfig((nn.Linear, nn.BatchNorm1d, nn.LeakyReLU))
        .set_dtype_configs(dtype_configs)
        .set_fuser_method(_fuser(LinearLeakyReLU))
        .set_fused_module(LinearLeakyReLU)
    )
    return configs


def pattern_configs() -> list[BackendPatternConfig]:
    """Every pattern of the onednn backend.

    Example:
        >>> len(pattern_configs()) > 200
        True
    """
    linear = [LINEAR_INT8, DYNAMIC_INT8, DYNAMIC_FP16]
    static = [STATIC_INT8]
    return [
        *conv_configs([WEIGHTED_INT8]),
        *conv_add_configs([WEIGHTED_INT8]),
        *linear_configs(linear),
        *linear_eltwise_configs(linear),
        *binary_op_configs(static),
        *matmul_configs(static),
        *cat_configs(static),
        *default_op_configs(static),
        *fixed_qparams_op_configs(static),
        *share_qparams_op_configs(static),
        *bn_configs(static),
        *ln_configs([_LAYER_NORM]),
        *rnn_configs([DYNAMIC_INT8]),
        *embedding_configs([_WEIGHT_ONLY_INT8]),
    ]
