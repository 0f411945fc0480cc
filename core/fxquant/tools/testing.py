"""A test kit for backend plugin authors: single-op models and lowering checks.

A plugin that lowers reference patterns to kernels can check every kernel
against the reference model with a few lines::

    import pytest
    from fxquant.tools import testing

    @pytest.mark.parametrize("case", testing.LOWERING_CASES, ids=lambda c: c.name)
    def test_kernel_is_within_one_step(case):
        testing.check_lowering("mine", case, (2, 4, 4, 6))

Each check raises :class:`AssertionError` with the model's lowering report
when it fails, so it reads like an ``assert`` in any test framework. Nothing
here imports a test framework: the module costs only torch and fxquant.

    Case, LOWERING_CASES       one single-op model per kind of lowering kernel
    quantize_case              (lowered, reference, inputs) of a case for a backend
    check_lowering             the lowered case is within one quantization step
    check_fully_lowered        every quantized op of the case became a kernel
    check_*                    state_dict, deepcopy/pickle, engine, warning and
                               inference-mode checks on a lowered conv-bn-relu
"""

from __future__ import annotations

import copy
import functools
import io
import pickle
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

import fxquant
from fxquant.config import defaults
from fxquant.config.pattern import simple_to_complex, validate_complex
from fxquant.flow.report import NodeStatus
from fxquant.registry import get_deployment
from fxquant.torch_ao_names import as_fxquant_class

__all__ = [
    "LOWERING_CASES",
    "SIZE_BOUNDS",
    "Binary",
    "Case",
    "Cat",
    "Digits",
    "Function",
    "FunctionalLinear",
    "NamedCheck",
    "OpFamilies",
    "Sizes",
    "ao_normalized_pattern",
    "ao_op_as_fxquant",
    "backend_checks",
    "check_covers_ao_patterns",
    "check_deepcopy_and_pickle",
    "check_default_mapping_lowers_every_op",
    "check_deployed",
    "check_engine_restored",
    "check_fixed_qparams_grid",
    "check_forward_warns_nothing",
    "check_fully_lowered",
    "check_hooks_answer_only_for",
    "check_inference_mode",
    "check_listed_by_cli",
    "check_lowering",
    "check_no_warning_in_fresh_process",
    "check_quantize_warns_nothing",
    "check_state_dict_round_trip",
    "digits_accuracy",
    "load_digits",
    "load_module_from_path",
    "lowering_checks",
    "lowering_statuses",
    "output_scale",
    "quantize_case",
    "quantize_model",
    "tolerance",
    "train_digits_classifier",
]

Sizes = tuple[int, int, int, int]
"""(batch, in channels, out channels, spatial size) of a case."""

SIZE_BOUNDS = ((1, 4), (1, 9), (1, 9), (4, 9))
"""(low, high) of each of :data:`Sizes` that the cases take (small: tests stay fast)."""


@dataclass(frozen=True)
class NamedCheck:
    """A check of a backend, called with the backend name; ``str`` gives its name (a test id).

    Example:
        >>> check = NamedCheck("inference_mode", check_inference_mode)
        >>> str(check)
        'inference_mode'
    """

    name: str
    check: Callable[[str], object]

    def __call__(self, backend: str) -> None:
        self.check(backend)

    def __str__(self) -> str:
        return self.name


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


def _report(model: fx.GraphModule) -> str:
    return str(fxquant.explain(model, show=False))


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


def check_lowering(backend: str, case: Case, sizes: Sizes, *, seed: int = 0) -> float:
    """Assert that ``case`` lowers fully and its output is within one step of the reference.

    Returns:
        The largest difference between the lowered and the reference outputs.

    Raises:
        AssertionError: a quantized op stayed a reference op, or the outputs
            differ by more than one quantization step of the output.

    Example:
        >>> case = next(c for c in LOWERING_CASES if c.name == "relu")
        >>> check_lowering("reference", case, (1, 2, 2, 4))
        Traceback (most recent call last):
        AssertionError: relu: not lowered ...
    """
    lowered, reference, inputs = quantize_case(backend, case, sizes, seed=seed)
    if "reference" in lowering_statuses(lowered).values():
        msg = f"{case.name}: not lowered on backend {backend!r}\n{_report(lowered)}"
        raise AssertionError(msg)
    with torch.no_grad():
        expected = reference(*inputs)
        difference = float((lowered(*inputs) - expected).abs().max())
    bound = tolerance(case, expected, output_scale(reference))
    if difference > bound:
        msg = f"{case.name}: the lowered output is {difference} off the reference, over {bound}"
        raise AssertionError(msg)
    return difference


