"""Single-op models, one per kind of lowering kernel, and the helpers that quantize them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fxquant
import torch
import torch.nn.functional as F
from fxquant.config import defaults
from torch import fx, nn


def _wrapped(model: nn.Module) -> nn.Module:
    # a root module is traced through (nn.Linear would become F.linear): keep it a leaf
    return (
        model
        if isinstance(model, (nn.Sequential, Function, Binary, Cat, FunctionalLinear))
        else nn.Sequential(model)
    )


@dataclass(frozen=True)
class Case:
    """A model builder and the input shapes it takes, given random sizes."""

    name: str
    model: Callable[[int, int], nn.Module]  # (in channels, out channels) -> model
    shapes: Callable[[int, int, int], list[tuple[int, ...]]]  # (batch, channels, size)
    mapping: Callable[[str], Any] | None = None  # default: the backend's default mapping


class Binary(nn.Module):
    def __init__(self, op: Callable[..., torch.Tensor], relu: bool = False) -> None:
        super().__init__()
        self.op, self.relu = op, relu

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.op(x, y)
        return F.relu(z) if self.relu else z


class Function(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class FunctionalLinear(nn.Module):
    def __init__(self, i: int, o: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i))
        self.bias = nn.Parameter(torch.randn(o))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Cat(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, y], 1)


def _vec(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c)]


def _img(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s, s)]


def _img2(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s, s), (b, c, s, s)]


def _seq(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s)]


def _vol(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, 3, s, s)]


def _dynamic(backend: str) -> Any:
    return fxquant.QConfigMapping().set_object_type(nn.Linear, defaults.default_dynamic_qconfig)


def _fp16(backend: str) -> Any:
    return fxquant.QConfigMapping().set_object_type(nn.Linear, defaults.float16_dynamic_qconfig)


def _fn(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[int, int], nn.Module]:
    return lambda i, o: Function(fn)


CASES = [
    Case("linear", lambda i, o: nn.Linear(i, o), _vec),
    Case("linear_relu", lambda i, o: nn.Sequential(nn.Linear(i, o), nn.ReLU()), _vec),
    Case("linear_dynamic", lambda i, o: nn.Linear(i, o), _vec, _dynamic),
    Case("linear_fp16", lambda i, o: nn.Linear(i, o), _vec, _fp16),
    Case("functional_linear", lambda i, o: FunctionalLinear(i, o), _vec),
    Case("conv1d", lambda i, o: nn.Conv1d(i, o, 3), _seq),
    Case("conv2d", lambda i, o: nn.Conv2d(i, o, 3, padding=1), _img),
    Case("conv3d", lambda i, o: nn.Conv3d(i, o, (1, 3, 3)), _vol),
    Case("conv2d_relu", lambda i, o: nn.Sequential(nn.Conv2d(i, o, 1), nn.ReLU()), _img),
    Case(
        "conv_bn_relu2d",
        lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3), nn.BatchNorm2d(o), nn.ReLU()),
        _img,
    ),
    Case("depthwise_conv2d", lambda i, o: nn.Conv2d(i, i, 3, groups=i, padding=1), _img),
    Case("conv_transpose2d", lambda i, o: nn.ConvTranspose2d(i, o, 2, stride=2), _img),
    Case("add", lambda i, o: Binary(torch.add), _img2),
    Case("add_relu", lambda i, o: Binary(torch.add, relu=True), _img2),
    Case("mul", lambda i, o: Binary(torch.mul), _img2),
    Case("mul_relu", lambda i, o: Binary(torch.mul, relu=True), _img2),
    Case("cat", lambda i, o: Cat(), _img2),
    Case("max_pool2d", lambda i, o: nn.MaxPool2d(2), _img),
    Case("avg_pool2d", lambda i, o: nn.AvgPool2d(2), _img),
    Case("adaptive_avg_pool2d", lambda i, o: nn.AdaptiveAvgPool2d(1), _img),
    Case("flatten", _fn(lambda x: torch.flatten(x, 1)), _img),
    Case("reshape", _fn(lambda x: x.reshape(x.shape[0], -1)), _img),
    Case("mean", _fn(lambda x: x.mean((2, 3))), _img),
    Case("relu", lambda i, o: nn.ReLU(), _img),
    Case("torch_relu", _fn(torch.relu), _img),
    Case("hardtanh", lambda i, o: nn.Hardtanh(), _img),
    Case("relu6", lambda i, o: nn.Sequential(nn.Conv2d(i, o, 1), nn.ReLU6()), _img),
    Case("functional_relu6", _fn(F.relu6), _img),
    Case("sigmoid", _fn(torch.sigmoid), _img),
    Case("tanh", lambda i, o: nn.Tanh(), _img),
    Case("hardsigmoid", lambda i, o: nn.Hardsigmoid(), _img),
    Case("softmax", lambda i, o: nn.Softmax(dim=1), _img),
    Case("hardswish", lambda i, o: nn.Hardswish(), _img),
    Case("elu", lambda i, o: nn.ELU(), _img),
    Case("leaky_relu", lambda i, o: nn.LeakyReLU(0.1), _img),
    Case("layer_norm", lambda i, o: nn.LayerNorm(i), _vec),
    Case("batch_norm2d", lambda i, o: nn.BatchNorm2d(i), _img),
    Case("bn_relu2d", lambda i, o: nn.Sequential(nn.BatchNorm2d(i), nn.ReLU()), _img),
    Case("instance_norm2d", lambda i, o: nn.InstanceNorm2d(i), _img),
    Case("group_norm", lambda i, o: nn.GroupNorm(1, i), _img),
    Case("interpolate", _fn(lambda x: F.interpolate(x, scale_factor=2.0)), _img),
]


def randomize_bn(model: nn.Module) -> nn.Module:
    """Non-trivial batch-norm statistics, so that folding changes the weights."""
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model


def quantize(
    backend: str, case: Case, sizes: tuple[int, int, int, int], *, seed: int = 0
) -> tuple[fx.GraphModule, fx.GraphModule, list[torch.Tensor]]:
    """(lowered, reference, example inputs) of ``case`` at random ``sizes`` (b, c_in, c_out, s)."""
    batch, c_in, c_out, size = sizes
    torch.manual_seed(seed)
    model = randomize_bn(_wrapped(case.model(c_in, c_out))).eval()
    inputs = [torch.randn(shape) for shape in case.shapes(batch, c_in, size)]
    mapping = (case.mapping or fxquant.get_default_qconfig_mapping)(backend)
    backend_config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_fx(model, mapping, tuple(inputs), backend_config=backend_config)
    for _ in range(3):
        prepared(*[torch.randn_like(x) for x in inputs])
    prepared(*inputs)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    return fxquant.convert_fx(prepared), reference, inputs


def output_scale(gm: fx.GraphModule) -> float:
    """The scale of the last dequantize step (the output's quantization step)."""
    dequantize = torch.ops.fxquant.dequantize_per_tensor.default
    found = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == dequantize]
    return float(found[-1].args[1]) if found else 0.0


def statuses(gm: fx.GraphModule) -> dict[str, str]:
    """Node name -> report status (lowered, reference, skipped, float)."""
    return {e.node: e.status for e in fxquant.explain(gm).entries() if e.op != "placeholder"}
