"""What the ``onednn`` backend quantizes: fxquant's shared pattern builders with oneDNN's dtypes.

Beyond the shared builders, oneDNN fuses linear with leaky_relu and tanh
(``LinearLeakyReLU``, ``LinearTanh``, defined here) and conv2d with add (+ relu).
``ConvUnary2d`` (conv2d (+ bn) + relu6 / hardtanh / hardswish / SiLU, observed after the
activation, as pt2e's x86 quantizer does) is defined here for x86's pattern list
(:func:`conv_unary_configs`); onednn's own list keeps torch.ao's onednn patterns, where a
clamp shares the conv's qparams and other activations are quantized on their own.

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
from fxquant.errors import ConfigTypeError
from fxquant.nn import fusers, reference
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
from fxquant.patterns.builders import fusion_config, module_config
from torch import nn

__all__ = [
    "DYNAMIC_FP16",
    "DYNAMIC_INT8",
    "LINEAR_INT8",
    "STATIC_INT8",
    "WEIGHTED_INT8",
    "ConvUnary2d",
    "LinearLeakyReLU",
    "LinearTanh",
    "conv_unary_configs",
    "fuse_conv_unary",
    "fuse_linear_leaky_relu",
    "fuse_linear_tanh",
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


# the activations a conv's output is observed after, and oneDNN's post op for each
_CONV_UNARY: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.Hardtanh, "hardtanh"),  # nn.ReLU6 is a Hardtanh(0, 6)
    (nn.Hardswish, "hardswish"),
    (nn.SiLU, "swish"),
)
# functions fused as their modules (F.hardtanh's bounds are call arguments a fuser never sees)
_AS_MODULE: dict[Any, Callable[[], nn.Module]] = {
    F.relu6: nn.ReLU6,
    F.hardswish: nn.Hardswish,
    F.silu: nn.SiLU,
}


class ConvUnary2d(FusedModule):
    """``Conv2d`` followed by an activation: relu6 / hardtanh, hardswish or SiLU.

    One node for the flow, so its output is observed after the activation, as pt2e's
    X86InductorQuantizer observes conv + relu6 / hardtanh / hardswish / silu: a conv +
    relu6 gets uint8 qparams over [0, 6] at most (zero point 0) where a clamp quantized
    on its own shares the conv's qparams observed before it (MobileNetV2: zero points
    near 128, half the codes spent on negatives the clamp removes), and a conv +
    hardswish / SiLU is quantized once instead of twice. oneDNN runs the activation as
    the conv's post op (:meth:`post_op`).

    Example:
        >>> m = ConvUnary2d(nn.Conv2d(1, 2, 1), nn.ReLU6())
        >>> bool(m(torch.full((1, 1, 2, 2), 100.0)).max() <= 6.0), m.post_op()
        (True, ('hardtanh', [0.0, 6.0]))
    """

    PARTS = (("conv", nn.Conv2d),)

    def __init__(self, conv: nn.Conv2d, act: nn.Module) -> None:
        if not isinstance(act, tuple(cls for cls, _ in _CONV_UNARY)):
            msg = (
                f"ConvUnary2d argument 'act' must be a torch.nn.ReLU6, Hardtanh, Hardswish "
                f"or SiLU module, got {act!r} of type {type(act).__name__}; pass the "
                "activation module that follows the conv"
            )
            raise ConfigTypeError(msg)
        super().__init__(conv)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Conv, then the activation."""
        result: torch.Tensor = self.act(self[0](x))
        return result

    def post_op(self) -> tuple[str, list[float]]:
        """oneDNN's post op for the activation and its scalars (a clamp's real bounds)."""
        if isinstance(self.act, nn.Hardtanh):
            return "hardtanh", [float(self.act.min_val), float(self.act.max_val)]
        return next(name for cls, name in _CONV_UNARY if isinstance(self.act, cls)), []


