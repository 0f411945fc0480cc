"""Single-op models for lowering checks, and quantizing one for a backend.

:data:`LOWERING_CASES` holds one small model per kind of lowering kernel;
:func:`quantize_case` prepares, calibrates and converts one for a backend, lowered and as
the reference model, so a check can compare the two.

Example:
    >>> case = next(c for c in LOWERING_CASES if c.name == "conv2d")
    >>> lowered, reference, inputs = quantize_case("reference", case, (1, 2, 3, 5))
    >>> lowered(*inputs).shape
    torch.Size([1, 3, 5, 5])
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

import fxquant
from fxquant.config import defaults
from fxquant.flow.report import NodeStatus

__all__ = [
    "LOWERING_CASES",
    "SIZE_BOUNDS",
    "Binary",
    "Case",
    "Cat",
    "Function",
    "FunctionalLinear",
    "OpFamilies",
    "Sizes",
    "lowering_statuses",
    "output_scale",
    "quantize_case",
    "quantize_model",
    "tolerance",
]

Sizes = tuple[int, int, int, int]
"""(batch, in channels, out channels, spatial size) of a case."""


SIZE_BOUNDS = ((1, 4), (1, 9), (1, 9), (4, 9))
"""(low, high) of each of :data:`Sizes` that the cases take (small: tests stay fast)."""


@dataclass(frozen=True)
class Case:
    """A single-op model builder and the input shapes it takes.

    Attributes:
        name: a test id (``"conv2d"``).
        model: (in channels, out channels) -> the float model.
        shapes: (batch, channels, size) -> the shapes of the example inputs.
        mapping: backend name -> the QConfigMapping to use (default: the
            backend's default mapping).

    Example:
        >>> case = Case("relu", lambda i, o: torch.nn.ReLU(), lambda b, c, s: [(b, c)])
        >>> case.shapes(2, 3, 4), str(case)
        ([(2, 3)], 'relu')
    """

    name: str
    model: Callable[[int, int], nn.Module]
    shapes: Callable[[int, int, int], list[tuple[int, ...]]]
    mapping: Callable[[str], Any] | None = None

    def __str__(self) -> str:
        return self.name


class Binary(nn.Module):
    """``op(x, y)``, optionally followed by a relu.

    Example:
        >>> Binary(torch.add, relu=True)(torch.ones(1), -2 * torch.ones(1))
        tensor([0.])
    """

    def __init__(self, op: Callable[..., torch.Tensor], relu: bool = False) -> None:
        super().__init__()
        self.op, self.relu = op, relu

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = self.op(x, y)
        return F.relu(z) if self.relu else z


class Function(nn.Module):
    """A module that calls ``fn`` on its input, so the traced graph holds the function.

    Example:
        >>> Function(torch.relu)(torch.tensor([-1.0, 1.0]))
        tensor([0., 1.])
    """

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class FunctionalLinear(nn.Module):
    """``F.linear`` with its own weight and bias parameters.

    Example:
        >>> FunctionalLinear(3, 2)(torch.ones(1, 3)).shape
        torch.Size([1, 2])
    """

    def __init__(self, i: int, o: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i))
        self.bias = nn.Parameter(torch.randn(o))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Cat(nn.Module):
    """``torch.cat`` of two inputs along the channels.

    Example:
        >>> Cat()(torch.ones(1, 2), torch.ones(1, 3)).shape
        torch.Size([1, 5])
    """

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, y], 1)


def _wrapped(model: nn.Module) -> nn.Module:
    # a root module is traced through (nn.Linear would become F.linear): keep it a leaf
    own = (nn.Sequential, Function, Binary, Cat, FunctionalLinear)
    return model if isinstance(model, own) else nn.Sequential(model)


def _vec(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c)]


def _img(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s, s)]


# normalizing over one element gives a constant (layer_norm: its bias; softmax: 1.0), which
# convert rightly warns about: these cases normalize over at least two
def _vec2(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, max(c, 2))]


def _img2c(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, max(c, 2), s, s)]


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


def _conv_bn_relu(i: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(i, o, 3), nn.BatchNorm2d(o), nn.ReLU())


LOWERING_CASES: tuple[Case, ...] = (
    Case("linear", lambda i, o: nn.Linear(i, o), _vec),
    Case("linear_relu", lambda i, o: nn.Sequential(nn.Linear(i, o), nn.ReLU()), _vec),
    Case("linear_dynamic", lambda i, o: nn.Linear(i, o), _vec, _dynamic),
    Case("linear_fp16", lambda i, o: nn.Linear(i, o), _vec, _fp16),
    Case("functional_linear", lambda i, o: FunctionalLinear(i, o), _vec),
    Case("conv1d", lambda i, o: nn.Conv1d(i, o, 3), _seq),
    Case("conv2d", lambda i, o: nn.Conv2d(i, o, 3, padding=1), _img),
    Case("conv3d", lambda i, o: nn.Conv3d(i, o, (1, 3, 3)), _vol),
    Case("conv2d_relu", lambda i, o: nn.Sequential(nn.Conv2d(i, o, 1), nn.ReLU()), _img),
    Case("conv_bn_relu2d", _conv_bn_relu, _img),
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
    Case("softmax", lambda i, o: nn.Softmax(dim=1), _img2c),
    Case("hardswish", lambda i, o: nn.Hardswish(), _img),
    Case("elu", lambda i, o: nn.ELU(), _img),
    Case("leaky_relu", lambda i, o: nn.LeakyReLU(0.1), _img),
    Case("layer_norm", lambda i, o: nn.LayerNorm(max(i, 2)), _vec2),
    Case("batch_norm2d", lambda i, o: nn.BatchNorm2d(i), _img),
    Case("bn_relu2d", lambda i, o: nn.Sequential(nn.BatchNorm2d(i), nn.ReLU()), _img),
    Case("instance_norm2d", lambda i, o: nn.InstanceNorm2d(i), _img),
    Case("group_norm", lambda i, o: nn.GroupNorm(1, i), _img),
    Case("interpolate", _fn(lambda x: F.interpolate(x, scale_factor=2.0)), _img),
)
"""One single-op model per kind of lowering kernel (plus a few fused ones)."""


class OpFamilies(nn.Module):
    """Most op families in one model: conv-bn-relu, depthwise, transposed conv, fixed-qparams
    ops, hardswish, mean, layer norm, linear and softmax.

    Example:
        >>> OpFamilies()(torch.randn(2, 3, 10, 10)).shape
        torch.Size([2, 3])
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 3)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = torch.sigmoid(self.dw(y)) * y + torch.tanh(y)
        y = F.hardswish(self.up(y)).mean((2, 3))
        out: torch.Tensor = self.softmax(self.fc(self.norm(y)))
        return out


