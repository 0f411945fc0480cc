"""fxquant's ExecuTorch/XNNPACK programs against torchao pt2e + XNNPACKQuantizer, in one process.

Targets (the executorch plugin's issue), per model and batch: fxquant's program
at most 1.10x the latency of the pt2e program in ExecuTorch's runtime; output
SQNR against the float model at least pt2e's; ``.pte`` size at most 1.05x pt2e's;
export time (float model -> ``.pte`` bytes) no worse than pt2e's. Models: a
ResNet-50-like and a MobileNetV2 CNN at 224x224 and a 12-layer BERT-base-like
encoder at 128 tokens, each at batch 1 and 8 (``--quick``: the small versions).

How. The two routes, each from a deep copy of the same float model, calibrated
on the same batch (the case's example inputs, under ``torch.no_grad``):

- fxquant: ``prepare_fx`` with the ``executorch`` backend config and default
  mapping, calibrate, ``convert_fx``, ``fxquant_executorch.to_executorch``; run
  with ``program(*inputs)`` (what users call).
- pt2e (what users run today): ``torch.export`` -> ``prepare_pt2e`` with
  ``XNNPACKQuantizer`` (symmetric, per-channel), calibrate, ``convert_pt2e``,
  ``torch.export``, ``to_edge_transform_and_lower`` with ``XnnpackPartitioner``,
  ``to_executorch``; run with ``Runtime.get().load_program(buffer)``'s
  ``forward`` method, ``execute(list(inputs))``.

Both routes are warmed up once on a tiny CNN (untimed: first-use costs such as
dynamo's initialisation must not fall on whichever side runs first), then
timed once per case, in alternating order from case to case: export time is
wall-clock seconds (``time.perf_counter``) from the float model to the ``.pte``
bytes, calibration included, with the per-stage split and the process's CPU
seconds in the JSON. Latency: ``torch.set_num_threads(1)`` and ExecuTorch's
threadpool at 1 thread (the machine has 2 shared cores); the programs
alternate order round by round in one process after one untimed call each; a
round repeats the call to last ~0.2 s and is timed in CPU seconds of the
process (``time.process_time``, garbage collector paused; robust to other
tenants; wall seconds kept in the JSON); the figure is the median over
``--rounds`` (>= 5) of the per-round ratio fxquant/pt2e (lower is better),
with each side's median ms. A third variant in the same rounds runs fxquant's
``.pte`` exactly as pt2e's is run (``pte`` column): it tells the program apart
from the Python wrapper around it. SQNR is ``10 log10(|f|^2 / |f - q|^2)`` of
the first output against the float eager model's, on the calibration batch
and on four held-out batches of the same shape (seeds 1-4); the target's
figure is the mean of the five (the two programs differ by float rounding
only, so one batch can put either ahead), with the SQNR of fxquant's output
against pt2e's. The JSON also holds
fxquant's delegation report (quantized nodes left outside XNNPACK, with the
reasons), both programs' structure read back from the ``.pte`` (delegate
count, the kernels the portable runtime runs) and a hash of each plugin source
file (the plugin is edited while benchmarks run). A side that fails is
recorded with its error; the run goes on. Prints a table and a targets table,
and writes bench/results/executorch.json (``--quick``: executorch_quick.json; a
run filtered by ``--models``/``--batches``: executorch_partial.json).

    OMP_NUM_THREADS=1 python bench/bench_executorch.py [--rounds 5] [--quick] \
        [--models resnet50,mobilenet_v2,bert_base] [--batches 1,8]
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import gc
import hashlib
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import torch
from models import ROOT, BenchModel, bert_base, mobilenet_v2, resnet_at_depth
from torch import nn

from tests.flow.zoo import bert_inputs

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("resnet50", "mobilenet_v2", "bert_base")
BATCHES = (1, 8)
ROUND_SECONDS = 0.2
LATENCY_MAX = 1.10  # fxquant / pt2e
SIZE_MAX = 1.05  # fxquant / pt2e
EXPORT_MAX = 1.0  # fxquant / pt2e: no worse
HELDOUT_SEEDS = (1, 2, 3, 4)  # held-out batches for the SQNR (seed 0 is the calibration batch)


# --- models and inputs ----------------------------------------------------------------------


def bench_model(name: str, quick: bool) -> BenchModel:
    """The benchmark model ``name`` at batch 1 (the batch is applied by :func:`batch_inputs`)."""
    if name == "resnet50":
        return resnet_at_depth(1, quick=quick)
    if name == "mobilenet_v2":
        return mobilenet_v2(quick=quick)
    return bert_base(quick=quick)


def batch_inputs(
    spec: BenchModel, model: nn.Module, batch: int, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """The model's inputs at ``batch``: images drawn as models.py draws them, BERT's token ids
    and mask as tests/flow/zoo.py's ``bert_inputs`` (1/8 padding). Seed 0 at batch 1 is
    exactly the model's own example inputs (the calibration batch); seed 1 is a held-out
    batch of the same shape (the programs' shapes are static)."""
    first = spec.inputs()
    if batch == first[0].shape[0] and seed == 0:
        return first
    if spec.name == "bert_base":
        length = first[0].shape[1]
        return bert_inputs(model.vocab, seed, batch=batch, length=length, padding=length // 8)
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, *first[0].shape[1:], generator=generator),)


