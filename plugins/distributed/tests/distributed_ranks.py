"""Run a function on N local processes joined in a gloo process group (loopback only).

``run_ranks(worker, *args)`` spawns ``world_size`` fresh Python processes
(``torch.multiprocessing``, start method ``spawn``), joins them in a gloo group
through a TCP store on 127.0.0.1 and a free port, calls
``worker(rank, world_size, *args)`` in each and returns their results in rank
order. A child that raises fails the test with the child's traceback (and the
other children are terminated); a child that hangs is killed after
``timeout`` seconds (300), and collectives give up after ``collective_timeout``
(60), so nothing in CI waits forever.

Workers and their arguments must be picklable: module-level functions, and
results made of tensors, numbers, strings, lists and dicts.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# the loopback interface, so that gloo never goes looking for a routable one
LOOPBACK = {"linux": "lo", "darwin": "lo0"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(  # noqa: PLR0913, PLR0917  # torch.multiprocessing passes the rank, then args in order
    rank: int,
    worker: Callable[..., Any],
    world_size: int,
    port: int,
    folder: str,
    collective_timeout: float,
    args: tuple[Any, ...],
) -> None:
    if sys.platform in LOOPBACK:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK[sys.platform])
    warnings.simplefilter("error")  # as pytest's filterwarnings = error does in the parent
    torch.set_num_threads(1)  # two ranks share the machine's cores
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=collective_timeout),
    )
    try:
        result = worker(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    torch.save(result, Path(folder) / f"rank{rank}.pt")


def run_ranks(
    worker: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 300.0,
    collective_timeout: float = 60.0,
) -> list[Any]:
    """``worker(rank, world_size, *args)`` on ``world_size`` processes; their results by rank.

    The free port is free when chosen, not necessarily when rank 0 binds it a
    second later: a launch that fails on the address in use is retried once.
    """
    try:
        return _run_ranks(worker, args, world_size, timeout, collective_timeout)
    except mp.ProcessRaisedException as error:
        if "EADDRINUSE" not in str(error) and "address already in use" not in str(error).lower():
            raise
        return _run_ranks(worker, args, world_size, timeout, collective_timeout)


def _run_ranks(
    worker: Callable[..., Any],
    args: tuple[Any, ...],
    world_size: int,
    timeout: float,
    collective_timeout: float,
) -> list[Any]:
    with tempfile.TemporaryDirectory() as folder:
        context = mp.start_processes(
            _rank_main,
            args=(worker, world_size, free_port(), folder, collective_timeout, args),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        # join raises ProcessRaisedException (with the child's traceback) when a child fails
        while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() >= deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                pytest.fail(f"{worker.__name__} still running on some rank after {timeout:.0f} s")
        return [torch.load(Path(folder) / f"rank{rank}.pt") for rank in range(world_size)]
