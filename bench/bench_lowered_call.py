"""What naming the failing node costs a lowered model's call (LoweredGraphModule).

The same lowered modules and generated code called through torch.fx's own GraphModule
and through the ``LoweredGraphModule`` convert_fx returns, on an x86 MLP, an x86 CNN
and a one-relu graph (the wrapper's cost alone); and fxquant-quantized-engine's
``QuantizedLinear`` (qnnpack and fbgemm, 1 x 64 -> 64) with and without its input
features check. One thread, the two sides interleaved,
median of 21 rounds, microseconds per call; prints the CPU's int8/bf16 ISA flags and
``uptime``.

    OMP_NUM_THREADS=1 python bench/bench_lowered_call.py
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import fxquant
import torch
from fxquant.flow.lowered_model import as_lowered
from torch import fx, nn

FLAGS = "grep -o -w -E 'amx_int8|amx_bf16|avx512_bf16|avx512_vnni|avx2' /proc/cpuinfo | sort -u"


def median_us(
    sides: dict[str, Callable[..., Any]], x: torch.Tensor, calls: int
) -> dict[str, float]:
    rounds: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(21):
        for side, model in sides.items():
            for _ in range(5):
                model(x)
            start = time.perf_counter()
            for _ in range(calls):
                model(x)
            rounds[side].append((time.perf_counter() - start) / calls * 1e6)
    return {side: statistics.median(times) for side, times in rounds.items()}


def lowered(model: nn.Module, x: torch.Tensor) -> fx.GraphModule:
    mapping = fxquant.get_default_qconfig_mapping("x86")
    config = fxquant.get_backend_config("x86")
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    prepared(x)
    return fxquant.convert_fx(prepared)


def main() -> None:
    torch.set_num_threads(1)
    print(subprocess.run(FLAGS, shell=True, capture_output=True, text=True).stdout.split())
    print(subprocess.run("uptime", capture_output=True, text=True).stdout.strip())
    cnn = [nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3), nn.Flatten()]
    cases = (
        ("mlp 1x16", nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)), (1, 16), 300),
        ("cnn 1x3x32x32", nn.Sequential(*cnn, nn.Linear(16 * 28 * 28, 10)), (1, 3, 32, 32), 40),
    )
    for name, model, shape, calls in cases:
        x = torch.randn(shape)
        wrapped = lowered(model.eval(), x)
        plain = fx.GraphModule(wrapped, wrapped.graph)  # same modules and code, fx's call
        times = median_us({"GraphModule": plain, "LoweredGraphModule": wrapped}, x, calls)
        ratio = times["LoweredGraphModule"] / times["GraphModule"]
        print(f"{name}: {times}, ratio {ratio:.3f}")
    relu = nn.Sequential(nn.ReLU())
    sides = {
        "GraphModule": fx.symbolic_trace(relu),
        "LoweredGraphModule": as_lowered(fx.symbolic_trace(relu)),
    }
    times = median_us(sides, torch.randn(1, 4), 5000)
    added = times["LoweredGraphModule"] - times["GraphModule"]
    print(f"one-relu graph: {times}, added {added:.2f} us per call")
    features_check()


def features_check() -> None:
    from fxquant.nn import reference
    from fxquant_quantized_engine import TensorQParams
    from fxquant_quantized_engine.modules import QuantizedLinear, _Static

    qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8, "scale": 0.02}
    ref = reference.Linear.from_float(nn.Linear(64, 64), {**qparams, "zero_point": 0})
    x = torch.randint(0, 255, (1, 64), dtype=torch.uint8)
    for engine in ("qnnpack", "fbgemm"):
        kernel = QuantizedLinear(engine, ref, TensorQParams(0.05, 128), TensorQParams(0.1, 128))
        sides = {  # both through a lambda: the same call overhead on each side
            "checked": lambda v, k=kernel: QuantizedLinear.forward(k, v),
            "unchecked": lambda v, k=kernel: _Static.forward(k, v),  # the kernel past its check
        }
        times = median_us(sides, x, 2000)
        added = times["checked"] - times["unchecked"]
        print(f"QuantizedLinear {engine} 1x64->64: {times}, check adds {added:.2f} us per call")


if __name__ == "__main__":
    main()
