"""Where a lowered model's time goes: torch.profiler op tables of fxquant and torch.ao.

The evidence behind a missed target of bench_backends.py: one case (a row's model
label, e.g. ``"hf_bert b1"``, ``"mobilenet_v2 b1"``, ``"bert_base b8 dynamic"``)
on one backend, both libraries lowered exactly as the benchmark lowers them, one
thread, a few warm calls profiled; prints each library's ops by self CPU time
(total ms per call and calls per forward), the top ``--top``.

    python bench/profile_backends.py --backend x86 --case "hf_bert b1" [--calls 5] [--top 15]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="x86")
    parser.add_argument("--case", default="hf_bert b1", help="a bench_backends.py model label")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    (case,) = [c for c in cases(args.quick) if c.label == args.case]
    master, inputs = case.spec.build().eval(), case.spec.inputs()
    mapping = dynamic_mapping() if case.dynamic else None
    variants = {
        "fxquant": fxquant_lowered(args.backend, copy.deepcopy(master), inputs, mapping),
        "torch.ao": ao_lowered(args.backend, copy.deepcopy(master), inputs, dynamic=case.dynamic),
    }
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
