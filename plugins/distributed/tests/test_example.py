"""docs/examples/distributed_quantization.py under torchrun: the documented launch works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from distributed_ranks import LOOPBACK

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "docs" / "examples" / "distributed_quantization.py"


@pytest.mark.slow
def test_the_torchrun_example_converts_the_same_model_on_both_ranks() -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    if sys.platform in LOOPBACK:
        env.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK[sys.platform])
    command = [
        *(sys.executable, "-m", "torch.distributed.run"),  # torchrun, from this interpreter
        *("--standalone", "--nproc_per_node", "2", str(EXAMPLE), "--steps", "60"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "sharded calibration: the same int8 model on all 2 ranks: True" in lines
    assert "QAT: the same int8 model on all 2 ranks: True" in lines
    accuracy = next(line for line in lines if line.startswith("QAT: int8 accuracy"))
    assert float(accuracy.split()[-1].rstrip("%")) > 90
