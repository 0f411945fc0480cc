"""What every benchmark script shares: the quantized engine switch and the machine record.

``python bench/harness.py`` prints the machine line (CPU, the ISA flags issue 31's
targets depend on, the load average): ``nox -s bench`` prints it before each table.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
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


ISA_FLAGS = ("amx_int8", "amx_bf16", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx2")


def isa_flags() -> dict[str, bool]:
    """The x86 ISA extensions the targets depend on, from /proc/cpuinfo (all False elsewhere)."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {flag: flag in flags for flag in ISA_FLAGS}


def load() -> str:
    """The load average and the CPU count: how busy the machine was around a figure."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def machine_line() -> str:
    """The CPU, its ISA flags (yes/no) and the load, on one line."""
    isa = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in isa_flags().items())
    return f"{cpu_name()}; ISA: {isa}; {load()}"


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
        "isa": isa_flags(),
        "load": load(),
        **extra,
    }


if __name__ == "__main__":
    print(machine_line())