# --- the two routes -------------------------------------------------------------------------


class Stopwatch:
    """Wall seconds of consecutive stages, and the process's CPU seconds over all of them."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self._start = self._last = time.perf_counter()
        self._cpu = time.process_time()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = now - self._last
        self._last = now

    def summary(self) -> dict[str, Any]:
        return {
            "wall_s": self._last - self._start,
            "cpu_s": time.process_time() - self._cpu,
            "stages_s": dict(self.stages),
        }


class RuntimeCall:
    """A ``.pte`` run the way the peer is run: ``Runtime.get().load_program(buffer)``'s
    ``forward``, ``execute(list(inputs))``. It holds the loaded program for its lifetime."""

    def __init__(self, buffer: bytes) -> None:
        from executorch.runtime import Runtime

        self.program = Runtime.get().load_program(buffer)
        self.method = self.program.load_method("forward")

    def __call__(self, *inputs: Any) -> Any:
        return self.method.execute(list(inputs))


@dataclass
class Built:
    """A route's program: ``run(*inputs)`` runs it, its bytes, export timings, and notes."""

    run: Callable[..., Any]
    buffer: bytes
    export: dict[str, Any]
    notes: dict[str, Any] = field(default_factory=dict)


def build_fxquant(model: nn.Module, inputs: tuple[Any, ...]) -> Built:
    """fxquant's route: prepare_fx (executorch backend), calibrate, convert_fx, to_executorch."""
    import fxquant
    import fxquant_executorch

    clock = Stopwatch()
    prepared = fxquant.prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping("executorch"),
        inputs,
        backend_config=fxquant.get_backend_config("executorch"),
    )
    clock.lap("prepare")
    with torch.no_grad():
        prepared(*inputs)
    clock.lap("calibrate")
    converted = fxquant.convert_fx(prepared)
    clock.lap("convert")
    program = fxquant_executorch.to_executorch(converted, inputs)
    clock.lap("to_executorch")
    notes = delegation(program.report)
    notes["to_executorch_export_seconds"] = program.export_seconds
    return Built(program, program.buffer, clock.summary(), notes)