def check_deployed(backend: str, case: Case, sizes: Sizes, *, seed: int = 0) -> float:
    """Assert that ``backend``'s deployment runs ``case`` in its target, within one step.

    For a backend whose models run outside PyTorch (``fxquant_deployment``):
    the case is quantized and converted, deployed with the example inputs,
    and must run every quantized node in the target (status ``lowered`` in
    the deployed model's report) with an output within one quantization step
    of the reference model's.

    Returns:
        The largest difference between the deployed and the reference outputs.

    Raises:
        AssertionError: the backend has no deployment, a quantized node stays
            out of the target, or the outputs differ by more than one step.

    Example:
        >>> check_deployed("reference", LOWERING_CASES[0], (1, 2, 2, 4))
        Traceback (most recent call last):
        AssertionError: backend 'reference' has no deployment (fxquant_deployment)
    """
    deployment = get_deployment(backend)
    if deployment is None:
        msg = f"backend {backend!r} has no deployment (fxquant_deployment)"
        raise AssertionError(msg)
    converted, reference, inputs = quantize_case(backend, case, sizes, seed=seed)
    deployed = deployment.deploy(converted, tuple(inputs))
    # a runtime that stands in for the real target (onnxruntime for TensorRT) says what the
    # target would run in ``target_report``; its own ``report`` says what it ran itself
    report = getattr(deployed, "target_report", deployed.report)
    outside = [e for e in report.entries() if e.status == "reference"]
    if outside:
        msg = f"{case.name}: not all in {deployment.name}\n{report.table()}"
        raise AssertionError(msg)
    with torch.no_grad():
        expected = reference(*inputs)
        difference = float((deployed(*inputs) - expected).abs().max())
    bound = tolerance(case, expected, output_scale(reference))
    if difference > bound:
        msg = f"{case.name}: {deployment.name} is {difference} off the reference, over {bound}"
        raise AssertionError(msg)
    return difference


def check_fully_lowered(backend: str, case: Case) -> None:
    """Assert that every quantized op of ``case`` became a kernel (only lowered or float nodes).

    Example:
        >>> check_fully_lowered("reference", LOWERING_CASES[0])
        Traceback (most recent call last):
        AssertionError: linear: ...
    """
    lowered, _, _ = quantize_case(backend, case, (2, 4, 4, 6))
    found = set(lowering_statuses(lowered).values())
    if "lowered" not in found or not found <= {"lowered", "float"}:
        msg = f"{case.name}: statuses {sorted(found)}\n{_report(lowered)}"
        raise AssertionError(msg)


