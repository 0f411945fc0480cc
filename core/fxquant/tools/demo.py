"""``fxquant demo``: quantize a built-in model with every installed backend, and say how it went.

For each installed backend the demo runs the whole flow on :class:`DemoNet`:
``prepare_fx`` with the backend's default mapping, calibration, ``convert_fx``. It
prints one row per backend (nodes lowered to kernels, left in reference form, skipped,
left float; output SQNR and top-1 agreement against the float model; int8 and float
latency at one thread and their ratio, and a status that says when the quantized model
is slower than float and why), a legend saying what each column counts, then every node
a backend did not lower, with the report's reason. The seed tutorial's ``my_backend``
(built with fxquant's config classes in a private registry, never installed) runs only
when named (``--backends my_backend``), and its row says it is the tutorial's. Third-party
start-up chatter (ExecuTorch's cpuinfo lines, torchao's missing CUDA kernels) is
kept out of it (:mod:`fxquant.tools.quiet`). A backend whose target runs outside PyTorch (a
``Deployment``: an ExecuTorch program, an ONNX model, x86's inductor compile) is
deployed with it and measured in its runtime; its counts come from the deployment's
report. A backend that also lowers in PyTorch (x86) deploys its
``convert_to_reference_fx`` model. A backend that fails gets its error in its row;
the others still run.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from fxquant.config.backend import (
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
)
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow import convert_fx, convert_to_reference_fx, explain, prepare_fx
from fxquant.flow.report import NodeStatus
from fxquant.nn.intrinsic import ConvReLU2d
from fxquant.numerics.observer import MinMaxObserver, default_weight_observer
from fxquant.registry import (
    get_backend_config,
    get_default_qconfig_mapping,
    get_deployment,
    list_backends,
)
from fxquant.registry.answers import Deployment
from fxquant.registry.hookspecs import hookimpl
from fxquant.registry.manager import Registry
from fxquant.tools.progress import progress
from fxquant.tools.quiet import third_party_noise_filtered
from fxquant.tools.tables import markdown_table

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
    return ConvReLU2d(conv, relu)


def tutorial_pattern_configs() -> list[Any]:
    """The three pattern configs of the tutorial: linear, conv+relu fusion, fused conv-relu.

    Example:
        >>> [len(c.dtype_configs) for c in tutorial_pattern_configs()]
        [1, 0, 1]
    """
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
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.BatchNorm2d(width),
        )
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
        float_ms: the float model's latency on the 32 inputs, in milliseconds.
        int8_ms: the quantized model's latency on them, in milliseconds.
        runs_on: what ran the quantized model (``PyTorch``, or the deployment's name).
        float_nodes: the ops left float (a dequantize before and a quantize after each).
        error: why the backend failed, or "" when it worked.
    """

    backend: str
    counts: Counter[str] = field(default_factory=Counter)
    not_quantized: list[tuple[str, str, str]] = field(default_factory=list)
    sqnr_db: float = float("nan")
    agreement: float = float("nan")
    speed: float = float("nan")
    float_ms: float = float("nan")
    int8_ms: float = float("nan")
    runs_on: str = "PyTorch"
    float_nodes: list[str] = field(default_factory=list)
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


ROUNDS = 7


def _speed(
    float_run: Callable[[], Any], int8_run: Callable[[], Any], rounds: int = ROUNDS
) -> tuple[float, float, float]:
    """``(float seconds, int8 seconds, ratio)``: medians over rounds, the two alternating.

    One untimed call each first (kernels pack their weights on the first call);
    alternating within a round keeps a shared machine's load out of the ratio,
    which is the median of the per-round ratios.
    """
    float_run()
    int8_run()
    pairs = [(_seconds(float_run, 3), _seconds(int8_run, 3)) for _ in range(rounds)]
    ratio = statistics.median(f / i for f, i in pairs)
    return statistics.median(f for f, _ in pairs), statistics.median(i for _, i in pairs), ratio


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
            # a backend whose kernels run in PyTorch too (x86: oneDNN eager, inductor compiled)
            # deploys its reference model: its toolchain compiles that form
            lowered = any(e.status == NodeStatus.LOWERED for e in report.entries())
            source = convert_to_reference_fx(prepared) if lowered else quantized
            deployed = deployment.deploy(source, (data,))
            run, report, result.runs_on = deployed, deployed.report, deployment.name
        expected, actual = model(data), run(data)
        float_s, int8_s, result.speed = _speed(lambda: model(data), lambda: run(data))
        result.float_ms, result.int8_ms = float_s * 1000, int8_s * 1000
    result.sqnr_db = _sqnr_db(expected, actual)
    result.agreement = float((expected.argmax(1) == actual.argmax(1)).float().mean())
    result.counts = Counter(entry.status for entry in report.entries())
    # placeholders, outputs and attributes are "float" too: the column counts ops
    result.float_nodes = [
        e.node
        for e in report.entries()
        if e.status == NodeStatus.FLOAT and e.op.startswith("call_")
    ]
    result.counts["float_ops"] = len(result.float_nodes)
    result.not_quantized = [
        (entry.node, entry.reason.code, entry.reason.words)
        for entry in report.entries()
        if entry.reason is not None
        and entry.status in (NodeStatus.SKIPPED, NodeStatus.FLOAT, NodeStatus.REFERENCE)
    ]
    return result