def build_pt2e(model: nn.Module, inputs: tuple[Any, ...]) -> Built:
    """The peer: torch.export, prepare_pt2e with XNNPACKQuantizer (symmetric, per-channel),
    calibrate, convert_pt2e, torch.export, to_edge_transform_and_lower (XNNPACK), to_executorch."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    clock = Stopwatch()
    captured = torch.export.export(model, inputs).module()
    clock.lap("export")
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = prepare_pt2e(captured, XNNPACKQuantizer().set_global(config))
    clock.lap("prepare")
    with torch.no_grad():
        prepared(*inputs)
    clock.lap("calibrate")
    converted = convert_pt2e(prepared)
    clock.lap("convert")
    edge = to_edge_transform_and_lower(
        torch.export.export(converted, inputs), partitioner=[XnnpackPartitioner()]
    )
    clock.lap("lower")
    buffer = edge.to_executorch().buffer
    clock.lap("to_executorch")
    return Built(RuntimeCall(buffer), buffer, clock.summary())


ROUTES: dict[str, Callable[[nn.Module, tuple[Any, ...]], Built]] = {
    "fxquant": build_fxquant,
    "pt2e": build_pt2e,
}


def delegation(report: Any) -> dict[str, Any]:
    """fxquant's delegation report: quantized nodes left outside XNNPACK (and float ones), with
    the partitioner's reasons."""
    statuses: collections.Counter[str] = collections.Counter()
    quantized, floating = [], []
    for entry in report.entries():
        statuses[entry.status] += 1
        if entry.reason is None or entry.reason.code != "not_delegated":
            continue
        (quantized if entry.status == "reference" else floating).append(entry.reason.words)
    return {
        "statuses": dict(statuses),
        "quantized_not_delegated": len(quantized),
        "quantized_not_delegated_reasons": quantized,
        "float_not_delegated_reasons": floating,
    }


def pte_structure(buffer: bytes) -> dict[str, Any]:
    """The program read back from its bytes: delegate calls, the kernels of the portable runtime
    (by name, with their count of calls), and the instruction count."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, KernelCall

    plan = deserialize_pte_binary(buffer).program.execution_plan[0]
    kernels: collections.Counter[str] = collections.Counter()
    delegate_calls = instructions = 0
    for chain in plan.chains:
        for instruction in chain.instructions:
            instructions += 1
            args = instruction.instr_args
            if isinstance(args, DelegateCall):
                delegate_calls += 1
            elif isinstance(args, KernelCall):
                operator = plan.operators[args.op_index]
                kernels[f"{operator.name}.{operator.overload or 'default'}"] += 1
    return {
        "delegates": len(plan.delegates),
        "delegate_calls": delegate_calls,
        "portable_kernels": dict(sorted(kernels.items())),
        "instructions": instructions,
    }


def warm_up_routes() -> None:
    """Both routes once on a tiny CNN, untimed: first-use costs (dynamo, kernel registries,
    the runtime) must not be charged to whichever route a case runs first."""
    torch.manual_seed(0)
    tiny = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)
    )
    inputs = (torch.randn(1, 3, 8, 8),)
    for route in ROUTES.values():
        attempt(lambda route=route: route(copy.deepcopy(tiny).eval(), inputs).run(*inputs))


# --- measuring ------------------------------------------------------------------------------


def attempt(call: Callable[[], Any]) -> Any:
    """The call's result, or the error's one-line description: a failure is a finding."""
    try:
        return call()
    except Exception as error:  # reported in the table and the JSON, not hidden
        traceback.print_exc(file=sys.stderr)
        text = str(error).strip().splitlines()
        return Failure(f"{type(error).__name__}: {text[0][:300] if text else ''}")


@dataclass(frozen=True)
class Failure:
    error: str


def timed(call: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(CPU, wall) seconds per call, garbage collected first and paused while timing."""
    gc.collect()
    gc.disable()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(repeats):
            call()
        return (
            (time.process_time() - cpu) / repeats,
            (time.perf_counter() - wall) / repeats,
        )
    finally:
        gc.enable()


