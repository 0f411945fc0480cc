"""The checks every backend plugin should pass, each raising ``AssertionError`` with a report.

:func:`lowering_checks` and :func:`backend_checks` list them as :class:`NamedCheck` s, one
per test; each ``check_*`` can also be called alone.

Example:
    >>> [str(c) for c in backend_checks(None, "fxquant-mine 1.0")][:2]
    ['listed_by_cli', 'hooks_answer_only_for_their_backend']
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
from typing import Any

import torch
from torch import fx, nn

import fxquant
from fxquant.registry import get_deployment
from fxquant.tools.testing.cases import (
    LOWERING_CASES,
    Case,
    OpFamilies,
    Sizes,
    lowering_statuses,
    output_scale,
    quantize_case,
    quantize_model,
    tolerance,
)

__all__ = [
    "NamedCheck",
    "backend_checks",
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
    "lowering_checks",
]


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


def _report(model: fx.GraphModule) -> str:
    return str(fxquant.explain(model, show=False))


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
    return _within_one_step(case, lowered, reference, inputs, "the lowered output")


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
    return _within_one_step(case, deployed, reference, inputs, deployment.name)


def _within_one_step(
    case: Case, run: Callable[..., Any], reference: fx.GraphModule, inputs: Sequence[Any], what: str
) -> float:
    """The largest difference of ``run``'s output from the reference model's; raises when
    it is over the case's tolerance (one quantization step of the output)."""
    with torch.no_grad():
        expected = reference(*inputs)
        difference = float((run(*inputs) - expected).abs().max())
    bound = tolerance(case, expected, output_scale(reference))
    if difference > bound:
        msg = f"{case.name}: {what} is {difference} off the reference, over {bound}"
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
    case = next(c for c in LOWERING_CASES if c.name == "conv_bn_relu2d")
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