def _try(name: str, build: Callable[[], DemoResult]) -> DemoResult:
    try:
        # plugins import their toolchains here (ExecuTorch, torchao): their start-up lines
        # would print before the table, and read like errors of ours
        with third_party_noise_filtered():
            return build()
    except Exception as error:  # a broken backend is reported in its row; the others run
        return DemoResult(name, error=f"{type(error).__name__}: {error}".splitlines()[0])


def _results(
    model: torch.nn.Module, data: torch.Tensor, names: Sequence[str], tutorial: bool
) -> list[DemoResult]:

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
    if not tutorial:
        return results
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


def _ms(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else "-"


def _float_ops(result: DemoResult) -> int:
    return int(result.counts["float_ops"])


# Backends built for another machine than this one, or measured on a stand-in for their
# target: a row slower than float says so rather than blaming the model. Keyed by the
# first-party backends' names; a third-party backend gets the measured reasons of _slower.
_NOT_THIS_HOST: dict[str, Callable[[], str | None]] = {
    "qnnpack": lambda: (
        None
        if platform.machine().lower() in ("arm64", "aarch64") or "arm" in platform.machine()
        else f"qnnpack targets ARM; on {platform.machine()} its kernels are slow"
    ),
    "tensorrt": lambda: (
        "onnxruntime on the CPU stands in for TensorRT's GPU engine (its Q/DQ kernels are "
        "not TensorRT's)"
    ),
}


def _slower(result: DemoResult) -> str:
    """Why ``result`` runs slower than float, from what the run measured.

    Example:
        >>> _slower(DemoResult("reference", counts=Counter(reference=11)))
        'reference kernels replay float ops between quantize/dequantize (nothing lowered)'
        >>> mine = DemoResult("mine", counts=Counter(lowered=9), float_nodes=["add"])
        >>> print(_slower(mine))  # doctest: +ELLIPSIS
        a dequantize/quantize around each op kept float (add), and DemoNet's layers are small...
    """
    host = _NOT_THIS_HOST.get(result.backend, lambda: None)()
    if host is not None:
        return host
    if result.counts["lowered"] == 0:
        return "reference kernels replay float ops between quantize/dequantize (nothing lowered)"
    kept = (
        f"a dequantize/quantize around each op kept float ({', '.join(result.float_nodes)}), and "
    )
    return f"{kept if result.float_nodes else ''}DemoNet's layers are small (16 channels)"


def _status(result: DemoResult) -> str:
    """``ok``, ``slower than float: why``, or ``failed: error`` (the error's first line)."""
    if result.error:
        return f"failed: {result.error}"
    if math.isfinite(result.speed) and result.speed < 1:
        return f"slower than float: {_slower(result)}"
    return "ok"


def _label(result: DemoResult) -> str:
    return f"{BACKEND} (tutorial)" if result.backend == BACKEND else result.backend


def _row(result: DemoResult) -> list[str]:
    if result.error:
        return [_label(result), *["-"] * 10, _status(result)]
    counts = result.counts
    return [
        _label(result),
        str(counts["lowered"]),
        str(counts["reference"]),
        str(counts["skipped"]),
        str(_float_ops(result)),
        f"{result.sqnr_db:.1f}",
        f"{result.agreement:.0%}",
        _ms(result.int8_ms),
        _ms(result.float_ms),
        f"{result.speed:.2f}x",
        result.runs_on,
        _status(result),
    ]


HEADER = [
    "backend",
    "lowered",
    "reference",
    "skipped",
    "float",
    "SQNR dB",
    "top-1",
    "int8 ms",
    "float ms",
    "speed",
    "runs on",
    "status",
]

LEGEND = f"""Columns (node counts are graph nodes of DemoNet: an op or a module call each):
  lowered    runs on the backend's kernels (or, for a backend that deploys, in its runtime)
  reference  quantized, but no kernel took it: quantize -> float op -> dequantize, same numbers
  skipped    the mapping asked to quantize it and the backend could not (no pattern, dtypes)
  float      an op left float on purpose: its qconfig is None, or it computes on shapes
  SQNR dB    output signal-to-noise vs the float model (20 dB ~ 10% error, 40 dB ~ 1%)
  top-1      share of the 32 inputs whose top class is the float model's
  int8 ms    median latency of the quantized model on the 32 inputs, 1 thread
  float ms   the same for the float model, measured alternately with it
  speed      float ms / int8 ms (above 1: faster), the median of {ROUNDS} per-round ratios
  status     ok; slower than float, and why; or failed, with the backend's error
Latency varies from run to run on a shared or busy machine (speed-ups have moved 2x between
runs); compare backends within one run, and use bench/ (same-run ratios, >= 5 rounds) for
figures to quote. Every node not lowered is listed below with the report's reason."""


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
        "status": _status(result).split(":", 1)[0],
        "status_words": _status(result),
        "error": result.error,
        "counts": dict(sorted(result.counts.items())),
        "sqnr_db": number(result.sqnr_db),
        "top1_agreement": number(result.agreement),
        "speed": number(result.speed),
        "float_ms": number(result.float_ms),
        "int8_ms": number(result.int8_ms),
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

    The seed tutorial's ``my_backend`` (not installed: registered in a private
    registry) runs only when ``"my_backend"`` is one of ``backends``. Progress goes
    to stderr when it is a terminal (:mod:`fxquant.tools.progress`; ``FXQUANT_PROGRESS=0``
    turns it off);
    ``as_json`` prints the results as a JSON list (:func:`result_dict`) instead
    of the tables. Returns 1 when every backend failed.

    Example:
        >>> import io
        >>> run_demo(io.StringIO(), backends=["reference"])
        0
    """
    out = sys.stdout if out is None else out
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # latency ratios at one thread: steady on a shared machine
    try:
        model = DemoNet().eval()
        data = torch.randn(32, 3, 16, 16, generator=torch.Generator().manual_seed(1))
        names = list_backends() if backends is None else [n for n in backends if n != BACKEND]
        tutorial = backends is not None and BACKEND in backends
        results = _results(model, data, names, tutorial)
    finally:
        torch.set_num_threads(threads)
    code = 1 if all(r.error for r in results) else 0
    if as_json:
        print(json.dumps([result_dict(r) for r in results], indent=2), file=out)
        return code
    print(_headline(results), file=out)
    print(markdown_table(HEADER, [_row(r) for r in results]), file=out)
    print(f"\n{LEGEND}", file=out)
    for result in results:
        _print_reasons(result, out)
    return code


def _headline(results: Sequence[DemoResult]) -> str:
    installed = sum(1 for r in results if r.backend != BACKEND)
    tutorial = (
        " and the seed tutorial's my_backend (built by the demo, not installed)"
        if len(results) > installed
        else ""
    )
    return (
        f"Quantizing DemoNet (residual CNN, sigmoid gate) with {installed} installed backend"
        f"{'s' if installed != 1 else ''}{tutorial}: prepare_fx with the backend's default "
        "mapping, calibrate on 32 inputs, convert_fx, compare with the float model.\n"
    )


def _print_reasons(result: DemoResult, out: TextIO) -> None:
    if not result.not_quantized:
        return
    print(f"\n{_label(result)}: not lowered to a kernel, and why", file=out)
    unlowered = [(n, w) for n, code, w in result.not_quantized if code == "no_lowering_kernel"]
    # one line per reason: "no lowering rule for Linear" or "rule qlinear declined: why"
    by_reason: dict[str, list[str]] = {}
    for node, words in unlowered:
        by_reason.setdefault(words.removesuffix("; it stays in reference form"), []).append(node)
    for words, nodes in by_reason.items():
        print(f"  {', '.join(nodes)} (reference form): {words}", file=out)
    # a multi-node chain repeats one sentence per node: print each sentence once
    sentences = (w for _, code, w in result.not_quantized if code != "no_lowering_kernel")
    for words in dict.fromkeys(sentences):
        print(f"  {words}", file=out)
