"""Flow speed on each backend's own defaults against torch.ao's same-named backend, one process.

Targets (issue 12): with each backend's ``get_backend_config(name)`` and
``get_default_qconfig_mapping(name)`` (per-channel weights, histogram observers:
the configuration users run) against torch.ao's ``get_<name>_backend_config()``
and ``get_default_qconfig_mapping(name)``, on a ResNet-50-like CNN, a
MobileNetV2-like CNN (64x64 images) and a 12-layer BERT-base-like encoder (128
tokens): ``prepare_fx`` >= 2x faster, ``convert_fx`` >= 2x faster, and prepare
time linear in depth (ResNet-50 at 1x, 2x and 4x its blocks, x86). bench_flow.py
keeps the ``reference``/``native`` figures of issue 4.

How: ``torch.set_num_threads(1)``, ``torch.backends.quantized.engine`` set to the
backend for torch.ao's calls. One sample is ``prepare_fx`` (timed), one
calibration batch (not timed), ``convert_fx`` (timed) on a fresh deep copy of the
float model; the two libraries alternate order round by round after one untimed
sample each; a figure is the median over ``--rounds`` (>= 5) of the per-round
ratio torch.ao / fxquant, and of each library's CPU seconds
(``time.process_time``, garbage collected before and paused during each timed
call). Prints a table and writes bench/results/flow_backends.json.

    python bench/bench_flow_backends.py [--rounds 5] [--quick] [--backends x86,onednn]
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bench_flow import attempt, exponent, node_count, seconds
from harness import engine
from models import BenchModel, bert_base, mobilenet_v2, resnet_at_depth
from torch import fx, nn

RESULTS = Path(__file__).resolve().parent / "results" / "flow_backends.json"
BACKENDS = ("x86", "onednn", "fbgemm", "qnnpack")
TARGET = 2.0  # torch.ao / fxquant, prepare_fx and convert_fx


@dataclass(frozen=True)
class Flow:
    """One library's default flow for a backend: prepare, convert, and cleanup between runs."""

    name: str
    prepare: Callable[[nn.Module, tuple[Any, ...]], fx.GraphModule]
    convert: Callable[[fx.GraphModule], nn.Module]
    release: Callable[[], None]


def fxquant_flow(name: str) -> Flow:
    import fxquant

    mapping = fxquant.get_default_qconfig_mapping(name)
    config = fxquant.get_backend_config(name)
    return Flow(
        "fxquant",
        lambda model, inputs: fxquant.prepare_fx(model, mapping, inputs, backend_config=config),
        lambda prepared: fxquant.convert_fx(prepared, backend_config=config),
        lambda: None,
    )


def torch_ao_flow(name: str) -> Flow:
    """torch.ao through importlib (the lint bans the name); its warnings silenced."""
    warnings.simplefilter("ignore")
    importlib.import_module("torch.ao.quantization.backend_config.utils")  # import-order quirk
    ao = importlib.import_module("torch.ao.quantization")
    quantize_fx = importlib.import_module("torch.ao.quantization.quantize_fx")
    configs = importlib.import_module(f"torch.ao.quantization.backend_config.{name}")
    fx_utils = importlib.import_module("torch.ao.quantization.fx.utils")
    config = getattr(configs, f"get_{name}_backend_config")()
    with engine(name):
        mapping = ao.get_default_qconfig_mapping(name)

    def prepare(model: nn.Module, inputs: tuple[Any, ...]) -> fx.GraphModule:
        with engine(name):
            return quantize_fx.prepare_fx(model, mapping, inputs, backend_config=config)

    def convert(prepared: fx.GraphModule) -> nn.Module:
        with engine(name):
            return quantize_fx.convert_fx(prepared, backend_config=config)

    # its flow keeps every model alive through this cache: drop them between runs
    return Flow("torch.ao", prepare, convert, fx_utils.assert_and_get_unique_device.cache_clear)


def sample(flow: Flow, spec: BenchModel, master: nn.Module) -> tuple[float, float]:
    """(prepare_fx seconds, convert_fx seconds) of one run on a fresh copy of ``master``."""
    model, inputs = copy.deepcopy(master), spec.inputs()
    prepare_s, prepared = seconds(lambda: flow.prepare(model, inputs))
    with torch.no_grad():
        prepared(*inputs)
    convert_s, _ = seconds(lambda: flow.convert(prepared))
    flow.release()
    return prepare_s, convert_s


