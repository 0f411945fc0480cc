"""A torch.ao script unchanged (no ``backend_config``): its ``convert_fx`` model against float.

``prepare_fx(model, get_default_qconfig_mapping(), example)``, one calibration batch,
``convert_fx(prepared)``, as torch.ao's docs write it; torch.ao lowers that to the host's
native engine, and so does fxquant where the native backend's plugin is installed (issue 30).
Prints the backend ``None`` resolved to, the report's statuses and the latency ratio to
float: 1 thread, float and quantized interleaved, medians of 7 rounds of 20 calls.

    OMP_NUM_THREADS=1 python bench/bench_native_backend.py
"""

from __future__ import annotations

import platform
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable

import fxquant
import torch
from fxquant import convert_fx, get_default_qconfig_mapping, prepare_fx
from fxquant.flow.state import flow_state
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, stride=2),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(128, 4, 512, batch_first=True, dropout=0.0)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def seconds(run: Callable[[torch.Tensor], object], x: torch.Tensor, calls: int = 20) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(calls):
            run(x)
        return (time.perf_counter() - start) / calls


def measure(name: str, model: nn.Module, x: torch.Tensor) -> None:
    model = model.eval()
    prepared = prepare_fx(model, get_default_qconfig_mapping(), (x,))  # torch.ao's script
    with torch.no_grad():
        prepared(x)
    quantized = convert_fx(prepared)
    state = flow_state(quantized)
    backend = state.backend_config.name if state is not None else "?"
    statuses: dict[str, int] = {}
    for entry in fxquant.explain(quantized, show=False).entries():
        statuses[str(entry.status)] = statuses.get(str(entry.status), 0) + 1
    for run in (model, quantized):
        seconds(run, x, 3)  # warm up
    ratios = []
    for _ in range(7):
        ratios.append(seconds(quantized, x) / seconds(model, x))
    print(
        f"{name}: backend {backend}, statuses {statuses}, quantized/float latency median "
        f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})",
        flush=True,
    )


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warnings.simplefilter("ignore")  # calibration notices on one batch
    flags = subprocess.run(
        "grep -o -w 'avx512_vnni\\|amx_int8\\|amx_bf16\\|avx512_bf16' /proc/cpuinfo | sort -u",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    print(f"torch {torch.__version__}, {platform.machine()}, 1 thread, {flags}; {load.strip()}")
    measure("small CNN 1x3x64x64", SmallCNN(), torch.randn(1, 3, 64, 64))
    measure("TransformerEncoder 2 x d128, 8x32", encoder(), torch.randn(8, 32, 128))


if __name__ == "__main__":
    main()
