"""Inductor options for x86's compiled deployment, measured against each other in one process (#19).

Each variant is fxquant's x86 deployment compiled with extra inductor options
(``name=key:value;key:value``), or ``pt2e`` (torchao's flow with its defaults, as
bench_compiled_x86.py). All variants compile cold (fresh cache each), then run
interleaved: ``--rounds`` rounds, each calling every variant for ~0.2 s in a rotated
order; per-call CPU time, medians, and each variant's median per-round ratio to the
first variant.

    python bench/levers_compiled_x86.py --model bert_base --batch 8 \
        --variants "default=" "cppw=cpp_wrapper:True" pt2e [--quick] [--rounds 7]
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import argparse
import ast
import json
import statistics
import time
import warnings
from typing import Any
from unittest import mock

import bench_compiled_x86 as bench
import torch
from fxquant_x86 import compiled as x86_compiled
from models import main_output
from torch._inductor.utils import fresh_cache


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, _, spec = text.partition("=")
    options: dict[str, Any] = {}
    for item in filter(None, spec.split(";")):
        key, _, value = item.partition(":")
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    return name, options


def build_variant(name: str, options: dict[str, Any], model: Any, inputs: Any) -> tuple[Any, dict]:
    with fresh_cache():
        if name == "pt2e":
            run, _, seconds = bench.pt2e_compiled(model, inputs)
            return run, {"compile_s": round(seconds, 1), "kernels": run.kernels}
        base = x86_compiled.inductor_options

        def patched(**kwargs: Any) -> dict[str, Any]:
            return {**base(**kwargs), **options}

        with mock.patch.object(x86_compiled, "inductor_options", patched):
            run, _, seconds = bench.fxquant_compiled(model, inputs)
        return run, {"compile_s": round(seconds, 1), "kernels": dict(run.kernels)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="bert_base")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--variants", nargs="+", default=["default=", "pt2e"])
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    print(f"warm-up compile: {bench.warm_up():.1f} s", flush=True)
    spec = bench.BUILDERS[args.model](quick=args.quick, batch=args.batch)
    model, inputs = spec.build().eval(), spec.inputs()
    with torch.no_grad():
        expected = main_output(model(*inputs))
    runs, info, outputs = {}, {}, {}
    for text in args.variants:
        name, options = parse_variant(text)
        start = time.perf_counter()
        run, row = build_variant(name, options, model, inputs)
        with torch.no_grad():
            row["sqnr"] = round(bench.sqnr(expected, main_output(run(*inputs))), 2)
        row["options"] = {k: repr(v) for k, v in options.items()}
        runs[name], info[name] = run, row
        outputs[name] = main_output(run(*inputs)).detach().clone()
        print(f"{name}: {row} ({time.perf_counter() - start:.0f} s)", flush=True)
    names = list(runs)
    for n in names:  # the variants against each other: same kernels give the same output
        info[n]["max_abs_diff_to_first"] = float((outputs[n] - outputs[names[0]]).abs().max())
    calls = {n: (lambda r=runs[n]: r(*inputs)) for n in names}
    for n in names:
        calls[n]()
    probe = max(bench._seconds(calls[n], 1) for n in names)
    repeat = max(1, int(0.2 / max(probe, 1e-4)))
    per: dict[str, list[float]] = {n: [] for n in names}
    for index in range(args.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        if index % 2:
            order.reverse()
        for n in order:
            per[n].append(bench._seconds(calls[n], repeat))
    base = names[0]
    for n in names:
        ratio = statistics.median(a / b for a, b in zip(per[n], per[base], strict=True))
        info[n].update(ms=round(statistics.median(per[n]) * 1e3, 3), ratio_to_first=round(ratio, 3))
        print(
            f"{n:>12}: {info[n]['ms']:8.3f} ms  x{ratio:.3f} of {base}  "
            f"compile {info[n]['compile_s']} s  sqnr {info[n]['sqnr']}  "
            f"diff {info[n]['max_abs_diff_to_first']:.2e}",
            flush=True,
        )
    if args.output:
        bench.RESULTS.mkdir(exist_ok=True)
        out = {"args": vars(args), "per_round_s": per, "variants": info}
        (bench.RESULTS / args.output).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
