"""nn.TransformerEncoder (2 layers, d_model 256) int8 on x86 against the float module (#20).

The float side is torch's module as users run it (eval, no_grad: its fast path where it
applies). One thread, both sides interleaved in one process, medians of the rounds;
the figure to quote is the ratio float / int8 (> 1: int8 faster) and the SQNR.

    python bench/bench_transformer.py [--rounds 7] [--iters 20] [--batch 8] [--seq 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from fxquant import convert_fx, get_backend_config, get_default_qconfig_mapping, prepare_fx
from torch import nn


def sqnr(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``out`` against ``ref`` in dB."""
    return float(10 * torch.log10(ref.pow(2).mean() / (ref - out).pow(2).mean()))


def build(d_model: int = 256, layers: int = 2) -> nn.Module:
    """The issue's target: a 2-layer batch-first encoder, torch's defaults otherwise."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def quantize(model: nn.Module, inputs: list[torch.Tensor], backend: str = "x86") -> nn.Module:
    """prepare_fx, calibrate on ``inputs``, convert_fx with the backend's defaults."""
    mapping = get_default_qconfig_mapping(backend)
    prepared = prepare_fx(model, mapping, (inputs[0],), backend_config=get_backend_config(backend))
    with torch.no_grad():
        for x in inputs:
            prepared(x)
    return convert_fx(prepared)


def _time(fn: Any, x: torch.Tensor, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn(x)
    return (time.perf_counter() - start) / iters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build()
    shape = (args.batch, args.seq, 256)
    calibration = [torch.randn(shape) for _ in range(8)]
    quantized = quantize(model, calibration)
    x = torch.randn(shape)
    times: dict[str, list[float]] = {"float": [], "int8": []}
    with torch.no_grad():
        accuracy = sqnr(model(x), quantized(x))
        for fn in (model, quantized):  # warm up
            _time(fn, x, 2)
        for _ in range(args.rounds):  # interleaved rounds
            times["float"].append(_time(model, x, args.iters))
            times["int8"].append(_time(quantized, x, args.iters))
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "model": "TransformerEncoder(2 x TransformerEncoderLayer(256, 4, 1024, batch_first))",
        "input": list(shape),
        "sqnr_db": round(accuracy, 2),
        "median_ms": {k: round(v * 1e3, 3) for k, v in median.items()},
        "speedup_float_over_int8": round(median["float"] / median["int8"], 3),
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
