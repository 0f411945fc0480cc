"""``fxquant demo``: quantize a built-in model with every installed backend, and say how it went.

For each installed backend (and the seed tutorial's ``my_backend``, built with
fxquant's config classes and registered in a private registry) the demo runs
the whole flow on :class:`DemoNet`: ``prepare_fx`` with the backend's default
mapping, calibration, ``convert_fx``. It prints one row per backend (patterns
lowered to kernels, left in reference form, left float; output SQNR and top-1
agreement against the float model; latency against float at one thread), then
every node a backend did not quantize, with the report's reason. A backend
whose target runs outside PyTorch (a ``Deployment``: an ExecuTorch program, an
ONNX model) is deployed with it and measured in its runtime; its counts come
from the deployment's report. A backend that fails gets its error in its row;
the others still run.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from fxquant.progress import progress
from fxquant.registry.answers import Deployment
from fxquant.registry.hookspecs import hookimpl

__all__ = [
    "DemoNet",
    "DemoResult",
    "TutorialPlugin",
    "fuse_conv2d_relu",
    "quantize_with",
    "result_dict",
    "run_demo",
    "tutorial_pattern_configs",
    "tutorial_qconfig_mapping",
]

BACKEND = "my_backend"


def _optional_class(module: str, name: str) -> type[torch.nn.Module] | None:
    # the nn packages are written alongside the demo: leave a mapping out until they exist
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def fuse_conv2d_relu(is_qat: bool, conv: torch.nn.Conv2d, relu: torch.nn.ReLU) -> torch.nn.Module:
    """The tutorial's fuser: conv + relu -> ConvReLU2d (the same for PTQ and QAT).

    Example:
        >>> fused = fuse_conv2d_relu(False, torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU())
        >>> type(fused).__name__
        'ConvReLU2d'
    """
    from fxquant.nn.intrinsic import ConvReLU2d

    return ConvReLU2d(conv, relu)


def tutorial_pattern_configs() -> list[Any]:
    """The three pattern configs of the tutorial: linear, conv+relu fusion, fused conv-relu.

    Example:
        >>> [len(c.dtype_configs) for c in tutorial_pattern_configs()]
        [1, 0, 1]
    """
    from fxquant.config.backend import (
        BackendPatternConfig,
        DTypeConfig,
        DTypeWithConstraints,
        ObservationType,
    )
    from fxquant.nn.intrinsic import ConvReLU2d

    # The tutorial's spelling; on a torch without quantized dtypes the plain ones mean the same.
    quint8 = getattr(torch, "quint8", torch.uint8)
    qint8 = getattr(torch, "qint8", torch.int8)
    quint8_with_constraints = DTypeWithConstraints(
        dtype=quint8,
        quant_min_lower_bound=0,
        quant_max_upper_bound=255,
        scale_min_lower_bound=2**-12,
    )
    weighted_int8 = DTypeConfig(
        input_dtype=quint8_with_constraints,
        output_dtype=quint8_with_constraints,
        weight_dtype=qint8,
        bias_dtype=torch.float,
    )
    different = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    linear = (
        BackendPatternConfig(torch.nn.Linear)
        .set_observation_type(different)
        .add_dtype_config(weighted_int8)
        .set_root_module(torch.nn.Linear)
        .set_qat_module(_optional_class("fxquant.nn.qat", "Linear"))
        .set_reference_quantized_module(_optional_class("fxquant.nn.reference", "Linear"))
    )
    conv_relu = (
        BackendPatternConfig((torch.nn.Conv2d, torch.nn.ReLU))
        .set_fused_module(ConvReLU2d)
        .set_fuser_method(fuse_conv2d_relu)
    )
    fused_conv_relu = (
        BackendPatternConfig(ConvReLU2d)
        .set_observation_type(different)
        .add_dtype_config(weighted_int8)
        .set_root_module(torch.nn.Conv2d)
        .set_qat_module(_optional_class("fxquant.nn.intrinsic.qat", "ConvReLU2d"))
        .set_reference_quantized_module(_optional_class("fxquant.nn.reference", "Conv2d"))
    )
    return [linear, conv_relu, fused_conv_relu]


class TutorialPlugin:
    """The tutorial's backend as a plugin object (what ``register_plugin`` takes).

    Example:
        >>> len(TutorialPlugin().fxquant_pattern_configs(BACKEND))
        3
    """

    @hookimpl
    def fxquant_pattern_configs(self, backend: str) -> list[Any] | None:
        """The tutorial's three pattern configs, for ``my_backend`` only."""
        return tutorial_pattern_configs() if backend == BACKEND else None