def measure(flows: list[Flow], spec: BenchModel, rounds: int) -> dict[str, Any]:
    """Median seconds per library and step, and median per-round ratios torch.ao / fxquant."""
    master = spec.build().eval()
    samples: dict[str, list[tuple[float, float]]] = {flow.name: [] for flow in flows}
    for flow in flows:  # one untimed run each: the first run on a new model is slower
        sample(flow, spec, master)
    for index in range(rounds):
        for flow in flows if index % 2 == 0 else flows[::-1]:
            samples[flow.name].append(sample(flow, spec, master))
    fxq, ao = samples["fxquant"], samples["torch.ao"]
    result: dict[str, Any] = {"nodes": node_count(master)}
    for step, column in (("prepare_fx", 0), ("convert_fx", 1)):
        ratios = [a[column] / f[column] for f, a in zip(fxq, ao, strict=True)]
        result[step] = {
            "fxquant_s": round(statistics.median(s[column] for s in fxq), 4),
            "torch_ao_s": round(statistics.median(s[column] for s in ao), 4),
            "speedup": round(statistics.median(ratios), 2),
        }
    return result


def models(quick: bool) -> dict[str, BenchModel]:
    """The issue's three models; the CNNs at 64x64 (the flow's cost does not grow with images)."""
    return {
        "resnet50": resnet_at_depth(1, quick=quick, image=64),
        "mobilenet_v2": mobilenet_v2(quick=quick),
        "bert_base": bert_base(quick=quick),
    }


def depth_models(quick: bool) -> dict[str, BenchModel]:
    return {f"resnet50_x{k}": resnet_at_depth(k, quick=quick, image=64) for k in (2, 4)}


def rows_for(name: str, rounds: int, quick: bool, depth: bool) -> list[dict[str, Any]]:
    """One row per model (and per depth multiple when ``depth``) for backend ``name``."""
    flows = attempt(lambda: [fxquant_flow(name), torch_ao_flow(name)])
    specs = {**models(quick), **(depth_models(quick) if depth else {})}
    rows = []
    for model, spec in specs.items():
        row: dict[str, Any] = {"backend": name, "model": model}
        result = (
            flows if isinstance(flows, str) else attempt(lambda s=spec: measure(flows, s, rounds))
        )
        if isinstance(result, str):
            row["error"] = result
        else:
            row.update(result)
            row["ok"] = all(row[step]["speedup"] >= TARGET for step in ("prepare_fx", "convert_fx"))
        rows.append(row)
        print(f"  measured {name} {model}", file=sys.stderr)
    return rows


def linearity(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """prepare_fx and convert_fx time ~ nodes ** k per library over the ResNet-50 depths."""
    fits: dict[str, Any] = {}
    for backend in dict.fromkeys(r["backend"] for r in rows):
        depth = [r for r in rows if r["backend"] == backend and r["model"].startswith("resnet50")]
        depth = [r for r in depth if "error" not in r]
        if len(depth) < 2:
            continue
        fits[backend] = {
            f"{step} {library}": round(exponent([(r["nodes"], r[step][key]) for r in depth]), 2)
            for step in ("prepare_fx", "convert_fx")
            for library, key in (("fxquant", "fxquant_s"), ("torch.ao", "torch_ao_s"))
        }
    return fits


def print_table(rows: list[dict[str, Any]], fits: dict[str, Any], rounds: int) -> None:
    print(f"# each backend's default mapping and config; median of {rounds} rounds, 1 thread")
    print(
        f"{'backend':<8} {'model':<14} {'nodes':>6} {'prep fxq':>9} {'prep ao':>9} {'ao/fxq':>7} "
        f"{'conv fxq':>9} {'conv ao':>9} {'ao/fxq':>7}  target >= {TARGET:g}x"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:<8} {r['model']:<14} FAILED: {r['error'][:110]}")
            continue
        p, c = r["prepare_fx"], r["convert_fx"]
        print(
            f"{r['backend']:<8} {r['model']:<14} {r['nodes']:>6} {p['fxquant_s']:>9.3f} "
            f"{p['torch_ao_s']:>9.3f} {p['speedup']:>6.2f}x {c['fxquant_s']:>9.3f} "
            f"{c['torch_ao_s']:>9.3f} {c['speedup']:>6.2f}x  {'yes' if r['ok'] else 'NO'}"
        )
    for backend, fit in fits.items():
        print(f"time ~ nodes^k on {backend}: " + ", ".join(f"{k} {v}" for k, v in fit.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 5)")
    parser.add_argument("--quick", action="store_true", help="small models, 2 rounds (smoke)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    args = parser.parse_args()
    rounds = 2 if args.quick else max(5, args.rounds)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    backends = [b for b in args.backends.split(",") if b]
    rows = []
    for name in backends:  # depth scaling on the first backend (x86 by default) only: time
        rows += rows_for(name, rounds, args.quick, depth=name == backends[0])
    fits = linearity(rows)
    print_table(rows, fits, rounds)
    path = RESULTS.with_name("flow_backends_quick.json") if args.quick else RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "rounds": rounds,
        "quick": args.quick,
        "torch": torch.__version__,
        "results": rows,
        "linearity": fits,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
