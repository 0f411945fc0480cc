"""Every precision an x86 user can pick, in one process: int8 against bf16 + compile (#31).

Same-run columns per row (one thread, the sides interleaved round by round):

    fp32_eager      the float model
    fp32_compile    ``torch.compile(model)``
    bf16_compile    ``torch.compile(model.bfloat16())``, float inputs in bfloat16
    pt2e_cppw       torchao pt2e, ``X86InductorQuantizer`` default config (``reduce_range``
                    without VNNI), ``torch.compile`` with freezing and inductor's C++ wrapper
    pt2e_pyw        the same with inductor's default (Python) wrapper
    fxq_compiled    fxquant's x86 deployment (``get_deployment("x86")``) of the reference model
                    (on a CPU with bf16 arithmetic x86's default runs attention blocks in
                    bfloat16: its ``attention_bf16`` graph mode)
    fxq_fp32_attn   the same with the attention float32 (prepared under ``FXQUANT_X86_BF16=0``,
                    as on a CPU without bf16 arithmetic)
    fxq_attn_bf16   the same, prepared with ``attention_bf16_qconfig_mapping(model)``: the
                    attention blocks in bfloat16 (one bf16 flash-attention kernel each),
                    the rest as the default
    fxq_bf16        the same with ``float_dtype=torch.bfloat16``: the float parts between
                    the quantize steps in bfloat16 (the default is float32)
    fxq_compiled_pyw, fxq_bf16_pyw   the two above with inductor's Python wrapper and its
                    kernel profiling (for ``--profile``; not in the default columns)
    fxq_eager       fxquant's ``convert_fx`` model (oneDNN int8 kernels, eager)
    fxq_eager_attn_bf16   the same, prepared with ``attention_bf16_qconfig_mapping(model)``
    fxq_eager_fp32_attn   the same, prepared under ``FXQUANT_X86_BF16=0`` (attention float32)

Targets (issue 31, on a CPU with AMX-BF16 or AVX512-BF16): fxq_compiled at most 0.67x
bf16_compile's latency on the BERT-base-like encoder and 0.80x on MobileNetV2 and
ResNet-50 (b1, b8), at most pt2e_cppw's; SQNR at least pt2e's, 35 dB on BERT. On a CPU
without bf16 acceleration: fxq_compiled at most 0.5x fp32_compile.

``--isa-cap avx512_vnni`` / ``avx2`` emulates such a CPU on this one (bench/isa_cap.py: the
run goes on in a child process with oneDNN, ATen, inductor and MKL capped to that ISA);
its table starts with the kernels a probe saw run under
the cap (oneDNN's ``ONEDNN_VERBOSE``, MKL's) and fxquant's bfloat16 and VNNI answers.
Where fxquant sees no bfloat16 arithmetic (``fxquant_x86.precision.bf16_accelerated``: a
CPU without AMX-BF16 / AVX512-BF16, or a cap), the default columns are fp32_eager,
fp32_compile, pt2e_cppw and fxq_compiled, with ratios "x fp32c" and the 0.5x target.

How: ``torch.set_num_threads(1)``; each side's first call compiles (inductor's caches stay
on: set ``TORCHINDUCTOR_CACHE_DIR`` to keep them between runs, so "compile s" is a cold
figure only in a fresh cache directory). Latency: per-call CPU time
(``time.process_time``), ``--rounds`` (>= 5) rounds, each calling every side for ~0.2 s,
the order rotated each round; per side the median of its per-call times and of its
per-round ratio to bf16_compile (the "x bf16c" columns; below 1: faster). SQNR:
``10 log10(|float|^2 / |float - side|^2)`` of the output against the fp32 eager model's.
Each table prints the CPU's ISA flags and the load average before and after the row.
``--profile``: where the named sides spend their time (``torch.profiler``, self CPU ms
per call by op kind, the sides interleaved); the C++ wrapper runs its kernels outside the
profiler, so profile ``fxq_compiled_pyw`` / ``fxq_bf16_pyw`` (Python wrapper, kernel
profiling on) for fxquant's per-op split. A side that fails is recorded with its error;
the run goes on.

    python bench/bench_x86_precisions.py [--quick] [--models bert_base,mobilenet_v2,resnet50]
        [--batches 1,8] [--rounds 5] [--sides ...] [--profile fxq_compiled,bf16_compile]
        [--output x86_precisions.json] [--isa-cap avx512_vnni|avx2]

``--quick``: the small models of bench/models.py (BERT hidden 192 at 32 tokens,
MobileNetV2 width 0.25 and ResNet-50 width 16 at 64x64).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_compiled_x86 as compiled_bench
import fxquant
import harness
import isa_cap
import torch
from fxquant_x86.precision import bf16_accelerated
from models import main_output

RESULTS = Path(__file__).resolve().parent / "results"
SIDES = (
    "fp32_eager",
    "fp32_compile",
    "bf16_compile",
    "pt2e_cppw",
    "pt2e_pyw",
    "fxq_compiled",
    "fxq_fp32_attn",
    "fxq_attn_bf16",
    "fxq_bf16",
    "fxq_eager",
    "fxq_eager_attn_bf16",
    "fxq_eager_fp32_attn",
)
TARGETS = {"bert_base": 0.67, "hf_bert": 0.67, "mobilenet_v2": 0.80, "resnet50": 0.80}
NO_BF16_SIDES = ("fp32_eager", "fp32_compile", "pt2e_cppw", "fxq_compiled")
NO_BF16_TARGET = 0.5  # x fp32_compile: "at least 2x fp32 torch.compile" without bfloat16
BASELINES = {"bf16_compile": "bf16c", "fp32_compile": "fp32c"}


def _quantized(model: torch.nn.Module, inputs: tuple[Any, ...], side: str) -> Any:
    """``side``'s prepared model: ``attn_bf16`` in its name, the explicit attention mapping;
    ``fp32_attn``, the default with the bf16 graph mode off (``FXQUANT_X86_BF16=0``)."""
    from fxquant_x86.precision import BF16_ENV
    from fxquant_x86.qconfig import attention_bf16_qconfig_mapping

    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    if "attn_bf16" in side:
        mapping = attention_bf16_qconfig_mapping(model)
    before = os.environ.pop(BF16_ENV, None)
    if "fp32_attn" in side:
        os.environ[BF16_ENV] = "0"
    try:
        prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, inputs, backend_config=config)
    finally:
        os.environ.pop(BF16_ENV, None)
        if before is not None:
            os.environ[BF16_ENV] = before
    with torch.no_grad():
        prepared(*inputs)
    return prepared


def _bf16(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        x.bfloat16() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs
    )


def _no_grad(run: Callable[..., Any], **patch: Any) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        with torch._inductor.config.patch(patch), torch.no_grad():
            return run(*args)

    return call


def build_side(side: str, model: torch.nn.Module, inputs: tuple[Any, ...]) -> Callable[[], Any]:
    """``side``'s model, compiled by its first call; returns a call on the row's inputs."""
    if side == "fp32_eager":
        run, args = _no_grad(model), inputs
    elif side == "fp32_compile":
        run, args = _no_grad(torch.compile(copy.deepcopy(model))), inputs
    elif side == "bf16_compile":
        run, args = _no_grad(torch.compile(copy.deepcopy(model).bfloat16())), _bf16(inputs)
    elif side.startswith("pt2e"):
        run, args = _pt2e(model, inputs, cpp_wrapper=side == "pt2e_cppw"), inputs
    elif side.startswith(("fxq_compiled", "fxq_bf16", "fxq_attn_bf16", "fxq_fp32_attn")):
        run, args = _fxquant_compiled(side, model, inputs), inputs
    elif side.startswith("fxq_eager"):
        prepared = _quantized(model, inputs, side)
        run, args = _no_grad(fxquant.convert_fx(prepared)), inputs
    else:
        msg = f"side {side!r} is not one of {', '.join(SIDES)}"
        raise ValueError(msg)
    return lambda: run(*args)


def _fxquant_compiled(side: str, model: torch.nn.Module, inputs: tuple[Any, ...]) -> Any:
    """fxquant's x86 deployment; ``fxq_bf16``: float parts in bfloat16; ``_pyw`` suffix: the
    Python wrapper with inductor's kernel profiling on (each oneDNN op and fused C++ loop
    is then a ``torch.profiler`` event: the per-op profile the C++ wrapper hides)."""
    from fxquant_x86.compiled import compile_quantized

    reference = fxquant.convert_to_reference_fx(_quantized(model, inputs, side))
    options: dict[str, Any] = {}
    if side.startswith("fxq_bf16"):
        options["float_dtype"] = torch.bfloat16
    profiled = side.endswith("_pyw")
    with torch._inductor.config.patch({"cpp.enable_kernel_profile": profiled}):
        run = compile_quantized(reference, inputs, cpp_wrapper=not profiled, **options)
    print(f"    {side}: {run!r}, float parts {run.float_dtype}", flush=True)
    return run


def op_kind(name: str) -> str:
    """The kind of a profiled op: an int8 GEMM/conv, attention, a fused C++ loop by what it
    fuses (LayerNorm, softmax, GELU, quantize steps, adds), a float GEMM, or other."""
    kinds = (
        ("qlinear", "int8 linear"),
        ("qconv", "int8 conv"),
        ("scaled_dot_product", "attention (SDPA)"),
        ("addmm", "float GEMM"),
        ("aten::mm", "float GEMM"),
        ("bmm", "float GEMM"),
        ("linear", "float GEMM"),
        ("convolution", "float conv"),
        ("layer_norm", "LayerNorm loops"),
        ("softmax", "softmax loops"),
        ("gelu", "GELU loops"),
        ("quantize", "q/dq loops"),
        ("add", "add loops"),
        ("cpp_fused", "other fused loops"),
        ("CompiledFxGraph", "compiled graph (wrapper + loops)"),
        ("Dynamo", "dynamo guards"),
    )
    return next((kind for key, kind in kinds if key in name), "other")


def profile_by_kind(ops: list[list[Any]]) -> list[list[Any]]:
    """Self CPU ms per call summed by :func:`op_kind`, largest first."""
    kinds: dict[str, float] = {}
    for name, ms in ops:
        kinds[op_kind(name)] = kinds.get(op_kind(name), 0.0) + ms
    return [[k, round(v, 3)] for k, v in sorted(kinds.items(), key=lambda i: -i[1])]


def _pt2e(
    model: torch.nn.Module, inputs: tuple[Any, ...], *, cpp_wrapper: bool
) -> Callable[..., Any]:
    """torchao pt2e with X86InductorQuantizer's defaults, compiled with freezing and the C++
    wrapper or inductor's default Python one (the bench_compiled_x86 flow). Without VNNI
    (fxquant's answer, ``FXQUANT_CPU_VNNI``) with ``reduce_range``, as torchao advises there:
    oneDNN's AVX2 int8 kernels saturate u8 x s8 pairs in int16 on full-range activations."""
    from fxquant.lowering.kernels import cpu
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    exported = torch.export.export(copy.deepcopy(model), inputs).module()
    quantizer = xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config(reduce_range=not cpu.has_vnni())
    )
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    with torch.no_grad():
        prepared(*inputs)
    return _no_grad(torch.compile(convert_pt2e(prepared)), freezing=True, cpp_wrapper=cpp_wrapper)