def interleaved(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, Any]:
    """The calls alternating order round by round: each one's median ms, and the median of the
    per-round ratio of each to ``pt2e`` (wall-clock medians and round sizes kept too)."""
    repeats = {}
    for name, call in calls.items():  # untimed warm-up; it also sizes the rounds
        once = timed(call, 1)[0]
        repeats[name] = max(1, min(200, math.ceil(ROUND_SECONDS / max(once, 1e-6))))
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for index in range(rounds):
        for name in order if index % 2 == 0 else order[::-1]:
            seconds, elapsed = timed(calls[name], repeats[name])
            cpu[name].append(seconds)
            wall[name].append(elapsed)
    out: dict[str, Any] = {"repeats": repeats}
    for name in calls:
        out[f"{name}_ms"] = 1e3 * statistics.median(cpu[name])
        out[f"{name}_wall_ms"] = 1e3 * statistics.median(wall[name])
        if name != "pt2e":
            ratios = [a / b for a, b in zip(cpu[name], cpu["pt2e"], strict=True)]
            out[f"{name}_ratios"] = [round(r, 4) for r in ratios]
            out[f"{name}_ratio"] = statistics.median(ratios)
    return out


def first_tensor(value: Any) -> torch.Tensor:
    """The first tensor of an output (a tensor, or ExecuTorch's list of outputs)."""
    while not isinstance(value, torch.Tensor):
        value = value[0]
    return value


