"""Calibration throughput on 1 and 2 processes (fxquant_distributed, gloo on loopback).

What: images per second calibrating a ResNet-50-layout CNN (64x64 images,
batches of 32; --quick: width 16) with fxquant's min/max and histogram
observers, on one rank and on two, each rank a process with
``torch.set_num_threads(1)``:

- ``sharded``: each rank calibrates every other batch with no communication,
  then ``sync_observers`` merges the observers (its time included);
- ``global batch``: every batch is split over the ranks, and
  ``observe_global_batch`` all-reduces each observer's statistics before it
  folds them in (one all-reduce per observer per batch, two for histograms).

How: the ranks are spawned once per world size, with a gloo process group on
127.0.0.1; a round is barrier, calibrate, barrier (so it lasts as long as the
slowest rank), on a freshly prepared model, after one untimed round. The
machine is shared: wall-clock figures are the fastest of --rounds rounds (the
least disturbed), CPU figures the median of the busiest rank's CPU seconds,
which tell the speedup two cores of one's own would give. A QAT step (DDP,
batch 16 per rank) is timed the same way, plain and with fxquant_distributed.
The all-reduce latency (an 8-byte tensor, median of 200) shows what the
global-batch mode pays per observer and batch.
Prints a table and writes bench/results/distributed.json.

Scaling: the work per rank is independent, so ``sharded`` scales with the
ranks up to the cores; on this 2-core machine two single-threaded ranks are
the ceiling (a third rank would share a core). Beyond it, on more cores or
machines, ``sharded`` keeps scaling linearly (its communication is a handful of
all-reduces once, whatever the data); ``global batch`` adds ``observers x
all-reduce latency`` per batch, a fixed cost that larger batches amortize.

    python bench/bench_distributed.py [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from models import resnet_at_depth

RESULTS = Path(__file__).resolve().parent / "results" / "distributed.json"
BATCH = 32
QAT_BATCH = 16  # per rank
LOOPBACK = {"linux": "lo", "darwin": "lo0"}


def mappings() -> dict[str, Any]:
    import fxquant
    from fxquant.config import defaults
    from fxquant.numerics.observer import (
        default_histogram_observer,
        default_per_channel_weight_observer,
    )

    histogram = fxquant.QConfig(
        activation=default_histogram_observer, weight=default_per_channel_weight_observer
    )
    return {
        "min_max": fxquant.QConfigMapping().set_global(defaults.default_per_channel_qconfig),
        "histogram": fxquant.QConfigMapping().set_global(histogram),
    }


def calibrate_round(
    model: torch.nn.Module, observers: str, mode: str, images: torch.Tensor
) -> dict[str, float]:
    """One calibration of ``images`` by this rank's share, barrier to barrier: wall seconds, this
    rank's CPU seconds, and the seconds of ``sync_observers`` (sharded)."""
    import fxquant
    from fxquant_distributed import observe_global_batch, sync_observers

    rank, world = dist.get_rank(), dist.get_world_size()
    batches = images.split(BATCH)
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mappings()[observers], (batches[0][:1],))
    dist.barrier()
    start, cpu = time.perf_counter(), time.process_time()
    merge = 0.0
    with torch.no_grad():
        if mode == "sharded":
            for batch in batches[rank::world]:
                prepared(batch)
            merge = time.perf_counter()
            sync_observers(prepared)
            merge = time.perf_counter() - merge
        else:
            with observe_global_batch(prepared):
                for batch in batches:
                    prepared(batch.chunk(world)[rank])
    cpu = time.process_time() - cpu
    dist.barrier()
    return {"wall": time.perf_counter() - start, "cpu": cpu, "merge": merge}


QAT_VARIANTS = ("DDP", "DDP + observe_global_batch", "DDP + observe_global_batch + SyncBatchNorm")


def qat_step_seconds(
    model: torch.nn.Module, variant: str, images: torch.Tensor
) -> dict[str, float]:
    """A QAT training step under DDP in ``variant``: the fastest wall time (barrier to
    barrier) and the median of this rank's CPU time."""
    import fxquant
    from fxquant_distributed import convert_sync_batchnorm, observe_global_batch
    from torch.nn.parallel import DistributedDataParallel

    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
    prepared = fxquant.prepare_qat_fx(copy.deepcopy(model).train(), mapping, (images[:2],))
    if variant.endswith("SyncBatchNorm"):
        prepared = convert_sync_batchnorm(prepared)
    ddp = DistributedDataParallel(prepared)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    mode = (
        observe_global_batch(ddp) if "observe_global_batch" in variant else contextlib.nullcontext()
    )
    walls, cpus = [], []
    with mode:
        for batch in images.split(QAT_BATCH):
            dist.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            loss = ddp(batch).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            cpus.append(time.process_time() - cpu)
            dist.barrier()
            walls.append(time.perf_counter() - start)
    # the first step warms up
    return {"wall": min(walls[1:]), "cpu": statistics.median(cpus[1:])}


