"""Dynamic int8 LSTM / GRU / cells: fxquant's lowered models against torch.ao's (#20).

Target (issue 20): dynamic LSTM on x86 at least torch.ao's dynamic quantized LSTM
speed (same run), same numerics within one step.

How: ``torch.set_num_threads(1)``. Per backend (x86, onednn, fbgemm, qnnpack) and
model: the float eager model, fxquant's ``convert_fx`` model (dynamic uint8
activations over 0..127, torch's ``reduce_range``, on the engines that take it; 0..255 on
qnnpack, whose kernels ignore ``reduce_range``; ``default_weight_observer`` weights) and
torch.ao's ``convert_fx`` model (``default_dynamic_qconfig`` on the recurrent modules, the
engine's backend config, ``torch.backends.quantized.engine`` set around its calls). One
untimed call each, then ``--rounds`` rounds; in each round the variants run in an order
that alternates round by round, each ``--iters`` calls timed with ``time.process_time``
(garbage collector paused). A figure is the median per-call time over the rounds; the
ratio torch.ao / fxquant is the median of the per-round ratios (above 1: fxquant faster).
``max |fx - ao|`` is the largest difference of their outputs. Prints a table and writes
bench/results/rnn.json.

    OMP_NUM_THREADS=1 python bench/bench_rnn.py [--rounds 7] [--iters 3] [--backends x86]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import torch
from torch import nn

RECURRENT = (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell)
ENGINES = {"x86": "x86", "onednn": "onednn", "fbgemm": "fbgemm", "qnnpack": "qnnpack"}
RESULTS = Path(__file__).parent / "results"


class Sequence(nn.Module):
    """An ``nn.LSTM`` / ``nn.GRU`` returning its output sequence."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


