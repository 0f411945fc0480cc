"""What every benchmark script shares: the quantized engine switch and the machine record."""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch


@contextlib.contextmanager
def engine(name: str) -> Iterator[None]:
    """``torch.backends.quantized.engine`` set to ``name`` inside the block, restored after."""
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def versions(dists: Iterable[str]) -> dict[str, str]:
    """The installed version of each distribution (the ones not installed are left out)."""
    found = {}
    for dist in dists:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[dist] = importlib.metadata.version(dist)
    return found


def machine(dists: Iterable[str], **extra: Any) -> dict[str, Any]:
    """The machine, threads and versions the figures were taken with, plus ``extra``."""
    return {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "versions": versions(dists),
        **extra,
    }