def all_reduce_latency(count: int = 200) -> float:
    """Median seconds of one all-reduce of an 8-byte tensor."""
    value = torch.zeros(2)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rank_main(rank: int, world: int, port: int, folder: str, options: dict[str, Any]) -> None:
    if sys.platform in LOOPBACK:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK[sys.platform])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    spec = resnet_at_depth(1, quick=options["quick"], image=64, batch=BATCH)
    model = spec.build()
    images = torch.randn(options["images"], 3, 64, 64, generator=torch.Generator().manual_seed(0))
    from fxquant.numerics.observer import ObserverBase

    figures: dict[str, Any] = {"latency": all_reduce_latency(), "model": spec.name}
    for observers in ("min_max", "histogram"):
        for mode in ("sharded", "global batch"):
            calibrate_round(model, observers, mode, images[: 2 * BATCH * world])  # warm-up
            rounds = [
                calibrate_round(model, observers, mode, images) for _ in range(options["rounds"])
            ]
            # wall: the least disturbed round (the machine is shared); CPU: the median
            figures[f"{observers}|{mode}"] = {
                "wall": min(found["wall"] for found in rounds),
                "cpu": statistics.median(found["cpu"] for found in rounds),
                "merge": min(found["merge"] for found in rounds),
            }
    if world > 1:
        steps = images[: QAT_BATCH * (options["rounds"] + 1)]
        figures["qat"] = {
            variant: qat_step_seconds(model, variant, steps) for variant in QAT_VARIANTS
        }
    prepared = __import__("fxquant").prepare_fx(
        copy.deepcopy(model), mappings()["min_max"], (images[:1],)
    )
    figures["observers"] = sum(isinstance(m, ObserverBase) for m in prepared.modules())
    dist.destroy_process_group()
    torch.save(figures, Path(folder) / f"figures{rank}.pt")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(world: int, options: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(
            rank_main,
            args=(world, free_port(), folder, options),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        ranks = [torch.load(Path(folder) / f"figures{rank}.pt") for rank in range(world)]
    figures: dict[str, Any] = ranks[0]
    for key, found in figures.items():
        if isinstance(found, dict) and "cpu" in found:  # CPU seconds: the busiest rank's
            found["cpu"] = max(rank[key]["cpu"] for rank in ranks)
    for variant, step in figures.get("qat", {}).items():
        step["cpu"] = max(rank["qat"][variant]["cpu"] for rank in ranks)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per figure")
    parser.add_argument("--quick", action="store_true", help="a narrow CNN and fewer images")
    args = parser.parse_args()
    options = {"rounds": args.rounds, "quick": args.quick, "images": 256 if args.quick else 512}
    by_world = {world: run(world, options) for world in (1, 2)}

    rows = []
    for observers in ("min_max", "histogram"):
        for mode in ("sharded", "global batch"):
            key = f"{observers}|{mode}"
            one, two = by_world[1][key], by_world[2][key]
            rows.append(
                {
                    "observers": observers,
                    "mode": mode,
                    "images_per_s_1_rank": round(options["images"] / one["wall"], 1),
                    "images_per_s_2_ranks": round(options["images"] / two["wall"], 1),
                    "speedup": round(one["wall"] / two["wall"], 2),
                    # CPU seconds of the busiest rank: the speedup two free cores would give
                    "cpu_speedup": round(one["cpu"] / two["cpu"], 2),
                    "sync_observers_ms_2_ranks": round(two["merge"] * 1e3, 1),
                }
            )
    latency_us = by_world[2]["latency"] * 1e6
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"calibration of {by_world[1]['model']} ({'quick' if args.quick else 'full'}, 64x64, "
        f"batch {BATCH}, {options['images']} images, {by_world[1]['observers']} observers), "
        f"1 thread per rank, {args.rounds} rounds; {os.cpu_count()} cores, load {load:.1f}"
    )
    print("img/s: the fastest round; CPU-time speedup: medians of the busiest rank's CPU seconds")
    header = (
        f"{'observers':<10} {'mode':<13} {'1 rank img/s':>13} {'2 ranks img/s':>14} "
        f"{'speedup':>8} {'CPU-time speedup':>17} {'sync_observers':>15}"
    )
    print(header)
    for row in rows:
        merge = f"{row['sync_observers_ms_2_ranks']} ms" if row["mode"] == "sharded" else "-"
        print(
            f"{row['observers']:<10} {row['mode']:<13} {row['images_per_s_1_rank']:>13} "
            f"{row['images_per_s_2_ranks']:>14} {row['speedup']:>7}x "
            f"{row['cpu_speedup']:>16}x {merge:>15}"
        )
    print(f"gloo all-reduce on loopback, 2 ranks: {latency_us:.0f} us (8 bytes, median)")
    qat = by_world[2]["qat"]
    print(f"\nQAT step on 2 ranks, batch {QAT_BATCH} per rank ({args.rounds} steps):")
    print(f"  {'':<46} {'wall (fastest)':>15} {'CPU (median)':>13}")
    for variant, step in qat.items():
        wall, cpu = step["wall"] / qat["DDP"]["wall"] - 1, step["cpu"] / qat["DDP"]["cpu"] - 1
        print(
            f"  {variant:<46} {step['wall'] * 1e3:8.0f} ms {wall:+4.0%} "
            f"{step['cpu'] * 1e3:7.0f} ms {cpu:+4.0%}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": {
                    "cores": os.cpu_count(),
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                },
                "model": by_world[1]["model"],
                "quick": args.quick,
                "images": options["images"],
                "batch": BATCH,
                "observers": by_world[1]["observers"],
                "rounds": args.rounds,
                "load_average": round(load, 2),
                "all_reduce_latency_us_2_ranks": round(latency_us, 1),
                "results": rows,
                "qat_step_ms_2_ranks": {
                    variant: {key: round(value * 1e3, 1) for key, value in step.items()}
                    for variant, step in qat.items()
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