class CellLoop(nn.Module):
    """An ``nn.LSTMCell`` stepped over the sequence in Python (unrolled by tracing)."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.cell, self.steps = nn.LSTMCell(128, 256), steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, c = self.cell(x[:, 0])
        for t in range(1, self.steps):
            h, c = self.cell(x[:, t], (h, c))
        return h


def models() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    return {
        "lstm 2x256 b8 t50": (Sequence(nn.LSTM(128, 256, 2, batch_first=True)), (8, 50, 128)),
        "gru 2x256 b8 t50": (Sequence(nn.GRU(128, 256, 2, batch_first=True)), (8, 50, 128)),
        "bilstm 128 b4 t50": (
            Sequence(nn.LSTM(64, 128, batch_first=True, bidirectional=True)),
            (4, 50, 64),
        ),
        "lstm b1 t100": (Sequence(nn.LSTM(128, 256, batch_first=True)), (1, 100, 128)),
        "lstmcell b8 t20": (CellLoop(20), (8, 20, 128)),
    }  # type: ignore[return-value]


def _fxquant(model: nn.Module, x: torch.Tensor, backend: str) -> nn.Module:
    import fxquant
    from fxquant.numerics import observer

    top = 255 if backend == "qnnpack" else 127
    activation = observer.PlaceholderObserver.with_args(
        dtype=torch.uint8, quant_min=0, quant_max=top, is_dynamic=True
    )
    qconfig = fxquant.QConfig(activation=activation, weight=observer.default_weight_observer)
    mapping = fxquant.QConfigMapping()
    for cls in RECURRENT:
        mapping.set_object_type(cls, qconfig)
    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, (x,), backend_config=config)
    lowered = fxquant.convert_fx(prepared)
    kinds = {type(m).__name__ for m in lowered.modules()}
    if not kinds & {"QuantizedRecurrent", "QuantizedRecurrentCell"}:
        msg = f"fxquant did not lower the recurrent module on {backend}: {sorted(kinds)}"
        raise RuntimeError(msg)
    return lowered


def _backend_config(configs: Any, backend: str) -> Any:
    from torch.ao.quantization.backend_config.x86 import get_x86_backend_config

    return {
        "x86": get_x86_backend_config,
        "onednn": configs.get_onednn_backend_config,
        "fbgemm": configs.get_fbgemm_backend_config,
        "qnnpack": configs.get_qnnpack_backend_config,
    }[backend]()


def _torch_ao(model: nn.Module, x: torch.Tensor, backend: str) -> Callable[[], Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.ao.quantization as ao
        import torch.ao.quantization.backend_config as ao_configs
        import torch.ao.quantization.backend_config.utils  # noqa: F401  # needed first
        from torch.ao.quantization import quantize_fx

        mapping = ao.QConfigMapping()
        for cls in RECURRENT:
            mapping.set_object_type(cls, ao.default_dynamic_qconfig)
        config = _backend_config(ao_configs, backend)
        with harness.engine(ENGINES[backend]):
            prepared = quantize_fx.prepare_fx(
                copy.deepcopy(model), mapping, (x,), backend_config=config
            )
            lowered = quantize_fx.convert_fx(prepared, backend_config=config)

    def call() -> Any:
        with harness.engine(ENGINES[backend]):
            return lowered(x)

    return call


def _time(call: Callable[[], Any], iters: int) -> float:
    start = time.process_time()
    for _ in range(iters):
        call()
    return (time.process_time() - start) / iters


def measure(
    name: str, model: nn.Module, shape: tuple[int, ...], backend: str, args: argparse.Namespace
) -> dict[str, Any]:
    model.eval()
    x = torch.randn(shape)
    ours = _fxquant(model, x, backend)
    theirs = _torch_ao(model, x, backend)
    variants: dict[str, Callable[[], Any]] = {
        "float": lambda: model(x),
        "fxquant": lambda: ours(x),
        "torch.ao": theirs,
    }
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected, got = theirs(), ours(x)
        float_out = model(x)
    ours_warnings = [str(w.message) for w in caught if "fxquant" in str(w.filename)]
    times: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants)
    gc.disable()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for call in variants.values():
                call()
            for round_ in range(args.rounds):
                for key in order if round_ % 2 == 0 else order[::-1]:
                    times[key].append(_time(variants[key], args.iters))
    finally:
        gc.enable()
    ratios = [a / f for a, f in zip(times["torch.ao"], times["fxquant"], strict=True)]
    return {
        "backend": backend,
        "model": name,
        "float_ms": 1e3 * statistics.median(times["float"]),
        "fxquant_ms": 1e3 * statistics.median(times["fxquant"]),
        "torch_ao_ms": 1e3 * statistics.median(times["torch.ao"]),
        "ao_over_fxquant": statistics.median(ratios),
        "max_abs_diff_vs_torch_ao": float((got - expected).abs().max()),
        "max_abs_diff_vs_float": float((got - float_out).abs().max()),
        "fxquant_warnings": ours_warnings,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--backends", default="x86,onednn,fbgemm,qnnpack")
    parser.add_argument("--models", default="")
    parser.add_argument("--output", default="rnn.json")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error(f"--rounds must be >= 5 (a median of at least 5), got {args.rounds}")
    torch.set_num_threads(1)
    rows = []
    for backend in args.backends.split(","):
        for name, (model, shape) in models().items():
            if args.models and not any(m in name for m in args.models.split(",")):
                continue
            try:
                row = measure(name, model, shape, backend, args)
            except Exception as error:  # one failing row must not end the run
                row = {
                    "backend": backend,
                    "model": name,
                    "error": f"{type(error).__name__}: {error}",
                }
            rows.append(row)
            _print(row)
    RESULTS.mkdir(exist_ok=True)
    record = {
        "machine": harness.machine(["torch", "fxquant"], threads=1),
        "rounds": args.rounds,
        "iters": args.iters,
        "rows": rows,
    }
    (RESULTS / args.output).write_text(json.dumps(record, indent=2))
    print(f"wrote {RESULTS / args.output}")
    return 0


def _print(row: dict[str, Any]) -> None:
    if "error" in row:
        print(f"{row['backend']:8} {row['model']:20} ERROR {row['error']}")
        return
    print(
        f"{row['backend']:8} {row['model']:20} float {row['float_ms']:8.2f} ms  "
        f"fxquant {row['fxquant_ms']:8.2f} ms  torch.ao {row['torch_ao_ms']:8.2f} ms  "
        f"ao/fx {row['ao_over_fxquant']:5.2f}  max|fx-ao| {row['max_abs_diff_vs_torch_ao']:.1e}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
