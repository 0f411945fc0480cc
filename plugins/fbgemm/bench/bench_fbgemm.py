"""fbgemm lowered int8 latency: fxquant vs float vs torch.ao's fbgemm lowering.

Small MLP and small ResNet-like CNN, batch 1 and 8, one thread; the three models
run interleaved (one call each, in turn) and the medians are reported. Both
int8 models use the same qconfig (histogram reduce-range activations,
per-channel symmetric weights), so the comparison is like for like.

    python plugins/fbgemm/bench/bench_fbgemm.py [--repeats N]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable

import fxquant
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class SmallResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.blocks = nn.Sequential(Block(32), Block(32))
        self.down = nn.Sequential(
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU()
        )
        self.blocks2 = nn.Sequential(Block(64), Block(64))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks2(self.down(self.blocks(self.stem(x))))
        return self.fc(torch.flatten(self.pool(y), 1))


def fxquant_model(model: nn.Module, data: list[torch.Tensor]) -> nn.Module:
    mapping = fxquant.get_default_qconfig_mapping("fbgemm")
    backend = fxquant.get_backend_config("fbgemm")
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, (data[0],), backend_config=backend)
    for x in data:
        prepared(x)
    return fxquant.convert_fx(prepared)


def torch_ao_model(model: nn.Module, data: list[torch.Tensor]) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.ao.quantization.backend_config.utils  # noqa: TID251  # needed first; the peer
        from torch.ao.quantization import get_default_qconfig_mapping  # noqa: TID251  # the peer being measured
        from torch.ao.quantization.backend_config import get_fbgemm_backend_config  # noqa: TID251  # the peer being measured
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx  # noqa: TID251  # the peer being measured

        torch.backends.quantized.engine = "fbgemm"
        backend = get_fbgemm_backend_config()
        mapping = get_default_qconfig_mapping("fbgemm")
        prepared = prepare_fx(copy.deepcopy(model), mapping, (data[0],), backend_config=backend)
        for x in data:
            prepared(x)
        return convert_fx(prepared, backend_config=backend)


def interleaved(
    models: dict[str, Callable[..., object]], x: torch.Tensor, repeats: int
) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(20):
            for model in models.values():
                model(x)
        for _ in range(repeats):
            for name, model in models.items():
                start = time.perf_counter()
                model(x)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, 1 thread, median of {args.repeats} interleaved calls (us)")
    print(
        "| model | batch | float | torch.ao fbgemm | fxquant fbgemm "
        "| fxquant/torch.ao | float/fxquant |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, model, shape in (("MLP", MLP(), (256,)), ("ResNet-like", SmallResNet(), (3, 64, 64))):
        model.eval()
        data = [torch.randn(8, *shape) for _ in range(4)]
        ours, theirs = fxquant_model(model, data), torch_ao_model(model, data)
        for batch in (1, 8):
            x = torch.randn(batch, *shape)
            t = interleaved({"float": model, "ao": theirs, "fx": ours}, x, args.repeats)
            print(
                f"| {name} | {batch} | {t['float']:.0f} | {t['ao']:.0f} | {t['fx']:.0f} "
                f"| {t['fx'] / t['ao']:.2f} | {t['float'] / t['fx']:.2f} |"
            )


if __name__ == "__main__":
    main()