def fuse_conv_unary(is_qat: bool, conv: nn.Conv2d, *rest: Any) -> nn.Module:
    """``(conv, act)`` or ``(conv, bn, act)`` -> ``ConvUnary2d``, the BN folded (PTQ).

    ``F.relu6`` / ``F.hardswish`` / ``F.silu`` fuse as their modules. QAT has no
    trainable module for it: the flow refuses the fusion there (conv + bn fuse without
    the activation), and a direct call with ``is_qat=True`` raises.

    Example:
        >>> bn = nn.BatchNorm2d(2).eval()
        >>> type(fuse_conv_unary(False, nn.Conv2d(1, 2, 1), bn, F.relu6).act).__name__
        'ReLU6'
    """
    if is_qat:
        msg = "ConvUnary2d fusion is for post-training quantization only; got is_qat=True"
        raise NotImplementedError(msg)
    *bn, act = rest
    if bn:
        conv = fusers.fold_bn_into_conv(conv, bn[0])  # type: ignore[assignment]  # Conv2d in, Conv2d out
    return ConvUnary2d(conv, _AS_MODULE[act]() if act in _AS_MODULE else act)


def conv_unary_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """Conv2d (+ BatchNorm2d) + relu6 / hardtanh / hardswish / SiLU (modules, and
    ``F.relu6`` / ``F.hardswish`` / ``F.silu``) fused into :class:`ConvUnary2d`, and the
    fused module (root ``Conv2d``, reference ``Conv2d``).

    Example:
        >>> len(conv_unary_configs([WEIGHTED_INT8]))
        15
    """
    acts = (nn.ReLU6, nn.Hardtanh, nn.Hardswish, nn.SiLU, *_AS_MODULE)
    configs = [
        fusion_config(pattern, dtype_configs, fuser=fuse_conv_unary, fused=ConvUnary2d)
        for act in acts
        for pattern in ((nn.Conv2d, act), (nn.Conv2d, nn.BatchNorm2d, act))
    ]
    root = {"root": nn.Conv2d, "reference": reference.Conv2d}
    return [*configs, module_config(ConvUnary2d, dtype_configs, **root)]


def _fuse_linear_eltwise(
    fused: type[FusedModule], is_qat: bool, modules: tuple[Any, ...]
) -> nn.Module:
    if is_qat:
        msg = f"{fused.__name__} fusion is for post-training quantization only; got is_qat=True"
        raise NotImplementedError(msg)
    linear, *rest = modules
    if len(rest) == 2:  # (linear, bn, act): fold the batch norm first
        linear = nn.utils.fusion.fuse_linear_bn_eval(linear, rest[0])
    return fused(linear, rest[-1])


# Module-level fusers (not closures): a BackendConfig's JSON names its fuser methods by
# their qualified names, so ``to_json`` needs each one importable.
def fuse_linear_leaky_relu(is_qat: bool, *modules: Any) -> nn.Module:
    """``(linear, leaky_relu)`` or ``(linear, bn, leaky_relu)`` -> ``LinearLeakyReLU`` (PTQ).

    Example:
        >>> type(fuse_linear_leaky_relu(False, nn.Linear(2, 2), nn.LeakyReLU())).__name__
        'LinearLeakyReLU'
    """
    return _fuse_linear_eltwise(LinearLeakyReLU, is_qat, modules)


def fuse_linear_tanh(is_qat: bool, *modules: Any) -> nn.Module:
    """``(linear, tanh)`` -> ``LinearTanh`` (PTQ).

    Example:
        >>> type(fuse_linear_tanh(False, nn.Linear(2, 2), nn.Tanh())).__name__
        'LinearTanh'
    """
    return _fuse_linear_eltwise(LinearTanh, is_qat, modules)


def linear_eltwise_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """Linear + leaky_relu / tanh fusions (oneDNN post ops), module and functional forms.

    Example:
        >>> len(linear_eltwise_configs([WEIGHTED_INT8]))
        11
    """
    observed = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    configs: list[BackendPatternConfig] = []
    for fused, fuser, module, function in (
        (LinearLeakyReLU, fuse_linear_leaky_relu, nn.LeakyReLU, F.leaky_relu),
        (LinearTanh, fuse_linear_tanh, nn.Tanh, torch.tanh),
    ):
        for post in (module, function):
            configs.append(
                BackendPatternConfig((nn.Linear, post))
                .set_dtype_configs(dtype_configs)
                .set_fuser_method(fuser)
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
        .set_fuser_method(fuse_linear_leaky_relu)
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