def _randomize_bn(model: nn.Module) -> nn.Module:
    # non-trivial batch-norm statistics, so that folding changes the weights
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            statistics = ((module.running_mean, -0.5, 0.5), (module.running_var, 0.5, 2.0))
            for buffer, low, high in statistics:
                if buffer is not None:
                    buffer.uniform_(low, high)
    return model


def quantize_case(
    backend: str, case: Case, sizes: Sizes, *, seed: int = 0
) -> tuple[fx.GraphModule, fx.GraphModule, list[torch.Tensor]]:
    """Prepare, calibrate and convert ``case`` for ``backend``, lowered and as reference.

    Args:
        backend: the backend name (``fxquant.get_backend_config(backend)``).
        case: the model to quantize.
        sizes: (batch, in channels, out channels, spatial size).
        seed: the seed of the weights and inputs.

    Returns:
        (lowered model, reference model, example inputs).

    Example:
        >>> lowered, reference, inputs = quantize_case("reference", LOWERING_CASES[0], (2, 3, 4, 5))
        >>> lowered(*inputs).shape
        torch.Size([2, 4])
    """
    batch, c_in, c_out, size = sizes
    torch.manual_seed(seed)
    model = _randomize_bn(_wrapped(case.model(c_in, c_out))).eval()
    inputs = [torch.randn(shape) for shape in case.shapes(batch, c_in, size)]
    mapping = case.mapping(backend) if case.mapping is not None else None
    # a few random batches first, so the observers see more than the example inputs
    calibration = [[torch.randn_like(x) for x in inputs] for _ in range(3)]
    lowered, reference = quantize_model(backend, model, [*calibration, inputs], mapping)
    return lowered, reference, inputs


def quantize_model(
    backend: str,
    model: nn.Module,
    batches: Sequence[Sequence[torch.Tensor]],
    mapping: fxquant.QConfigMapping | None = None,
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Prepare ``model`` for ``backend``, calibrate on ``batches``, convert lowered and reference.

    Args:
        backend: the backend name.
        model: the float model (in eval mode).
        batches: calibration inputs, one sequence of tensors per call; the
            last batch is also the example input of prepare.
        mapping: the QConfigMapping (default: the backend's default mapping).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.ReLU()).eval()
        >>> lowered, reference = quantize_model("reference", model, [[torch.randn(2, 3)]])
        >>> lowered(torch.ones(1, 3)).shape
        torch.Size([1, 3])
    """
    if mapping is None:
        mapping = fxquant.get_default_qconfig_mapping(backend)
    backend_config = fxquant.get_backend_config(backend)
    example = tuple(batches[-1])
    prepared = fxquant.prepare_fx(model, mapping, example, backend_config=backend_config)
    for batch in batches:
        prepared(*batch)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    return fxquant.convert_fx(prepared), reference


def output_scale(gm: fx.GraphModule) -> float:
    """The scale of the last dequantize step (the output's quantization step), 0.0 if none.

    Example:
        >>> _, reference, _ = quantize_case("reference", LOWERING_CASES[0], (1, 2, 2, 4))
        >>> output_scale(reference) > 0
        True
    """
    dequantize = torch.ops.fxquant.dequantize_per_tensor.default
    found = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == dequantize]
    return float(found[-1].args[1]) if found else 0.0


def lowering_statuses(model: fx.GraphModule) -> dict[str, NodeStatus]:
    """Node name -> lowering status (lowered, reference, skipped, float), inputs left out.

    Example:
        >>> lowered, _, _ = quantize_case("reference", LOWERING_CASES[0], (1, 2, 2, 4))
        >>> sorted(status.value for status in set(lowering_statuses(lowered).values()))
        ['float', 'reference']
    """
    entries = fxquant.explain(model, show=False).entries()
    return {e.node: e.status for e in entries if e.op != "placeholder"}


def tolerance(case: Case, reference: torch.Tensor, step: float) -> float:
    """How far a lowered ``case`` may be from its ``reference`` output: one output ``step``.

    A float output (the op stayed float, or a dynamic / fp16 linear) gets the
    float rounding of the computation instead, relative to the output's size.

    Example:
        >>> case = next(c for c in LOWERING_CASES if c.name == "relu")
        >>> tolerance(case, torch.ones(2), step=0.5)
        0.5005
    """
    scale = 1 + float(reference.abs().max())
    if case.name == "linear_dynamic":  # float out: activations quantized per call by both
        return 1e-4 * scale
    if case.name == "linear_fp16":  # an fp16 GEMM rounds its float input too
        return 2e-3 * scale
    if step == 0.0:  # a float output (the op stayed float): only float rounding differs
        return 1e-5 * scale
    return step * 1.001
