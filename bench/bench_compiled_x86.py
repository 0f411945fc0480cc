"""fxquant's compiled x86 deployment against torchao pt2e + torch.compile, in one process (#19).

Targets (issue 19, one thread, batch 1 and 8): fxquant compiled (x86's
default mapping, ``convert_to_reference_fx``, the ``x86`` deployment: inductor
with freezing) against torchao's pt2e flow with ``X86InductorQuantizer`` and its
default config (``torch.export``, ``prepare_pt2e``, calibration,
``convert_pt2e``, ``torch.compile`` with ``freezing`` on): latency at most 0.90x
pt2e's on the BERT-base-like encoder and transformers' ``BertModel``
(``hf_bert``), at most 1.0x on the ResNet-50-like and MobileNetV2-like CNNs;
output SQNR against float at least pt2e's; cold compile time at most pt2e's.

How: ``torch.set_num_threads(1)``; inductor's caches off (``TORCHINDUCTOR_FX_GRAPH_CACHE=0``,
``TORCHINDUCTOR_AUTOGRAD_CACHE=0``) and each side compiled in a fresh cache
directory (``torch._inductor.utils.fresh_cache``: C++ kernels too) so every
compile is cold. Both sides calibrate on the same batch (the example inputs).
"compile s" is the wall time of each side's first call (dynamo + inductor, C++
compiles included), after one untimed warm-up compile of a tiny model in the
process; "flow s" the quantization before it (fxquant: prepare, calibrate, convert; pt2e: export,
prepare, calibrate, convert). Latency: per-call CPU time of the process
(``time.process_time``), the two compiled models alternating in each of
``--rounds`` (>= 5) rounds after a warm call, each round repeating a call for
~0.2 s; "fxq/pt2e" is the median of the per-round ratios (below 1: fxquant
faster). SQNR: ``10 log10(|float|^2 / |float - int8|^2)`` of the output. Each row
also records the oneDNN int8 kernels in each side's generated code and the top ops
of ``torch.profiler`` (self CPU ms per call; 4 rounds of 5 calls a side, the sides
alternating): the profile behind a miss.
A side that fails is recorded with its error; the run goes on.

    python bench/bench_compiled_x86.py [--rounds 5] [--quick] [--models bert_base,mobilenet_v2]
        [--batches 1,8] [--output compiled_x86.json]

``--quick``: the small models of bench/models.py (BERT hidden 192 at 32 tokens,
MobileNetV2 width 0.25 and ResNet-50 width 16 at 64x64), written to compiled_x86_quick.json.
"""

from __future__ import annotations

import os

# every compile cold: set before torch loads inductor
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import argparse
import copy
import gc
import json
import logging
import re
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import fxquant
import harness
import torch
from models import BenchModel, bert_base, hf_bert, main_output, mobilenet_v2, resnet_at_depth
from torch._inductor.utils import fresh_cache

RESULTS = Path(__file__).resolve().parent / "results"


def _bottleneck_one_relu_per_call(block: Any, x: torch.Tensor) -> torch.Tensor:
    """The zoo's ``Bottleneck.forward`` with one ReLU module per call (the same function).

    The zoo's block calls its one ``self.relu`` three times; torchao's
    ``X86InductorQuantizer`` groups the calls of one module into one source
    partition and raises ``ValueError: Input partition has more than one output
    node`` on it. With a module per call pt2e quantizes the model; fxquant gets the
    same model, so both sides compile the same network.
    """
    out = block.relu(block.bn1(block.conv1(x)))
    out = block.relu2(block.bn2(block.conv2(out)))
    out = block.bn3(block.conv3(out))
    identity = x if block.downsample is None else block.downsample(x)
    return block.relu3(out + identity)


def resnet50(*, quick: bool, batch: int) -> BenchModel:
    """ResNet-50-like (bench/models.py), each bottleneck's ReLU calls separate modules."""
    spec = resnet_at_depth(1, quick=quick, batch=batch)

    def build() -> torch.nn.Module:
        model = spec.build()
        for module in model.modules():
            if type(module).__name__ == "Bottleneck":
                module.relu2 = copy.deepcopy(module.relu)
                module.relu3 = copy.deepcopy(module.relu)
                module.forward = _bottleneck_one_relu_per_call.__get__(module)
        return model

    return BenchModel(spec.name, build, spec.inputs)


BUILDERS: dict[str, Callable[..., BenchModel]] = {
    "bert_base": bert_base,
    "hf_bert": hf_bert,
    "mobilenet_v2": mobilenet_v2,
    "resnet50": resnet50,
}
TARGETS = {"bert_base": 0.90, "hf_bert": 0.90, "mobilenet_v2": 1.0, "resnet50": 1.0}


