"""One int8 kernel call: fxquant's oneDNN kernel modules against torch's quint8 ops, per shape.

Where the lowered models' remaining gap to torch.ao comes from (issue 5): on
the convs of ResNet-50 / MobileNetV2 and the linears of a BERT-base layer, one
call of fxquant's ``QConv`` / ``QLinear`` (``torch.ops.onednn.*pointwise`` on
plain uint8/int8 tensors, packed for the input's shape) against
``quantized::conv2d`` / ``quantized::linear`` on a quint8 tensor with the onednn
and x86 engines (what torch.ao's lowered models call), same weights, bias and
qparams; the engine is switched around each torch call. One thread; median of
``--rounds`` rounds of interleaved batches of calls, microseconds per call (wall
clock). Prints a table and writes bench/results/kernels.json.

    python bench/bench_kernels.py [--rounds 7] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fxquant.lowering import QParams
from fxquant_onednn.modules import QConv, QLinear
from harness import engine
from torch import nn

RESULTS = Path(__file__).resolve().parent / "results" / "kernels.json"
X = QParams(torch.uint8, 0, 255, scale=0.05, zero_point=3)
OUT = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=5)
# (name, in channels, out channels, image size, kernel, groups)
CONVS = (
    ("resnet 1x1 1024->256 @14", 1024, 256, 14, 1, 1),
    ("resnet 3x3 64 @56", 64, 64, 56, 3, 1),
    ("mobilenet dw 3x3 384 @14", 384, 384, 14, 3, 384),
    ("mobilenet 1x1 64->384 @14", 64, 384, 14, 1, 1),
)
# (name, tokens, in features, out features)
LINEARS = (
    ("bert q/k/v/out 768->768", 128, 768, 768),
    ("bert ffn1 768->3072", 128, 768, 3072),
    ("bert ffn2 3072->768", 128, 3072, 768),
)


def conv_calls(cin: int, cout: int, size: int, kernel: int, groups: int) -> dict[str, Any]:
    """fxquant's QConv and torch's quantized::conv2d (onednn, x86) on one input."""
    conv = nn.Conv2d(cin, cout, kernel, padding=kernel // 2, groups=groups)
    weight = torch.randint(-127, 128, conv.weight.shape, dtype=torch.int8)
    scale = torch.rand(cout) * 0.01 + 1e-3
    x = torch.randint(0, 256, (1, cin, size, size), dtype=torch.uint8)
    x = x.contiguous(memory_format=torch.channels_last)
    ours = QConv(weight, scale, conv.bias.detach(), conv, (X, OUT))
    calls: dict[str, Any] = {"fxquant QConv": lambda: ours(x)}
    for name in ("onednn", "x86"):
        with engine(name):
            qx = torch._make_per_tensor_quantized_tensor(x, X.scale, X.zero_point)
            zero = torch.zeros(cout, dtype=torch.int64)
            qw = torch._make_per_channel_quantized_tensor(weight, scale.double(), zero, 0)
            packed = torch.ops.quantized.conv2d_prepack(
                qw, conv.bias.detach(), [1, 1], list(conv.padding), [1, 1], groups
            )
        calls[f"quantized::conv2d {name}"] = _in_engine(
            name, lambda qx=qx, packed=packed: torch.ops.quantized.conv2d(qx, packed, 0.1, 5)
        )
    return calls


def linear_calls(tokens: int, features: int, out_features: int) -> dict[str, Any]:
    """fxquant's QLinear and torch's quantized::linear (onednn, x86) on one input."""
    weight = torch.randint(-127, 128, (out_features, features), dtype=torch.int8)
    scale = torch.rand(out_features) * 0.01 + 1e-3
    bias = torch.randn(out_features)
    x = torch.randint(0, 256, (1, tokens, features), dtype=torch.uint8)
    ours = QLinear(weight, scale, bias, X, OUT)
    calls: dict[str, Any] = {"fxquant QLinear": lambda: ours(x)}
    for name in ("onednn", "x86"):
        with engine(name):
            qx = torch._make_per_tensor_quantized_tensor(x, X.scale, X.zero_point)
            zero = torch.zeros(out_features, dtype=torch.int64)
            qw = torch._make_per_channel_quantized_tensor(weight, scale.double(), zero, 0)
            packed = torch.ops.quantized.linear_prepack(qw, bias)
        calls[f"quantized::linear {name}"] = _in_engine(
            name, lambda qx=qx, packed=packed: torch.ops.quantized.linear(qx, packed, 0.1, 5)
        )
    return calls


def _in_engine(name: str, call: Callable[[], Any]) -> Callable[[], Any]:
    # the engine is switched per call (~1 us), as the variants interleave
    def run() -> Any:
        with engine(name):
            return call()

    return run


def interleaved(calls: dict[str, Callable[[], Any]], rounds: int, repeats: int) -> dict[str, float]:
    """Median microseconds per call of each variant, variants alternating order by round."""
    for call in calls.values():
        for _ in range(3):
            call()  # packs weights, warms caches
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            for _ in range(repeats):
                calls[name]()
            samples[name].append((time.perf_counter() - start) / repeats * 1e6)
    return {name: round(statistics.median(values), 1) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="fewer calls per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # torch 2.13 warns once per process on quint8 creation: not part of any timing
    warnings.filterwarnings("ignore", category=UserWarning)
    repeats = 5 if args.quick else 40
    rows = []
    for name, *shape in CONVS:
        rows.append({"kernel": name, **interleaved(conv_calls(*shape), args.rounds, repeats)})
    for name, *shape in LINEARS:
        rows.append({"kernel": name, **interleaved(linear_calls(*shape), args.rounds, repeats)})
    print(f"# 1 thread, torch {torch.__version__}, median of {args.rounds} rounds; us per call")
    for row in rows:
        ours = next(v for k, v in row.items() if k.startswith("fxquant"))
        peers = {k: v for k, v in row.items() if k.startswith("quantized")}
        ratios = "  ".join(f"{k.split()[-1]} {v:8.1f} ({ours / v:.2f}x)" for k, v in peers.items())
        print(f"{row['kernel']:28s} fxquant {ours:8.1f}   torch {ratios}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rounds": args.rounds, "rows": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
