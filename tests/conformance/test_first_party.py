"""``fxquant check NAME`` passes on every first-party backend, as a plugin author runs it.

The command runs in a subprocess, fresh-interpreter check included. The deployed
backends (ExecuTorch, TensorRT) check their three deployed cases only, so each
backend takes seconds, about a minute for all of them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from fxquant.registry import list_backends

FIRST_PARTY = ("x86", "onednn", "fbgemm", "qnnpack", "executorch", "tensorrt", "reference")

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", FIRST_PARTY)
def test_fxquant_check_passes(backend: str) -> None:
    if backend not in list_backends():
        pytest.skip(f"{backend}: its plugin is not installed here")
    result = subprocess.run(
        [sys.executable, "-m", "fxquant", "check", backend, "--failures"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert summary.startswith(f"{backend}: "), summary
    assert ", 0 fail," in summary, summary