def sqnr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    noise = (expected - actual).float().pow(2).sum()
    return float(10 * torch.log10(expected.float().pow(2).sum() / noise.clamp_min(1e-30)))


def fxquant_compiled(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    calibration: list[tuple[Any, ...]] | None = None,
) -> tuple[Callable[..., Any], float, float]:
    """fxquant's x86 defaults, the reference model, the x86 deployment; (run, flow s, compile s).

    Calibrated on ``calibration`` (default: the example ``inputs`` alone)."""
    start = time.perf_counter()
    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, inputs, backend_config=config)
    with torch.no_grad():
        for batch in calibration or [inputs]:
            prepared(*batch)
    reference = fxquant.convert_to_reference_fx(prepared)
    flow = time.perf_counter() - start
    deployment = fxquant.registry.get_deployment("x86")
    assert deployment is not None, "fxquant-x86 has no deployment: install plugins/x86"
    compiled: Any = deployment.deploy(reference, inputs)
    print(f"    fxquant: {compiled!r}", flush=True)
    return compiled, flow, compiled.compile_seconds


def pt2e_compiled(
    model: torch.nn.Module,
    inputs: tuple[Any, ...],
    calibration: list[tuple[Any, ...]] | None = None,
) -> tuple[Callable[..., Any], float, float]:
    """torchao pt2e, X86InductorQuantizer's default config, torch.compile with freezing."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    start = time.perf_counter()
    exported = torch.export.export(copy.deepcopy(model), inputs).module()
    quantizer = xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config()
    )
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    with torch.no_grad():
        for batch in calibration or [inputs]:
            prepared(*batch)
    converted = convert_pt2e(prepared)
    flow = time.perf_counter() - start
    compiled = torch.compile(converted)

    def run(*args: Any) -> Any:
        # freezing for pt2e's compile too, scoped the same way as fxquant's
        with torch._inductor.config.patch(freezing=True), torch.no_grad():
            return compiled(*args)

    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    start = time.perf_counter()
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        run(*inputs)
    seconds = time.perf_counter() - start
    run.kernels = int8_kernels("\n".join(codes))  # type: ignore[attr-defined]
    run.code = "\n".join(codes)  # type: ignore[attr-defined]
    return run, flow, seconds


def top_ops(run: Callable[[], Any], calls: int = 5, count: int = 8) -> list[list[Any]]:
    """The ``count`` ops of most self CPU time over ``calls`` calls: [name, ms per call]."""
    return interleaved_top_ops({"run": run}, calls, 1, count)["run"]


def interleaved_top_ops(
    runs: dict[str, Callable[[], Any]], calls: int = 5, rounds: int = 4, count: int = 8
) -> dict[str, list[list[Any]]]:
    """Per side, the ``count`` ops of most self CPU time, ms per call: ``rounds`` rounds of
    ``calls`` profiled calls each, the sides alternating which goes first (on a shared
    machine a load change then reaches every side alike)."""
    from torch.profiler import ProfilerActivity, profile

    totals: dict[str, dict[str, float]] = {name: {} for name in runs}
    names = list(runs)
    for run in runs.values():
        run()
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(calls):
                    runs[name]()
            for event in prof.key_averages():
                ms = event.self_cpu_time_total / 1e3 / calls / rounds
                totals[name][event.key] = totals[name].get(event.key, 0.0) + ms
    return {
        name: [[op, round(ms, 3)] for op, ms in sorted(ops.items(), key=lambda i: -i[1])[:count]]
        for name, ops in totals.items()
    }


def int8_kernels(code: str) -> dict[str, int]:
    """oneDNN int8 linear/conv calls in inductor's generated code, by op."""
    found: dict[str, int] = {}
    for name in re.findall(r"torch\.ops\.onednn\.(qlinear_pointwise|qconv\w*_pointwise)\b", code):
        found[name] = found.get(name, 0) + 1
    return found


def _seconds(run: Callable[[], Any], repeat: int) -> float:
    gc.disable()
    try:
        start = time.process_time()
        for _ in range(repeat):
            run()
        return (time.process_time() - start) / repeat
    finally:
        gc.enable()


def interleaved(
    first: Callable[[], Any], second: Callable[[], Any], rounds: int
) -> tuple[float, float, float]:
    """Medians of each side's per-call seconds and of the per-round ratios first/second."""
    first(), second()
    probe = max(_seconds(first, 1), _seconds(second, 1), 1e-4)
    repeat = max(1, int(0.2 / probe))
    pairs = []
    for index in range(rounds):
        if index % 2:
            b, a = _seconds(second, repeat), _seconds(first, repeat)
        else:
            a, b = _seconds(first, repeat), _seconds(second, repeat)
        pairs.append((a, b))
    ratio = statistics.median(a / b for a, b in pairs)
    return statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs), ratio