def tutorial_qconfig_mapping() -> Any:
    """The tutorial's QConfigMapping: activations in 0..127 with eps 2**-12, int8 weights.

    Example:
        >>> tutorial_qconfig_mapping().qconfig_for("linear", torch.nn.Linear).activation().quant_max
        127
    """
    from fxquant.config.qconfig import QConfig
    from fxquant.config.qconfig_mapping import QConfigMapping
    from fxquant.observer import MinMaxObserver, default_weight_observer

    activation = MinMaxObserver.with_args(quant_min=0, quant_max=127, eps=2**-12)
    qconfig = QConfig(activation=activation, weight=default_weight_observer)
    mapping = QConfigMapping()
    for op in (torch.nn.Linear, torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU):
        mapping.set_object_type(op, qconfig)
    return mapping


class DemoNet(torch.nn.Module):
    """A small residual CNN: conv-bn-relu, a residual add, pooling, linear, sigmoid.

    Example:
        >>> DemoNet()(torch.randn(2, 3, 16, 16)).shape
        torch.Size([2, 10])
    """

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(0)
        nn = torch.nn
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.block = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width),
        )  # fmt: skip
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, classes)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Stem, one residual block, global pooling, a gated linear head."""
        x = self.stem(x)
        x = self.relu(self.block(x) + x)
        x = torch.flatten(self.pool(x), 1)
        logits: torch.Tensor = self.fc(x) * self.gate(self.fc(x))
        return logits


@dataclass
class DemoResult:
    """How quantizing :class:`DemoNet` with one backend went.

    Attributes:
        backend: the backend's name.
        counts: report entries by status (``lowered``, ``reference``, ``float``...).
        not_quantized: ``(node, reason code, reason words)`` of every entry that
            was not lowered to a kernel and says why.
        sqnr_db: output SQNR against the float model.
        agreement: fraction of inputs whose top-1 class matches the float model's.
        speed: float latency / quantized latency (above 1 is faster).
        runs_on: what ran the quantized model (``PyTorch``, or the deployment's name).
        error: why the backend failed, or "" when it worked.
    """

    backend: str
    counts: Counter[str] = field(default_factory=Counter)
    not_quantized: list[tuple[str, str, str]] = field(default_factory=list)
    sqnr_db: float = float("nan")
    agreement: float = float("nan")
    speed: float = float("nan")
    runs_on: str = "PyTorch"
    error: str = ""


def _sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (reference - approximation).pow(2).mean()
    signal = reference.pow(2).mean()
    return float("inf") if noise == 0 else float(10 * torch.log10(signal / noise))


def _seconds(run: Callable[[], Any], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        run()
    return (time.perf_counter() - start) / repeat


def _speed(float_run: Callable[[], Any], int8_run: Callable[[], Any], rounds: int = 7) -> float:
    """Float latency over int8 latency: the median of per-round ratios, the two alternating.

    One untimed call each first (kernels pack their weights on the first call);
    alternating within a round keeps a shared machine's load out of the ratio.
    """
    float_run()
    int8_run()
    ratios = [_seconds(float_run, 3) / _seconds(int8_run, 3) for _ in range(rounds)]
    return statistics.median(ratios)


def quantize_with(
    backend_config: Any,
    qconfig_mapping: Any,
    model: torch.nn.Module,
    data: torch.Tensor,
    deployment: Deployment | None = None,
) -> DemoResult:
    """Prepare, calibrate on ``data``, convert (and deploy), and compare with the float ``model``.

    Example:
        >>> import fxquant
        >>> result = quantize_with(fxquant.get_backend_config("reference"),
        ...     fxquant.get_default_qconfig_mapping("reference"), DemoNet().eval(),
        ...     torch.randn(8, 3, 16, 16))
        >>> result.counts["reference"] > 0, result.sqnr_db > 20
        (True, True)
    """
    from fxquant.flow import convert_fx, explain, prepare_fx
    from fxquant.flow.report import NodeStatus

    result = DemoResult(backend_config.name)
    prepared = prepare_fx(
        copy.deepcopy(model), qconfig_mapping, (data[:1],), backend_config=backend_config
    )
    with torch.no_grad():
        for batch in torch.split(data, 4):
            prepared(batch)
        quantized = convert_fx(prepared, backend_config=backend_config)
        report = explain(quantized, show=False)
        run: Callable[[torch.Tensor], torch.Tensor] = quantized
        if deployment is not None:
            deployed = deployment.deploy(quantized, (data,))
            run, report, result.runs_on = deployed, deployed.report, deployment.name
        expected, actual = model(data), run(data)
        result.speed = _speed(lambda: model(data), lambda: run(data))
    result.sqnr_db = _sqnr_db(expected, actual)
    result.agreement = float((expected.argmax(1) == actual.argmax(1)).float().mean())
    result.counts = Counter(entry.status for entry in report.entries())
    result.not_quantized = [
        (entry.node, entry.reason.code, entry.reason.words)
        for entry in report.entries()
        if entry.reason is not None
        and entry.status in (NodeStatus.SKIPPED, NodeStatus.FLOAT, NodeStatus.REFERENCE)
    ]
    return result


def _try(name: str, build: Callable[[], DemoResult]) -> DemoResult:
    try:
        return build()
    except Exception as error:  # a broken backend is reported in its row; the others run
        return DemoResult(name, error=f"{type(error).__name__}: {error}".splitlines()[0])


def _results(model: torch.nn.Module, data: torch.Tensor, names: Sequence[str]) -> list[DemoResult]:
    from fxquant.registry import get_backend_config, get_default_qconfig_mapping, get_deployment
    from fxquant.registry.manager import Registry

    results = [
        _try(
            name,
            lambda name=name: quantize_with(  # type: ignore[misc]  # bound per iteration
                get_backend_config(name),
                get_default_qconfig_mapping(name),
                model,
                data,
                get_deployment(name),
            ),
        )
        # deploying (ExecuTorch, ONNX) takes seconds a backend: say how far along it is
        for name in progress(names, description="fxquant demo")
    ]
    registry = Registry()  # private: the tutorial backend must not show up in the user's process
    registry.register_plugin(TutorialPlugin(), backend=BACKEND)
    results.append(
        _try(
            BACKEND,
            lambda: quantize_with(
                registry.get_backend_config(BACKEND), tutorial_qconfig_mapping(), model, data
            ),
        )
    )
    return results


def _row(result: DemoResult) -> list[str]:
    if result.error:
        return [result.backend, "-", "-", "-", "-", "-", "-", "-", f"failed: {result.error}"]
    counts = result.counts
    return [
        result.backend,
        str(counts["lowered"]),
        str(counts["reference"]),
        str(counts["skipped"]),
        f"{result.sqnr_db:.1f}",
        f"{result.agreement:.0%}",
        f"{result.speed:.2f}x",
        result.runs_on,
        "ok",
    ]


def result_dict(result: DemoResult) -> dict[str, Any]:
    """One result as JSON-safe data (``fxquant demo --json``): NaN and infinity become None.

    Example:
        >>> result_dict(DemoResult("x86"))["sqnr_db"] is None
        True
    """

    def number(value: float) -> float | None:
        return value if math.isfinite(value) else None

    return {
        "backend": result.backend,
        "status": "failed" if result.error else "ok",
        "error": result.error,
        "counts": dict(sorted(result.counts.items())),
        "sqnr_db": number(result.sqnr_db),
        "top1_agreement": number(result.agreement),
        "speed": number(result.speed),
        "runs_on": result.runs_on,
        "not_quantized": [
            {"node": node, "code": code, "words": words}
            for node, code, words in result.not_quantized
        ],
    }


def run_demo(
    out: TextIO | None = None, backends: Sequence[str] | None = None, *, as_json: bool = False
) -> int:
    """Quantize :class:`DemoNet` with each installed backend (or ``backends``); print; return 0.

    Progress goes to stderr when it is a terminal (:mod:`fxquant.progress`);
    ``as_json`` prints the results as a JSON list (:func:`result_dict`) instead
    of the tables. Returns 1 when every backend failed.

    Example:
        >>> import io
        >>> run_demo(io.StringIO(), backends=["reference"])
        0
    """
    from fxquant.cli import markdown_table
    from fxquant.registry import list_backends

    out = sys.stdout if out is None else out
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # latency ratios at one thread: steady on a shared machine
    try:
        model = DemoNet().eval()
        data = torch.randn(32, 3, 16, 16, generator=torch.Generator().manual_seed(1))
        names = list_backends() if backends is None else list(backends)
        results = _results(model, data, names)
    finally:
        torch.set_num_threads(threads)
    code = 1 if all(r.error for r in results) else 0
    if as_json:
        print(json.dumps([result_dict(r) for r in results], indent=2), file=out)
        return code
    print(
        f"Quantizing DemoNet (residual CNN, sigmoid gate) with {len(results)} backends "
        "(installed ones + the seed tutorial's my_backend); SQNR and top-1 agreement vs "
        'float on 32 inputs, speed = float latency / int8 latency at 1 thread; "lowered" '
        "counts the nodes that run on the backend's kernels or in its runtime.\n",
        file=out,
    )
    header = [
        "backend",
        "lowered",
        "reference",
        "skipped",
        "SQNR dB",
        "top-1",
        "speed",
        "runs on",
        "status",
    ]
    print(markdown_table(header, [_row(r) for r in results]), file=out)
    for result in results:
        _print_reasons(result, out)
    return code


def _print_reasons(result: DemoResult, out: TextIO) -> None:
    if not result.not_quantized:
        return
    print(f"\n{result.backend}: not lowered to a kernel, and why", file=out)
    unlowered = [node for node, code, _ in result.not_quantized if code == "no_lowering_kernel"]
    if unlowered:
        print(f"  no lowering kernel (reference form): {', '.join(unlowered)}", file=out)
    # a multi-node chain repeats one sentence per node: print each sentence once
    sentences = (w for _, code, w in result.not_quantized if code != "no_lowering_kernel")
    for words in dict.fromkeys(sentences):
        print(f"  {words}", file=out)
