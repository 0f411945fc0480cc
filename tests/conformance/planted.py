"""A backend plugin with planted faults, for proving that ``fxquant check`` catches them.

One module serves three backends (the hooks dispatch on the name):

    clean     int8 linear and conv, a default mapping they accept, an exact linear kernel
    faulty    the same with three planted faults: a kernel two output steps off (that
              also warns of a deprecation), a default mapping entry its own config
              rejects (quant_max 255 where the config allows 127), and a pattern with a
              dtype fxquant cannot quantize to (int64)
    tolerant  clean, but its kernel is two steps off and its rule declares 3 steps

It is registered in-process by the tests and installed as a distribution
(entry points ``faulty``/``clean`` -> this module) for the command-line test.
"""

from __future__ import annotations

import warnings

import fxquant.registry
import torch
from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.lowering import LoweringRule
from fxquant.nn import reference
from fxquant.numerics.fake_quantize import FakeQuantize, default_weight_fake_quant
from fxquant.numerics.observer import MinMaxObserver, default_weight_observer
from fxquant.patterns import conv_configs, linear_configs
from torch import nn

BACKENDS = ("clean", "faulty", "tolerant")

ACTIVATION = DTypeWithConstraints(
    torch.uint8, quant_min_lower_bound=0, quant_max_upper_bound=127, scale_min_lower_bound=2**-12
)
INT8 = DTypeConfig(ACTIVATION, ACTIVATION, torch.int8, torch.float)


def qconfig(quant_max: int, is_qat: bool) -> QConfig:
    """uint8 activations in 0..quant_max, int8 per-tensor weights."""
    arguments = {"quant_min": 0, "quant_max": quant_max, "eps": 2**-12}
    if is_qat:
        activation = FakeQuantize.with_args(observer=MinMaxObserver, **arguments)
        return QConfig(activation=activation, weight=default_weight_fake_quant)
    return QConfig(MinMaxObserver.with_args(**arguments), default_weight_observer)


class QLinear(nn.Module):
    """An exact integer linear, ``offset`` output steps off (and warning) when asked."""

    def __init__(self, module: nn.Module, match: object, offset: int) -> None:
        super().__init__()
        qparams = module.get_weight_qparams()  # type: ignore[operator]
        self.register_buffer("weight", module.get_quantized_weight().clone())  # type: ignore[operator]
        self.register_buffer("bias", module.bias.detach().clone())  # type: ignore[union-attr]
        self.w_scale, self.w_zero_point = float(qparams["scale"]), int(qparams["zero_point"])
        x, out = match.inputs[0], match.output  # type: ignore[attr-defined]
        self.x, self.out, self.offset = x, out, offset

    def forward(self, qx: torch.Tensor) -> torch.Tensor:
        if self.offset:
            warnings.warn("QLinear is deprecated", DeprecationWarning, stacklevel=2)
        sums = (qx.float() - self.x.zero_point) @ (self.weight.float() - self.w_zero_point).t()
        y = sums * (self.x.scale * self.w_scale) + self.bias
        q = torch.round(y / self.out.scale) + self.out.zero_point + self.offset
        return q.clamp(self.out.quant_min, self.out.quant_max).to(self.out.dtype)


@fxquant.registry.hookimpl
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    if backend not in BACKENDS:
        return None
    configs = linear_configs([INT8]) + conv_configs([INT8], dims=(2,), transpose=False)
    if backend == "faulty":  # planted: int64 is no dtype fxquant quantizes to
        int64 = DTypeConfig(input_dtype=torch.int64, output_dtype=torch.int64)
        configs.append(BackendPatternConfig(nn.Hardswish).add_dtype_config(int64))
    return configs


@fxquant.registry.hookimpl
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    if backend not in BACKENDS:
        return None
    mapping = QConfigMapping().set_global(qconfig(127, is_qat))
    if backend == "faulty":  # planted: quant_max 255, where the conv configs allow 127
        mapping.set_object_type(nn.Conv2d, qconfig(255, is_qat))
    return mapping


@fxquant.registry.hookimpl
def fxquant_lowering_kernels(backend: str) -> list[LoweringRule] | None:
    if backend not in BACKENDS:
        return None
    offset = 0 if backend == "clean" else 2  # planted for faulty (and declared by tolerant)

    def build(match: object) -> QLinear | None:
        if match.output is None or match.inputs[0] is None:  # type: ignore[attr-defined]
            return None
        return QLinear(match.modules[-1], match, offset)  # type: ignore[attr-defined]

    tolerance = 3.0 if backend == "tolerant" else 1.0
    return [LoweringRule(reference.Linear, build=build, name="qlinear", tolerance=tolerance)]
