"""The fbgemm/qnnpack int8-in, float-out linear (#23) against the uint8-out linear it replaces.

On a BERT layer's linears (all-MiniLM-L6-v2's shapes, 8 x 64 tokens, and BERT-base's,
128 tokens), one call of fxquant-quantized-engine's ``QuantizedLinear`` as the lowered
transformer runs it (float input from a LayerNorm, GELU or attention, quantize step
absorbed) in both forms:

    old   uint8 out: ``quantized::linear`` then the absorbed dequantize (before #23 the
          output was rounded to uint8 and dequantized for the float op after it)
    new   float out: fbgemm's fused ``linear_with_input_q_dq_qweight_dq_output_fp32``;
          qnnpack's ``linear_dynamic`` on the input with the range rows appended

same weights (7 bits, exact on every CPU), bias and qparams. One thread; variants
interleaved, median of ``--rounds`` rounds, microseconds per call; "new / old" per
shape and for the whole layer (the sum of its six linears: q, k, v, out, ffn1, ffn2).
Prints a table and writes bench/results/float_output_linear.json.

``--cnn``: the residual adds of CNNs (#23), the lowered zoo ResNet-like model (2 + 2
bottlenecks, width 16, 64x64) and the bench's MobileNetV2 (quick size) at batch 1 under
three mappings, same run, microseconds per forward:

    old    adds int8 on their own (``transformer_ops_int8(default)``): conv into uint8,
           then ``quantized::add`` (before #23)
    float  the default: the adds float between dequantize and quantize steps (#23)
    new    ``conv_adds_int8(default)``: conv + add fused (``ConvAdd2d``), the engine's
           conv then its add

    OMP_NUM_THREADS=1 python bench/bench_float_output_linear.py [--rounds 7] [--quick] [--cnn]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fxquant
import harness
import models
import torch
from fxquant.lowering import Dequantize, QParams, Quantize
from fxquant.nn import reference
from fxquant_quantized_engine import (
    QuantizedLinear,
    TensorQParams,
    conv_adds_int8,
    transformer_ops_int8,
)
from torch import nn

RESULTS = Path(__file__).resolve().parent / "results" / "float_output_linear.json"
X, OUT = TensorQParams(0.05, 128), TensorQParams(0.1, 100)
# (layer, tokens, [(linear, in features, out features, how many per layer)])
LAYERS = (
    ("MiniLM-L6 8x64", 512, [("q/k/v/out 384->384", 384, 384, 4), ("ffn1 384->1536", 384, 1536, 1),
                             ("ffn2 1536->384", 1536, 384, 1)]),
    ("BERT-base 1x128", 128, [("q/k/v/out 768->768", 768, 768, 4), ("ffn1 768->3072", 768, 3072, 1),
                              ("ffn2 3072->768", 3072, 768, 1)]),
)  # fmt: skip


def _reference(features: int, outputs: int) -> nn.Module:
    linear = nn.Linear(features, outputs)
    scales = linear.weight.detach().abs().amax(1) / 63
    qparams = {
        "qscheme": torch.per_channel_affine,
        "dtype": torch.int8,
        "scale": scales,
        "zero_point": torch.zeros(outputs, dtype=torch.long),
        "axis": 0,
        "quant_min": -63,
        "quant_max": 63,
    }
    return reference.Linear.from_float(linear, qparams)


def _q(q: TensorQParams) -> QParams:
    return QParams(torch.uint8, q.quant_min, q.quant_max, q.scale, q.zero_point)


def kernels(engine: str, features: int, outputs: int) -> dict[str, nn.Module]:
    """The old (uint8 out, dequantized) and new (float out) kernels, float input absorbed."""
    ref = _reference(features, outputs)
    old = QuantizedLinear(engine, ref, X, OUT)
    old.absorb_input(Quantize(_q(X)))
    old.absorb(Dequantize(_q(OUT)))
    new = QuantizedLinear(engine, ref, X, None)
    new.absorb_input(Quantize(_q(X)))
    return {"old": old, "new": new}


def interleaved(calls: dict[str, Callable[[], Any]], rounds: int, repeats: int) -> dict[str, float]:
    """Median microseconds per call of each variant, alternating order by round."""
    for call in calls.values():
        for _ in range(3):
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            for _ in range(repeats):
                calls[name]()
            samples[name].append((time.perf_counter() - start) / repeats * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def cnn_rows(rounds: int, repeats: int) -> list[dict[str, Any]]:
    """Adds int8 alone, float, fused with the conv: lowered CNNs at batch 1 (module docstring)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.flow.zoo import ResNetLike  # the zoo's model, as the zoo tests build it

    torch.manual_seed(0)
    mobilenet = models.mobilenet_v2(quick=True, batch=1)
    cases = {
        "ResNet-like 64x64": (ResNetLike((2, 2), 16).eval(), torch.randn(1, 3, 64, 64)),
        "MobileNetV2 (quick)": (mobilenet.build().eval(), mobilenet.inputs()[0]),
    }
    rows = []
    for engine in ("fbgemm", "qnnpack"):
        config = fxquant.get_backend_config(engine)
        default = fxquant.get_default_qconfig_mapping
        for name, (model, x) in cases.items():
            lowered = {}
            for key, mapping in (
                ("old", transformer_ops_int8(default(engine))),
                ("float", default(engine)),
                ("new", conv_adds_int8(default(engine))),
            ):
                prepared = fxquant.prepare_fx(
                    copy.deepcopy(model), mapping, (x,), backend_config=config
                )
                with torch.no_grad():
                    for _ in range(3):
                        prepared(x)
                lowered[key] = fxquant.convert_fx(prepared)
            with torch.no_grad():
                times = interleaved(
                    {k: (lambda m=m, x=x: m(x)) for k, m in lowered.items()}, rounds, repeats
                )
            rows.append({"engine": engine, "layer": name, "linear": "whole model (adds)", **times})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="fewer calls per round")
    parser.add_argument("--cnn", action="store_true", help="the float adds' cost on CNNs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", category=UserWarning)  # torch's quint8 warning, once
    repeats = 3 if args.quick else 20
    rows = cnn_rows(args.rounds, max(1, repeats // 4)) if args.cnn else []
    for engine in ("fbgemm", "qnnpack") if not args.cnn else ():
        for layer, tokens, linears in LAYERS:
            total = {"old": 0.0, "new": 0.0}
            for name, features, outputs, count in linears:
                x = torch.randn(tokens, features)
                modules = kernels(engine, features, outputs)
                with torch.no_grad():
                    times = interleaved(
                        {k: (lambda m=m, x=x: m(x)) for k, m in modules.items()},
                        args.rounds,
                        repeats,
                    )
                for key in total:
                    total[key] += times[key] * count
                rows.append({"engine": engine, "layer": layer, "linear": name, **times})
            rows.append({"engine": engine, "layer": layer, "linear": "layer (6 linears)", **total})
    print(f"# 1 thread, torch {torch.__version__}, median of {args.rounds} rounds; us per call")
    if args.cnn:
        print("| engine | model | adds int8 us | float adds us | fused us | float / int8 "
              "| fused / int8 |")  # fmt: skip
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows if args.cnn else ():
        print(
            f"| {row['engine']} | {row['layer']} | {row['old']:.0f} | {row['float']:.0f} "
            f"| {row['new']:.0f} | {row['float'] / row['old']:.2f} "
            f"| {row['new'] / row['old']:.2f} |"
        )
    if not args.cnn:
        print("| engine | layer | linear | old us | new us | new / old |")
        print("| --- | --- | --- | ---: | ---: | ---: |")
    for row in rows if not args.cnn else ():
        print(
            f"| {row['engine']} | {row['layer']} | {row['linear']} | {row['old']:.0f} "
            f"| {row['new']:.0f} | {row['new'] / row['old']:.2f} |"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": harness.machine(("torch",)), "rounds": args.rounds, "rows": rows}
    output = RESULTS.with_name("float_output_cnn.json") if args.cnn else RESULTS
    output.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