def sqnr(reference: torch.Tensor, output: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``output`` against ``reference``, in dB."""
    noise = (reference.float() - output.float()).pow(2).sum().item()
    signal = reference.float().pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


# --- one case -------------------------------------------------------------------------------


def build_both(
    master: nn.Module, inputs: tuple[Any, ...], fxquant_first: bool
) -> dict[str, Built | Failure]:
    """Both programs from fresh deep copies of ``master`` (copies not timed), in the given order;
    a route that fails to build or to run is a :class:`Failure`."""
    built: dict[str, Built | Failure] = {}
    names = list(ROUTES) if fxquant_first else list(ROUTES)[::-1]
    for name in names:
        model = copy.deepcopy(master)
        result = attempt(lambda name=name, model=model: ROUTES[name](model, inputs))
        if isinstance(result, Built):
            ran = attempt(lambda result=result: result.run(*inputs))  # also loads it
            result = Failure(f"forward: {ran.error}") if isinstance(ran, Failure) else result
        built[name] = result
        gc.collect()
    return {name: built[name] for name in ROUTES}


def measure_case(
    label: str,
    master: nn.Module,
    inputs: tuple[Any, ...],
    heldout: list[tuple[Any, ...]],
    rounds: int,
    fxquant_first: bool,
) -> dict[str, Any]:
    """One row: latency, SQNR, size, export time and delegation of both programs."""
    row: dict[str, Any] = {"case": label, "errors": {}}
    built = build_both(master, inputs, fxquant_first)
    for name, result in built.items():
        if isinstance(result, Failure):
            row["errors"][name] = result.error
            continue
        row[f"size_{name}"] = len(result.buffer)
        row[f"export_{name}"] = result.export
        row[f"export_s_{name}"] = result.export["wall_s"]
        row[f"structure_{name}"] = pte_structure(result.buffer)
        row.update({f"{name}_{key}": value for key, value in result.notes.items()})
    fxq, peer = built["fxquant"], built["pt2e"]
    if isinstance(fxq, Built) and isinstance(peer, Built):
        runs = {"fxquant": fxq.run, "pt2e": peer.run}
        row.update(numerics(master, runs, inputs, "_calibration"))
        for index, batch in enumerate(heldout):
            row.update(numerics(master, runs, batch, f"_heldout{index}"))
        # the target's figure: the mean over the calibration batch and the held-out ones (the
        # two programs differ by float rounding only, which one batch cannot tell from noise)
        for name in ("fxquant", "pt2e", "fxquant_vs_pt2e"):
            tags = ["_calibration", *(f"_heldout{i}" for i in range(len(heldout)))]
            row[f"sqnr_{name}"] = statistics.fmean(row[f"sqnr_{name}{tag}"] for tag in tags)
        # fxquant's .pte also run exactly as the peer's is: the program without fxquant's wrapper
        runs = {"fxquant": fxq.run, "fxquant_pte": RuntimeCall(fxq.buffer), "pt2e": peer.run}
        calls = {name: functools.partial(run, *inputs) for name, run in runs.items()}
        with torch.no_grad():
            row.update(interleaved(calls, rounds))
        row["latency_ratio"] = row["fxquant_ratio"]
        row["size_ratio"] = row["size_fxquant"] / row["size_pt2e"]
        row["pte_identical"] = fxq.buffer == peer.buffer
        row["export_ratio"] = row["export_s_fxquant"] / row["export_s_pt2e"]
    row["targets"] = targets(row)
    return row


def numerics(
    master: nn.Module, runs: dict[str, Callable[..., Any]], inputs: tuple[Any, ...], tag: str = ""
) -> dict[str, float]:
    """SQNR of each program against the float model on ``inputs``, and of fxquant's against
    pt2e's (how close the two programs are to each other)."""
    with torch.no_grad():
        reference = first_tensor(master(*inputs))
        outputs = {name: first_tensor(run(*inputs)) for name, run in runs.items()}
    out = {f"sqnr_{name}{tag}": sqnr(reference, output) for name, output in outputs.items()}
    out[f"sqnr_fxquant_vs_pt2e{tag}"] = sqnr(outputs["pt2e"], outputs["fxquant"])
    return out


def targets(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's four targets for a row: figure, target, and whether it is met."""

    def check(metric: str, figure: Any, goal: str, met: Callable[[], bool]) -> dict[str, Any]:
        return {
            "metric": metric,
            "figure": figure,
            "target": goal,
            "met": None if figure is None else bool(met()),
        }

    fxq_db, peer_db = row.get("sqnr_fxquant"), row.get("sqnr_pt2e")
    db_gap = None if fxq_db is None or peer_db is None else fxq_db - peer_db
    return [
        check(
            "latency fxq/pt2e",
            row.get("latency_ratio"),
            f"<= {LATENCY_MAX:.2f}",
            lambda: row["latency_ratio"] <= LATENCY_MAX,
        ),
        check("SQNR fxq-pt2e dB", db_gap, ">= 0", lambda: db_gap >= 0),
        check(
            ".pte size fxq/pt2e",
            row.get("size_ratio"),
            f"<= {SIZE_MAX:.2f}",
            lambda: row["size_ratio"] <= SIZE_MAX,
        ),
        check(
            "export fxq/pt2e",
            row.get("export_ratio"),
            f"<= {EXPORT_MAX:.2f}",
            lambda: row["export_ratio"] <= EXPORT_MAX,
        ),
    ]


def run(models: list[str], batches: list[int], quick: bool, rounds: int) -> list[dict[str, Any]]:
    """Every selected model at every selected batch, one row each; failures become rows. The
    route that exports first alternates from case to case."""
    warm_up_routes()
    rows: list[dict[str, Any]] = []
    for name in models:
        spec = bench_model(name, quick)
        rows += measure_model(spec, batches, rounds, fxquant_first=len(rows) % 2 == 0)
        gc.collect()
    return rows


def measure_model(
    spec: BenchModel, batches: list[int], rounds: int, fxquant_first: bool
) -> list[dict[str, Any]]:
    """The rows of one model, one per batch."""
    master = spec.build()
    rows = []
    for batch in batches:
        label = f"{spec.name} b{batch}"
        inputs = batch_inputs(spec, master, batch)
        heldout = [batch_inputs(spec, master, batch, seed=seed) for seed in HELDOUT_SEEDS]
        row = attempt(
            lambda label=label, inputs=inputs, heldout=heldout, first=fxquant_first: measure_case(
                label, master, inputs, heldout, rounds, first
            )
        )
        if isinstance(row, Failure):
            row = {"case": label, "errors": {"all": row.error}, "targets": []}
        rows.append(row)
        fxquant_first = not fxquant_first
        print(f"  measured {label}", file=sys.stderr, flush=True)
    return rows


# --- report ---------------------------------------------------------------------------------


def plugin_sources() -> dict[str, str]:
    """sha256 of each source file of the plugin under test (it is edited while benchmarks run:
    the figures belong to these exact files)."""
    import fxquant_executorch

    folder = Path(fxquant_executorch.__file__).parent
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        for path in sorted(folder.glob("*.py"))
    }


def machine() -> dict[str, Any]:
    """The machine, threads and versions the figures were taken with."""
    from executorch.extension.pybindings import portable_lib

    return harness.machine(
        ("fxquant", "fxquant-executorch", "executorch", "torchao"),
        cores=os.cpu_count(),
        executorch_threads=portable_lib._threadpool_get_thread_count(),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
    )


def cell(row: dict[str, Any], key: str, spec: str, scale: float = 1.0) -> str:
    """``row[key] * scale`` formatted with ``spec``, or "-" right-aligned to the same width."""
    value = row.get(key)
    width = f">{spec.split('.')[0]}"
    if value is None:
        return format("-", width)
    return format(value if scale == 1.0 else value * scale, spec)


def print_table(rows: list[dict[str, Any]], info: dict[str, Any], rounds: int) -> None:
    print(
        f"# {info['cpu']}, {info['cores']} cores; torch {info['threads']} thread, "
        f"ExecuTorch {info['executorch_threads']} thread; torch {info['torch']}, "
        f"executorch {info['versions'].get('executorch')}, "
        f"torchao {info['versions'].get('torchao')}"
    )
    print(
        f"# latency: CPU ms per call, median of {rounds} interleaved rounds (fxq: program(*x); "
        "pte: fxquant's .pte run as pt2e's is); export: wall s; q !dlg: quantized nodes not "
        "delegated"
    )
    print(
        f"{'case':<16} {'fxq ms':>8} {'pte ms':>8} {'pt2e ms':>8} {'ratio':>6} {'pte r':>6} "
        f"{'dB fxq':>6} {'dB pt2e':>7} {'MB fxq':>7} {'MB pt2e':>7} {'ratio':>6} "
        f"{'exp fxq':>7} {'exp pt2e':>8} {'ratio':>6} {'q !dlg':>6}"
    )
    for r in rows:
        if "all" in r["errors"]:
            print(f"{r['case']:<16} FAILED: {r['errors']['all'][:110]}")
            continue
        print(
            f"{r['case']:<16} {cell(r, 'fxquant_ms', '8.2f')} {cell(r, 'fxquant_pte_ms', '8.2f')} "
            f"{cell(r, 'pt2e_ms', '8.2f')} {cell(r, 'latency_ratio', '6.3f')} "
            f"{cell(r, 'fxquant_pte_ratio', '6.3f')} {cell(r, 'sqnr_fxquant', '6.1f')} "
            f"{cell(r, 'sqnr_pt2e', '7.1f')} {cell(r, 'size_fxquant', '7.2f', 1e-6)} "
            f"{cell(r, 'size_pt2e', '7.2f', 1e-6)} {cell(r, 'size_ratio', '6.3f')} "
            f"{cell(r, 'export_s_fxquant', '7.1f')} {cell(r, 'export_s_pt2e', '8.1f')} "
            f"{cell(r, 'export_ratio', '6.2f')} "
            f"{cell(r, 'fxquant_quantized_not_delegated', '6d')}"
        )
        for note in notes(r):
            print(f"{'':<17}{note}")


def notes(row: dict[str, Any]) -> list[str]:
    """Errors, the programs' structure and export stages, and the quantized nodes XNNPACK did
    not take."""
    lines = [f"{name} failed: {error[:110]}" for name, error in row["errors"].items()]
    if row.get("pte_identical"):
        lines.append("the two .pte programs are byte-identical")
    if "sqnr_fxquant_calibration" in row:
        per_batch = ", ".join(
            f"{row[f'sqnr_fxquant{tag}']:.2f}/{row[f'sqnr_pt2e{tag}']:.2f}"
            for tag in ("_calibration", *(f"_heldout{i}" for i in range(len(HELDOUT_SEEDS))))
        )
        lines.append(
            f"SQNR fxq/pt2e dB per batch (calibration, held-out): {per_batch}; fxq against "
            f"pt2e: {row['sqnr_fxquant_vs_pt2e']:.1f} dB"
        )
    for name in ROUTES:
        structure = row.get(f"structure_{name}")
        if structure:
            kernels = ", ".join(f"{k} x{n}" for k, n in structure["portable_kernels"].items())
            lines.append(
                f"{name}: {structure['delegates']} XNNPACK delegates; portable: {kernels or '-'}"
            )
    for name in ROUTES:
        export = row.get(f"export_{name}")
        if export:
            stages = ", ".join(f"{k} {v:.1f}" for k, v in export["stages_s"].items())
            lines.append(f"{name} export s: {stages}")
    lines += [
        f"not delegated: {words[:110]}"
        for words in row.get("fxquant_quantized_not_delegated_reasons", [])
    ]
    return lines


def print_targets(rows: list[dict[str, Any]]) -> None:
    print()
    print(f"{'case':<16} {'metric':<20} {'figure':>8} {'target':<8} met")  # the issue's targets
    for r in rows:
        for t in r["targets"]:
            figure = "-" if t["figure"] is None else f"{t['figure']:8.4f}"
            met = {True: "yes", False: "NO", None: "-"}[t["met"]]
            print(f"{r['case']:<16} {t['metric']:<20} {figure:>8} {t['target']:<8} {met}")


def parse_list(parser: argparse.ArgumentParser, text: str, flag: str) -> list[str]:
    """The comma-separated items of ``text``; an empty list is an error."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        parser.error(f"{flag}: empty")
    return items


def quiet_runtime() -> None:
    """One thread everywhere: torch's intra-op pool and ExecuTorch's threadpool."""
    from executorch.extension.pybindings import portable_lib

    torch.set_num_threads(1)
    # private API (the only way in ExecuTorch 1.5.1's bindings to size XNNPACK's threadpool)
    portable_lib._unsafe_reset_threadpool(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 5)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: small models, 2 rounds (not comparable)"
    )
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument(
        "--batches", default=",".join(map(str, BATCHES)), help="comma-separated batch sizes"
    )
    args = parser.parse_args()
    models = parse_list(parser, args.models, "--models")
    if set(models) - set(MODELS):
        parser.error(f"--models: unknown {args.models!r}; choose from {','.join(MODELS)}")
    batches_text = parse_list(parser, args.batches, "--batches")
    if not all(b.isdigit() and int(b) > 0 for b in batches_text):
        parser.error(f"--batches: {args.batches!r} is not a list of positive integers")
    batches = [int(b) for b in batches_text]
    rounds = 2 if args.quick else max(5, args.rounds)
    warnings.simplefilter("ignore")  # export and pt2e warn at length; nothing measured here
    quiet_runtime()
    torch.manual_seed(0)
    sources = plugin_sources()
    rows = run(models, batches, args.quick, rounds)
    info = machine()
    info["fxquant_executorch_sources"] = sources
    if plugin_sources() != sources:  # modules are imported once: the run used the first ones
        info["sources_changed_during_run"] = True
        print("# warning: the plugin's sources changed during the run", file=sys.stderr)
    print_table(rows, info, rounds)
    print_targets(rows)
    # a quick or filtered run must not overwrite the full table
    partial = set(models) != set(MODELS) or set(batches) != set(BATCHES)
    stem = "executorch_quick" if args.quick else "executorch_partial" if partial else "executorch"
    path = RESULTS / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "rounds": rounds,
        "quick": args.quick,
        "models": models,
        "batches": batches,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "root": str(ROOT),
        "machine": info,
        "results": rows,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