def _seconds(run: Callable[[], Any], repeat: int) -> float:
    start = time.process_time()
    for _ in range(repeat):
        run()
    return (time.process_time() - start) / repeat


def interleaved(runs: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Per side, its per-call seconds in each round; every round calls each side for ~0.2 s,
    the order rotated by one each round (a load change reaches every side alike)."""
    names = list(runs)
    repeat = {}
    for name in names:
        runs[name]()
        repeat[name] = max(1, int(0.2 / max(_seconds(runs[name], 1), 1e-4)))
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(_seconds(runs[name], repeat[name]))
    return times


def bench_row(name: str, batch: int, args: argparse.Namespace, sides: list[str]) -> dict[str, Any]:
    spec = compiled_bench.BUILDERS[name](quick=args.quick, batch=batch)
    model, inputs = spec.build().eval(), spec.inputs()
    target = TARGETS[name] if bf16_accelerated() else NO_BF16_TARGET
    row: dict[str, Any] = {"model": name, "batch": batch, "target": target}
    row["load_before"], row["errors"] = harness.load(), {}
    with torch.no_grad():
        expected = main_output(model(*inputs))
    runs: dict[str, Callable[[], Any]] = {}
    for side in sides:
        try:
            start = time.perf_counter()
            run = build_side(side, model, inputs)
            output = main_output(run()).float()
            row[f"compile_s_{side}"] = round(time.perf_counter() - start, 1)
            row[f"sqnr_{side}"] = round(compiled_bench.sqnr(expected, output), 2)
            runs[side] = run
        except Exception as error:  # a failing side is a row with its error
            row["errors"][side] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        print(f"    {side}: {row.get(f'compile_s_{side}', 'failed')} s", flush=True)
    times = interleaved(runs, max(5, args.rounds))
    # every round's figures: any two sides' per-round ratio (fxquant / pt2e) can be read back
    row["rounds_ms"] = {side: [round(t * 1e3, 3) for t in ts] for side, ts in times.items()}
    for side, seconds in times.items():
        row[f"ms_{side}"] = round(statistics.median(seconds) * 1e3, 3)
        for base, short in ((b, s) for b, s in BASELINES.items() if b in times):
            ratios = [a / b for a, b in zip(seconds, times[base], strict=True)]
            row[f"x_{short}_{side}"] = round(statistics.median(ratios), 3)
    if args.profile:
        chosen = {side: runs[side] for side in args.profile.split(",") if side in runs}
        for side, ops in compiled_bench.interleaved_top_ops(chosen, count=400).items():
            row[f"profile_{side}"] = profile_by_kind(ops)
    row["load_after"] = harness.load()
    return row


def print_rows(rows: list[dict[str, Any]], sides: list[str], probe: str) -> None:
    print(
        "ISA: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in harness.isa_flags().items())
    )
    print(probe)
    base = next((short for b, short in BASELINES.items() if b in sides), "bf16c")
    header = ["model", "batch", *(f"{s} ms (x {base}, dB)" for s in sides), "target", "load"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for r in rows:
        cells = [r["model"], r["batch"]]
        for side in sides:
            if f"ms_{side}" not in r:
                cells.append("error" if side in r["errors"] else "-")
                continue
            cells.append(f"{r[f'ms_{side}']} ({r.get(f'x_{base}_{side}')}x, {r[f'sqnr_{side}']})")
        cells += [f"<= {r['target']}x {base}", f"{r['load_before']} / {r['load_after']}"]
        print("| " + " | ".join(str(c) for c in cells) + " |")
        for side, error in r["errors"].items():
            print(f"    {r['model']} b{r['batch']} {side}: {error}")
        for key in (k for k in r if k.startswith("profile_")):
            print(f"    {key}: " + "; ".join(f"{op} {ms}" for op, ms in r[key]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 5)")
    parser.add_argument("--quick", action="store_true", help="small models (a smoke run)")
    parser.add_argument("--models", default="bert_base,mobilenet_v2,resnet50")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--sides", default=None, help="comma-separated columns")
    parser.add_argument("--profile", default="", help="sides to profile, comma-separated")
    parser.add_argument("--output", default=None, help="file name under bench/results/")
    parser.add_argument(
        "--isa-cap",
        choices=sorted(isa_cap.CAPS),
        default=None,
        help="rerun capped to this ISA: a CPU without bf16 (avx512_vnni) or VNNI (avx2)",
    )
    args = parser.parse_args()
    if args.isa_cap and os.environ.get(isa_cap.MARKER) != args.isa_cap:
        sys.exit(isa_cap.rerun_capped(args.isa_cap))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    logging.getLogger("torchao").setLevel(logging.ERROR)
    RESULTS.mkdir(exist_ok=True)
    stem = "x86_precisions_quick" if args.quick else "x86_precisions"
    stem += f"_cap_{args.isa_cap}" if args.isa_cap else ""
    path = RESULTS / (args.output or f"{stem}.json")
    sides = (args.sides or ",".join(SIDES if bf16_accelerated() else NO_BF16_SIDES)).split(",")
    info = harness.machine(("fxquant", "torchao", "fxquant-x86"), quick=args.quick)
    info["isa"], info["isa_cap"], info["probe"] = harness.isa_flags(), args.isa_cap, isa_cap.probe()
    probe = isa_cap.describe(info["probe"])
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            print(f"{name} b{batch} ({harness.load()}) ...", flush=True)
            rows.append(bench_row(name, batch, args, sides))
            print_rows(rows[-1:], sides, probe)
            path.write_text(json.dumps({"machine": info, "results": rows}, indent=2) + "\n")
    print_rows(rows, sides, probe)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