def warm_up() -> float:
    """One small compile before any timed one: the first freezing compile of a process also
    registers inductor's int8 patterns, starts its compile workers and loads its C++
    toolchain (with the cache off, nothing of the models is compiled ahead). Without it
    the side compiled first pays that (tens of seconds here)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    start = time.perf_counter()
    fxquant_compiled(model, (x,))
    return time.perf_counter() - start


def bench_one(
    name: str, batch: int, quick: bool, rounds: int, profile: bool = True
) -> dict[str, Any]:
    spec = BUILDERS[name](quick=quick, batch=batch)
    model, inputs = spec.build().eval(), spec.inputs()
    row: dict[str, Any] = {"model": name, "batch": batch, "target": TARGETS[name], "errors": {}}
    with torch.no_grad():
        expected = main_output(model(*inputs))
    runs: dict[str, Callable[..., Any]] = {}
    for side, build in (("fxquant", fxquant_compiled), ("pt2e", pt2e_compiled)):
        try:
            # a fresh cache directory and empty in-memory code caches per side: the C++
            # kernels the two sides share would otherwise compile once, for the first side
            # (and two processes writing one .so to the default directory race: "file too short")
            with fresh_cache():
                run, flow, compile_s = build(model, inputs)
            with torch.no_grad():
                row[f"sqnr_{side}"] = round(sqnr(expected, main_output(run(*inputs))), 2)
            row[f"flow_s_{side}"] = round(flow, 2)
            row[f"compile_s_{side}"] = round(compile_s, 2)
            row[f"kernels_{side}"] = dict(getattr(run, "kernels", {}))
            runs[side] = run
        except Exception as error:  # a failing side is a row with its error
            row["errors"][side] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    if len(runs) == 2:
        fxq, pt2e = runs["fxquant"], runs["pt2e"]
        a, b, ratio = interleaved(lambda: fxq(*inputs), lambda: pt2e(*inputs), rounds)
        row.update(
            fxquant_ms=round(a * 1e3, 3), pt2e_ms=round(b * 1e3, 3), fxq_over_pt2e=round(ratio, 3)
        )
        if profile:  # where each side's time goes: the profile behind a miss
            sides = {"fxquant": lambda: fxq(*inputs), "pt2e": lambda: pt2e(*inputs)}
            for side, ops in interleaved_top_ops(sides).items():
                row[f"profile_{side}"] = ops
        row["ok"] = bool(
            ratio <= TARGETS[name]
            and row["sqnr_fxquant"] >= row["sqnr_pt2e"]
            and row["compile_s_fxquant"] <= row["compile_s_pt2e"]
        )
    return row


def print_rows(rows: list[dict[str, Any]]) -> None:
    header = (
        "model", "batch", "fxq ms", "pt2e ms", "fxq/pt2e", "target", "SQNR fxq", "SQNR pt2e",
        "compile fxq s", "compile pt2e s", "met",
    )  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for r in rows:
        cells = [
            r["model"], r["batch"], r.get("fxquant_ms"), r.get("pt2e_ms"), r.get("fxq_over_pt2e"),
            f"<= {r['target']}", r.get("sqnr_fxquant"), r.get("sqnr_pt2e"),
            r.get("compile_s_fxquant"), r.get("compile_s_pt2e"),
            "yes" if r.get("ok") else ("**no**" if "ok" in r else "error"),
        ]  # fmt: skip
        print("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
        for side, error in r["errors"].items():
            print(f"    {r['model']} b{r['batch']} {side}: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 5)")
    parser.add_argument("--quick", action="store_true", help="small models (a smoke run)")
    parser.add_argument("--models", default=",".join(BUILDERS), help="comma-separated")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--output", default=None, help="file name under bench/results/")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # torchao's start-up chatter (missing CUDA kernels, pytree enum registration) and
    # torch's deprecation warnings of its own imports: not the benchmark's output
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    logging.getLogger("torchao").setLevel(logging.ERROR)
    RESULTS.mkdir(exist_ok=True)
    stem = "compiled_x86_quick" if args.quick else "compiled_x86"
    path = RESULTS / (args.output or f"{stem}.json")
    info = harness.machine(("fxquant", "torchao", "fxquant-x86"), quick=args.quick)
    print(f"warm-up compile: {warm_up():.1f} s", flush=True)
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            print(f"{name} b{batch} ...", flush=True)
            rows.append(bench_one(name, batch, args.quick, max(5, args.rounds)))
            print_rows(rows[-1:])
            # after every row: a run stopped half-way (compiles take minutes) keeps what it measured
            path.write_text(json.dumps({"machine": info, "results": rows}, indent=2) + "\n")
    print_rows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