def check_quantize_warns_nothing(backend: str, name: str) -> None:
    """Assert that quantizing the case called ``name`` warns nothing and lowers its op.

    Example:
        >>> check_quantize_warns_nothing("reference", "linear_dynamic")
        Traceback (most recent call last):
        AssertionError: linear_dynamic: ...
    """
    case = next(c for c in LOWERING_CASES if c.name == name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lowered, _, _ = quantize_case(backend, case, (2, 4, 4, 4))
    found = lowering_statuses(lowered)
    if "lowered" not in found.values():
        msg = f"{name}: nothing lowered, statuses {found}\n{_report(lowered)}"
        raise AssertionError(msg)


def _conv_bn_relu_lowered(backend: str) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    case = Case("conv_bn_relu2d", _conv_bn_relu, _img)
    lowered, _, inputs = quantize_case(backend, case, (2, 3, 4, 8))
    return lowered, inputs


def _same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if not torch.equal(actual, expected):
        msg = f"{what}: the outputs differ from the original model's"
        raise AssertionError(msg)


def check_state_dict_round_trip(backend: str) -> None:
    """Assert that a lowered model's kernels are rebuilt from a loaded ``state_dict``.

    Example:
        >>> check_state_dict_round_trip("reference")
    """
    lowered, inputs = _conv_bn_relu_lowered(backend)
    with torch.no_grad():
        expected = lowered(*inputs)
        buffer = io.BytesIO()
        torch.save(lowered.state_dict(), buffer)
        other = copy.deepcopy(lowered)
        for name, value in other.state_dict().items():
            if name.endswith("weight"):
                value.zero_()  # prepacked weights (if any) now hold zeros ...
        if torch.equal(other(*inputs), expected):
            msg = f"{backend}: zeroing the weights in the state_dict changes nothing"
            raise AssertionError(msg)
        buffer.seek(0)
        other.load_state_dict(torch.load(buffer))  # ... and are rebuilt from the loaded ones
        _same(other(*inputs), expected, "load_state_dict")


def check_deepcopy_and_pickle(backend: str, kernels: tuple[type, ...] = ()) -> None:
    """Assert that deepcopy and pickle give the same outputs and rebuilt ``kernels``.

    Args:
        backend: the backend name.
        kernels: module classes whose copies must hold a packed weight (``_packed``).

    Example:
        >>> check_deepcopy_and_pickle("reference")
    """
    lowered, inputs = _conv_bn_relu_lowered(backend)
    with torch.no_grad():
        expected = lowered(*inputs)
        copied = copy.deepcopy(lowered)
        _same(copied(*inputs), expected, "deepcopy")
        _same(pickle.loads(pickle.dumps(lowered))(*inputs), expected, "pickle")
    if kernels:
        found = [m for m in copied.modules() if isinstance(m, kernels)]
        if not found or any(getattr(k, "_packed", None) is None for k in found):
            msg = f"{backend}: the copy holds no packed kernel of {kernels!r}"
            raise AssertionError(msg)


def check_engine_restored(backend: str) -> None:
    """Assert that a lowered forward leaves ``torch.backends.quantized.engine`` as it found it.

    Example:
        >>> check_engine_restored("reference")
    """
    lowered, inputs = _conv_bn_relu_lowered(backend)
    before = torch.backends.quantized.engine
    engines = [e for e in torch.backends.quantized.supported_engines if e not in (before, "none")]
    other = engines[0] if engines else before
    torch.backends.quantized.engine = other
    try:
        with torch.no_grad():
            lowered(*inputs)
        if torch.backends.quantized.engine != other:
            msg = f"{backend}: forward left the engine {torch.backends.quantized.engine!r}"
            raise AssertionError(msg)
    finally:
        torch.backends.quantized.engine = before


_FRESH = """
import warnings, torch, fxquant
warnings.simplefilter("error")
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
x = torch.randn(1, 3, 8, 8)
mapping = fxquant.get_default_qconfig_mapping({backend!r})
backend = fxquant.get_backend_config({backend!r})
prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=backend)
prepared(x)
lowered = fxquant.convert_fx(prepared)
lowered(x)
print("ok")
"""


def check_no_warning_in_fresh_process(backend: str) -> None:
    """Assert that quantizing and running a model warns nothing, in a new interpreter.

    torch warns once per process (on the first quint8 tensor, for instance):
    only a fresh process shows such warnings. Slow (a second or two).

    Example:
        >>> check_no_warning_in_fresh_process("reference")  # doctest: +SKIP
    """
    code = textwrap.dedent(_FRESH.format(backend=backend))
    command = [sys.executable, "-W", "error", "-c", code]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0 or result.stdout.strip() != "ok" or "deprecated" in result.stderr:
        msg = f"{backend}: the fresh process failed or warned:\n{result.stderr}"
        raise AssertionError(msg)


def check_forward_warns_nothing(backend: str) -> None:
    """Assert that a lowered forward emits no warning (warnings turned into errors).

    Example:
        >>> check_forward_warns_nothing("reference")
    """
    lowered, inputs = _conv_bn_relu_lowered(backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lowered(*inputs)


def check_inference_mode(backend: str) -> None:
    """Assert that a lowered model gives the same output inside and outside inference mode.

    Example:
        >>> check_inference_mode("reference")
    """
    lowered, inputs = _conv_bn_relu_lowered(backend)
    with torch.inference_mode():
        inside = lowered(*inputs)
    with torch.no_grad():
        outside = lowered(*inputs)
    _same(inside, outside, "inference_mode")


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


def check_default_mapping_lowers_every_op(backend: str, *, is_qat: bool = False) -> None:
    """Assert that the backend's default mapping quantizes and lowers every op of
    :class:`OpFamilies` (PTQ, or QAT with ``is_qat``).

    Example:
        >>> check_default_mapping_lowers_every_op("reference")
        Traceback (most recent call last):
        AssertionError: reference: ...
    """
    torch.manual_seed(0)
    model = OpFamilies().train(is_qat)
    x = torch.randn(2, 3, 10, 10)
    mapping = fxquant.get_default_qconfig_mapping(backend, is_qat=is_qat)
    prepare = fxquant.prepare_qat_fx if is_qat else fxquant.prepare_fx
    prepared = prepare(model, mapping, (x,), backend_config=fxquant.get_backend_config(backend))
    prepared(x)
    lowered = fxquant.convert_fx(prepared.eval())
    found = {e.status for e in fxquant.explain(lowered, show=False).entries()}
    if found != {"lowered", "float"}:
        msg = f"{backend}: statuses {sorted(found)}, expected lowered and float\n{_report(lowered)}"
        raise AssertionError(msg)


def check_fixed_qparams_grid(backend: str) -> None:
    """Assert that a lowered sigmoid outputs on its fixed grid (1/256, 0), equal to the reference.

    Example:
        >>> check_fixed_qparams_grid("reference")  # not lowered: a dequantize per step
        Traceback (most recent call last):
        AssertionError: reference: sigmoid dequantizes with ...
    """
    model = nn.Sequential(nn.Sigmoid()).eval()
    x = torch.randn(4, 8) * 4
    lowered, reference = quantize_model(backend, model, [[x]])
    dequantize = torch.ops.fxquant.dequantize_per_tensor.default
    grids = [n.args[1:3] for n in lowered.graph.nodes if n.target == dequantize]
    if grids != [(1 / 256, 0)]:
        msg = f"{backend}: sigmoid dequantizes with {grids}, expected [(1/256, 0)]"
        raise AssertionError(msg)
    # the kernel lands on the same grid: the integers are exact, not requantized
    _same(lowered(x), reference(x), "sigmoid")


def check_listed_by_cli(backend: str, distribution: str) -> None:
    """Assert that ``python -m fxquant backends`` lists ``backend`` as ok, from ``distribution``.

    Args:
        backend: the backend name.
        distribution: ``"name version"`` of the plugin's distribution.

    Example:
        >>> check_listed_by_cli("reference", "fxquant")  # doctest: +SKIP
    """
    command = [sys.executable, "-m", "fxquant", "backends"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    rows = [line for line in result.stdout.splitlines() if line.startswith(f"| {backend} ")]
    if len(rows) != 1 or "| ok " not in rows[0] or distribution not in rows[0]:
        msg = f"{backend}: expected one ok row from {distribution!r}, got {rows}"
        raise AssertionError(msg)


def check_hooks_answer_only_for(
    plugin: Any, backend: str, other: str = "reference", rules: Sequence[str] = ()
) -> None:
    """Assert that a plugin module's hooks answer None for the backend ``other``.

    Hooks the plugin does not implement are left out.

    Args:
        plugin: the module (or object) with the plugin's hook implementations.
        backend: the plugin's backend.
        other: a backend the plugin does not implement.
        rules: names of lowering rules the plugin must give for ``backend``.

    Example:
        >>> import types
        >>> hooks = types.SimpleNamespace(fxquant_pattern_configs=lambda b: None,
        ...     fxquant_lowering_kernels=lambda b: None,
        ...     fxquant_default_qconfig_mapping=lambda b, q: None)
        >>> check_hooks_answer_only_for(hooks, "mine")
    """
    calls: dict[str, Callable[[Callable[..., Any]], Any]] = {
        "fxquant_pattern_configs": lambda hook: hook(other),
        "fxquant_lowering_kernels": lambda hook: hook(other),
        "fxquant_default_qconfig_mapping": lambda hook: hook(other, False),
        "fxquant_deployment": lambda hook: hook(other),
        # the model and mapping are not read for another backend
        "fxquant_graph_mode": lambda hook: hook(other, None, None, False),
    }
    answering = [
        name
        for name, call in calls.items()
        if hasattr(plugin, name) and call(getattr(plugin, name)) is not None
    ]
    if answering:
        msg = f"{backend}: hooks {answering} of {plugin!r} answer for the backend {other!r}"
        raise AssertionError(msg)
    kernels = getattr(plugin, "fxquant_lowering_kernels", None)
    names = {rule.name for rule in (kernels(backend) if kernels else None) or []}
    if not set(rules) <= names:
        msg = f"{backend}: lowering rules {sorted(set(rules) - names)} missing from {names}"
        raise AssertionError(msg)


def load_module_from_path(path: str | Path, name: str) -> ModuleType:
    """Import the Python file ``path`` as the module ``name`` (registered in ``sys.modules``).

    For a plugin's tests that use the repository's model zoo (``tests/flow/zoo.py``):
    plugin tests run without the core's test package on ``sys.path``.

    Raises:
        FileNotFoundError: there is no file at ``path``.

    Example:
        >>> import fxquant.tools.testing
        >>> load_module_from_path(fxquant.tools.testing.__file__, "a_copy_of_the_kit").__name__
        'a_copy_of_the_kit'
    """
    import importlib.util

    file = Path(path)
    if not file.is_file():
        msg = f"no Python file at {file}"
        raise FileNotFoundError(msg)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None  # a .py file always has a spec
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Digits:
    """sklearn's handwritten digits, split once: images (N, 1, 8, 8) in [0, 1], int64 labels.

    Real data with no download (scikit-learn ships the images), for the accuracy
    tests every backend runs: a float CNN and its int8 forms on the same split.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def load_digits(train: int = 1400) -> Digits:
    """The digits shuffled with a fixed seed: ``train`` images to train on, the rest to test.

    Raises:
        ImportError: scikit-learn is not installed (tests ``importorskip`` it first).

    Example:
        >>> data = load_digits()  # doctest: +SKIP
        >>> data.test_x.shape  # doctest: +SKIP
        torch.Size([397, 1, 8, 8])
    """
    # a test extra, not a dependency of fxquant (and it ships no type information)
    from sklearn import datasets  # type: ignore[import-untyped,import-not-found,unused-ignore]

    data = datasets.load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    # shuffled once: the file is ordered by writer, and the test split must not be one writer
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
    images, labels = images[order], labels[order]
    return Digits(images[:train], labels[:train], images[train:], labels[train:])


def train_digits_classifier(
    model: nn.Module, data: Digits, *, steps: int = 400, lr: float = 0.01, batch: int = 64
) -> nn.Module:
    """Adam on random batches of ``data``'s training split, fixed seed; returns ``model`` in eval.

    Example:
        >>> data = Digits(torch.rand(8, 1, 8, 8), torch.arange(8) % 2, torch.rand(2, 1, 8, 8),
        ...               torch.tensor([0, 1]))
        >>> net = nn.Sequential(nn.Flatten(), nn.Linear(64, 2))
        >>> train_digits_classifier(net, data, steps=2, batch=4).training
        False
    """
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        chosen = torch.randint(0, len(data.train_x), (batch,))
        loss = F.cross_entropy(model(data.train_x[chosen]), data.train_y[chosen])
        optimizer.zero_grad()
        torch.autograd.backward(loss)
        optimizer.step()
    return model.eval()


def digits_accuracy(run: Callable[[torch.Tensor], torch.Tensor], data: Digits) -> float:
    """Top-1 accuracy in percent of ``run`` (a model, or a deployed one) on the test split.

    Example:
        >>> data = Digits(torch.rand(2, 1, 8, 8), torch.tensor([0, 1]), torch.rand(2, 1, 8, 8),
        ...               torch.tensor([0, 0]))
        >>> digits_accuracy(lambda x: torch.tensor([[1.0, 0.0]] * len(x)), data)
        100.0
    """
    with torch.no_grad():
        return float((run(data.test_x).argmax(1) == data.test_y).float().mean()) * 100


def ao_op_as_fxquant(op: Any) -> Any:
    """A torch.ao class (or nested pattern of them) as the fxquant class of the same name.

    Kept for plugin tests; see :func:`fxquant.torch_ao_names.as_fxquant_class`.

    Example:
        >>> ao_op_as_fxquant((torch.nn.ReLU, "relu"))
        (<class 'torch.nn.modules.activation.ReLU'>, 'relu')
    """
    return as_fxquant_class(op)


def ao_normalized_pattern(ao_config: Any) -> Any:
    """The fxquant normalized (complex-format) pattern of a torch.ao BackendPatternConfig.

    Example:
        >>> import types
        >>> ao_config = types.SimpleNamespace(_pattern_complex_format=None, pattern=torch.relu)
        >>> ao_normalized_pattern(ao_config) is torch.relu
        True
    """
    if ao_config._pattern_complex_format is not None:
        return validate_complex(ao_op_as_fxquant(ao_config._pattern_complex_format))
    return simple_to_complex(ao_op_as_fxquant(ao_config.pattern))


def check_covers_ao_patterns(backend: str, ao_configs: Any, *, at_least: int = 0) -> None:
    """Assert that ``backend`` lists every pattern of torch.ao's pattern configs ``ao_configs``.

    Args:
        backend: the backend name.
        ao_configs: ``configs`` of a torch.ao BackendConfig (the caller imports torch.ao).
        at_least: the least number of distinct torch.ao patterns expected.

    Example:
        >>> check_covers_ao_patterns("reference", [])
    """
    theirs = [ao_normalized_pattern(c) for c in ao_configs]
    ours = {c.normalized_pattern for c in fxquant.get_backend_config(backend).configs}
    missing = [p for p in theirs if p not in ours]
    if missing or len(set(theirs)) < at_least or len(ours) < len(set(theirs)):
        msg = f"{backend}: {len(missing)} of {len(theirs)} torch.ao patterns missing: {missing}"
        raise AssertionError(msg)


def lowering_checks(
    kernels: tuple[type, ...] = (), cases: Sequence[Case] = LOWERING_CASES
) -> list[NamedCheck]:
    """The checks every backend with lowering kernels should pass, one per test.

    ``fully_lowered[<case>]`` per case, then the checks of a lowered conv-bn-relu
    model: state_dict round trip, deepcopy and pickle (the copies hold packed
    ``kernels``), engine restored, no warning (fresh process, forward,
    quantizing a dynamic linear) and inference mode.

    Example:
        >>> [str(c) for c in lowering_checks(cases=[])][:2]
        ['state_dict_round_trip', 'deepcopy_and_pickle']
    """
    per_case = [
        NamedCheck(f"fully_lowered[{case}]", functools.partial(check_fully_lowered, case=case))
        for case in cases
    ]
    return [
        *per_case,
        NamedCheck("state_dict_round_trip", check_state_dict_round_trip),
        NamedCheck(
            "deepcopy_and_pickle", functools.partial(check_deepcopy_and_pickle, kernels=kernels)
        ),
        NamedCheck("engine_restored", check_engine_restored),
        NamedCheck("no_warning_in_fresh_process", check_no_warning_in_fresh_process),
        NamedCheck("forward_warns_nothing", check_forward_warns_nothing),
        NamedCheck(
            "quantize_dynamic_linear_warns_nothing",
            functools.partial(check_quantize_warns_nothing, name="linear_dynamic"),
        ),
        NamedCheck("inference_mode", check_inference_mode),
    ]


def backend_checks(plugin: Any, distribution: str, rules: Sequence[str] = ()) -> list[NamedCheck]:
    """The checks of an installed backend plugin and its default mapping, one per test.

    Args:
        plugin: the module with the plugin's hook implementations.
        distribution: ``"name version"`` of the plugin's distribution.
        rules: names of lowering rules the plugin must give.

    Example:
        >>> [str(c) for c in backend_checks(None, "fxquant-mine 1.0")][:2]
        ['listed_by_cli', 'hooks_answer_only_for_their_backend']
    """

    def hooks(backend: str) -> None:
        check_hooks_answer_only_for(plugin, backend, other="x86", rules=rules)

    return [
        NamedCheck(
            "listed_by_cli", functools.partial(check_listed_by_cli, distribution=distribution)
        ),
        NamedCheck("hooks_answer_only_for_their_backend", hooks),
        NamedCheck("default_mapping_lowers_every_op", check_default_mapping_lowers_every_op),
        NamedCheck(
            "default_qat_mapping_lowers_every_op",
            functools.partial(check_default_mapping_lowers_every_op, is_qat=True),
        ),
        NamedCheck("fixed_qparams_grid", check_fixed_qparams_grid),
    ]
