"""The tensorrt backend's ONNX Q/DQ model in onnxruntime (CPU), against float and the reference.

What it measures, honestly labelled: onnxruntime on this CPU is the check that
the exported Q/DQ model is *consumable* (its QDQ fuser turns the pairs into
integer kernels) and *accurate*; it is not TensorRT's speed, which needs an
NVIDIA GPU (see plugins/tensorrt/README.md). Per model (ResNet-50-like,
BERT-base-like; ``--quick``: narrow versions), one thread:

    float     the float model in PyTorch eager
    ref       fxquant's reference model (``convert_fx`` with tensorrt) in PyTorch
    ort fp32  the float model exported with torch.onnx (dynamo), in onnxruntime
    ort int8  the exported Q/DQ model (``fxquant_tensorrt.export_onnx``), in onnxruntime

BERT also runs with ``transformer_qconfig_mapping`` (adds and attention
matmuls float). Latency: median over ``--rounds`` rounds of the per-call wall time, the four
alternating within a round after one untimed call each (a round repeats a call
for ~0.2 s); ratios are ort fp32 / ort int8 and ref / ort int8. SQNR of each
output against float. Export time: ``export_onnx`` (torch.export + ONNX
translation + the placement check). Prints a table and writes
bench/results/tensorrt.json (``--quick``: tensorrt_quick.json).

    python bench/bench_tensorrt.py [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fxquant
import harness
import torch
from models import BenchModel, bert_base, resnet_at_depth

RESULTS = Path(__file__).resolve().parent / "results"
ROUND_SECONDS = 0.2


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (reference - approximation).pow(2).mean()
    return float(10 * torch.log10(reference.pow(2).mean() / noise)) if noise > 0 else float("inf")


def per_call(run: Callable[[], Any]) -> float:
    start, calls = time.perf_counter(), 0
    while True:
        run()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= ROUND_SECONDS:
            return elapsed / calls


def float_session(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    """The float model through torch.onnx (dynamo) in onnxruntime, one thread."""
    import onnxruntime as ort
    from fxquant_tensorrt.onnx_export import quiet_exporter

    with quiet_exporter():
        program = torch.onnx.export(model, inputs, dynamo=True, optimize=True, verbose=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    feeds = {name: x.numpy() for name, x in zip(names, inputs, strict=True)}
    return lambda: torch.from_numpy(session.run(None, feeds)[0])


def measure(bench: BenchModel, rounds: int, *, transformer: bool = False) -> dict[str, Any]:
    from fxquant_tensorrt import export_onnx
    from fxquant_tensorrt.qconfig import transformer_qconfig_mapping
    from fxquant_tensorrt.runtime import OnnxRuntimeModel

    model, inputs = bench.build().eval(), bench.inputs()
    config = fxquant.get_backend_config("tensorrt")
    if transformer:
        mapping = transformer_qconfig_mapping()
    else:
        mapping = fxquant.get_default_qconfig_mapping("tensorrt")
    with torch.no_grad():
        prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, inputs, backend_config=config)
        prepared(*inputs)
        converted = fxquant.convert_fx(prepared)
        start = time.perf_counter()
        exported = export_onnx(converted, inputs)
        export_seconds = time.perf_counter() - start
        deployed = OnnxRuntimeModel(exported, converted)
        runs: dict[str, Callable[[], Any]] = {
            "float": lambda: model(*inputs),
            "ref": lambda: converted(*inputs),
            "ort_fp32": float_session(model, inputs),
            "ort_int8": lambda: deployed(*inputs),
        }
        outputs = {name: run() for name, run in runs.items()}  # the untimed first call
        times: dict[str, list[float]] = {name: [] for name in runs}
        for index in range(rounds):
            order = list(runs) if index % 2 == 0 else list(reversed(runs))
            for name in order:
                times[name].append(per_call(runs[name]))
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "model": bench.name + (" (transformer mapping)" if transformer else ""),
        "ms": {name: 1000 * value for name, value in medians.items()},
        "sqnr_db": {name: sqnr_db(outputs["float"], out) for name, out in outputs.items()},
        "ort_fp32_over_int8": medians["ort_fp32"] / medians["ort_int8"],
        "ref_over_ort_int8": medians["ref"] / medians["ort_int8"],
        "export_s": export_seconds,
        "fused_ops": dict(deployed.fused_ops),
        "placement_findings": len(exported.placement.findings),
        "int8_nodes": len(exported.placement.int8_nodes),
    }


def machine() -> dict[str, Any]:
    """The machine and the versions the figures were taken with."""
    return harness.machine(("onnx", "onnxruntime", "onnxscript"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="narrow models, for a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import onnxruntime  # noqa: F401  # fail early when the plugin's dependencies are missing

    models = [resnet_at_depth(1, quick=args.quick), bert_base(quick=args.quick)]
    rounds = max(args.rounds, 5)
    rows = [measure(bench, rounds) for bench in models]
    rows.append(measure(models[1], rounds, transformer=True))
    header = (
        "| model | float ms | ref ms | ort fp32 ms | ort int8 ms | fp32/int8 (ort) | ref/ort int8 "
        "| SQNR ref dB | SQNR ort int8 dB | export s | onnxruntime fused ops |"
    )
    print("onnxruntime CPU, one thread: a consumability and accuracy check, not TensorRT speed")
    print(header)
    print("|" + " --- |" * 11)
    for row in rows:
        ms, db = row["ms"], row["sqnr_db"]
        fused = ", ".join(f"{op} {n}" for op, n in sorted(row["fused_ops"].items()))
        print(
            f"| {row['model']} | {ms['float']:.1f} | {ms['ref']:.1f} | {ms['ort_fp32']:.1f} "
            f"| {ms['ort_int8']:.1f} | {row['ort_fp32_over_int8']:.2f}x "
            f"| {row['ref_over_ort_int8']:.2f}x | {db['ref']:.1f} | {db['ort_int8']:.1f} "
            f"| {row['export_s']:.1f} | {fused} |"
        )
    RESULTS.mkdir(exist_ok=True)
    name = "tensorrt_quick.json" if args.quick else "tensorrt.json"
    payload = {"machine": machine(), "rounds": max(args.rounds, 5), "rows": rows}
    (RESULTS / name).write_text(json.dumps(payload, indent=2))
    print(f"wrote {RESULTS / name}")


if __name__ == "__main__":
    main()
