"""Where a lowered model's time goes: torch.profiler op tables of fxquant and torch.ao.

The evidence behind a missed target of bench_backends.py: one case (a row's model
label, e.g. ``"hf_bert b1"``, ``"mobilenet_v2 b1"``, ``"bert_base b8 dynamic"``)
on one backend, both libraries lowered exactly as the benchmark lowers them, one
thread, a few warm calls profiled; prints each library's ops by self CPU time
(total ms per call and calls per forward), the top ``--top``. ``--rounds N`` (N > 1)
interleaves the two: N rounds of ``--calls`` profiled calls each, the libraries
alternating which goes first, each op's time summed over the rounds (a shared, loaded
machine slows both alike), then the ops side by side.

    python bench/profile_backends.py --backend x86 --case "hf_bert b1" [--calls 5] [--top 15]
        [--rounds 6] [--image 32]

``--image``: ResNet-50 cases at another image size (``--image 32``: compute all but gone,
what is left is each call's fixed cost).
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from bench_backends import ao_lowered, cases, dynamic_mapping, fxquant_lowered
from models import resnet_at_depth
from torch.profiler import ProfilerActivity, profile


def op_table(call: Callable[[], Any], calls: int) -> tuple[float, list[tuple[str, float, float]]]:
    """Process CPU ms per profiled forward, and (op, self CPU ms per forward, calls per
    forward), slowest first."""
    with torch.no_grad():
        for _ in range(2):
            call()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.process_time()
            for _ in range(calls):
                call()
            elapsed = (time.process_time() - start) * 1e3 / calls
    rows = [
        (e.key, e.self_cpu_time_total / 1e3 / calls, e.count / calls) for e in prof.key_averages()
    ]
    return elapsed, sorted(rows, key=lambda r: -r[1])


def interleaved_tables(
    variants: dict[str, Callable[[], Any]], calls: int, rounds: int
) -> dict[str, tuple[float, dict[str, list[float]]]]:
    """Per variant: process CPU ms per forward and {op: [self ms per forward, calls per
    forward]}, from ``rounds`` alternating rounds of ``calls`` profiled forwards each."""
    totals: dict[str, tuple[float, dict[str, list[float]]]] = {n: (0.0, {}) for n in variants}
    names = list(variants)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            elapsed, table = op_table(variants[name], calls)
            spent, ops = totals[name]
            for op, ms, count in table:
                entry = ops.setdefault(op, [0.0, 0.0])
                entry[0] += ms / rounds
                entry[1] += count / rounds
            totals[name] = (spent + elapsed / rounds, ops)
    return totals


def print_side_by_side(
    totals: dict[str, tuple[float, dict[str, list[float]]]], label: str, top: int
) -> None:
    """The ops of both variants in one table, by the larger self time."""
    names = list(totals)
    for name, (elapsed, ops) in totals.items():
        spent = sum(ms for ms, _ in ops.values())
        print(f"## {name}: {label}: {elapsed:.2f} ms process CPU per forward, ops {spent:.2f} ms")
    every = {op for _, ops in totals.values() for op in ops}
    ranked = sorted(every, key=lambda op: -max(totals[n][1].get(op, [0, 0])[0] for n in names))
    print(f"{'op':<48} " + " ".join(f"{n + ' ms':>12} {'calls':>6}" for n in names))
    for op in ranked[:top]:
        cells = [totals[n][1].get(op, [0.0, 0.0]) for n in names]
        print(f"{op[:48]:<48} " + " ".join(f"{ms:>12.3f} {c:>6.0f}" for ms, c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="x86")
    parser.add_argument("--case", default="hf_bert b1", help="a bench_backends.py model label")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=1, help="> 1: interleaved rounds")
    parser.add_argument("--image", type=int, default=None, help="ResNet-50 cases: image size")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    (case,) = [c for c in cases(args.quick) if c.label == args.case]
    spec = case.spec
    if args.image is not None:
        if case.model != "resnet50":
            parser.error(f"--image {args.image}: only for resnet50 cases, not {args.case!r}")
        batch = int(args.case.split()[1][1:])
        spec = resnet_at_depth(1, quick=args.quick, image=args.image, batch=batch)
    master, inputs = spec.build().eval(), spec.inputs()
    mapping = dynamic_mapping() if case.dynamic else None
    variants = {
        "fxquant": fxquant_lowered(args.backend, copy.deepcopy(master), inputs, mapping),
        "torch.ao": ao_lowered(args.backend, copy.deepcopy(master), inputs, dynamic=case.dynamic),
    }
    if args.rounds > 1:
        totals = interleaved_tables(variants, args.calls, args.rounds)
        print_side_by_side(totals, f"{args.backend} {args.case}", args.top)
        return
    for name, call in variants.items():
        elapsed, table = op_table(call, args.calls)
        total = sum(ms for _, ms, _ in table)
        print(
            f"## {name}: {args.backend} {args.case}: {elapsed:.1f} ms process CPU per profiled "
            f"forward, ops' self CPU {total:.1f} ms"
        )
        print(f"{'op':<48} {'ms/fwd':>8} {'calls/fwd':>9}")
        for op, ms, count in table[: args.top]:
            print(f"{op[:48]:<48} {ms:>8.2f} {count:>9.0f}")


if __name__ == "__main__":
    main()
