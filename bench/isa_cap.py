"""A CPU without bfloat16 (or without VNNI) emulated on this one: the libraries' ISA capped.

Issue 31's second target is for CPUs without bfloat16 arithmetic (AVX-512 VNNI only, or
AVX2 only). On an AMX Xeon the kernels can be held to such an ISA per process: oneDNN by
``ONEDNN_MAX_CPU_ISA``, ATen's vectorized kernels by ``ATEN_CPU_CAPABILITY`` (which
inductor's ``cpu_vec_isa.pick_vec_isa`` also reads, so its C++ loops are built for that
ISA), MKL's float GEMMs by ``MKL_ENABLE_INSTRUCTIONS``. fxquant reads the caps as "no
bfloat16" (``fxquant_x86.precision.isa_cap_without_bf16``); its VNNI answer comes from
the CPU's flags, so the AVX2 cap also sets ``FXQUANT_CPU_VNNI=0`` (7-bit weights, which
oneDNN's AVX2 int8 kernels need). This is an AMX host with capped libraries, not a real
AVX2 machine: caches, clocks and memory stay the AMX machine's.

:func:`probe` checks that a cap holds: a child process runs fxquant's eager int8 conv and
linear (oneDNN) and a float conv and matmul with ``ONEDNN_VERBOSE=1`` and ``MKL_VERBOSE=1``,
and reports the kernels that ran (``brg_matmul:avx2``, not ``avx10_1_512_amx``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

CAPS: dict[str, dict[str, str]] = {
    "avx512_vnni": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI",
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512_E1",
    },
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "FXQUANT_CPU_VNNI": "0",
    },
}
"""Per cap: the environment a capped run gets. ``avx512_vnni``: a Cascade Lake-like CPU
(AVX-512 and VNNI, no bfloat16); ``avx2``: a Haswell-like one (no AVX-512, no VNNI)."""

MARKER = "FXQ_ISA_CAP"

_PROBE = """
import torch, fxquant, warnings
warnings.simplefilter("ignore")
torch.set_num_threads(1)
from torch import nn
from fxquant_x86 import precision
model = nn.Sequential(nn.Conv2d(8, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 36, 32)).eval()
x = (torch.randn(2, 8, 8, 8),)
mapping = fxquant.get_default_qconfig_mapping("x86")
prepared = fxquant.prepare_fx(model, mapping, x, backend_config=fxquant.get_backend_config("x86"))
prepared(*x)
with torch.no_grad():
    fxquant.convert_fx(prepared)(*x)
    model(*x)
    torch.randn(64, 64) @ torch.randn(64, 64)
import torch._inductor.cpu_vec_isa as vec
print("INDUCTOR_VEC_ISA", str(vec.pick_vec_isa()) or "none")
print("FXQ_BF16", precision.bf16_accelerated(), precision.isa_cap_without_bf16())
from fxquant.lowering.kernels import cpu
print("FXQ_VNNI", cpu.has_vnni())
"""


def environment(cap: str) -> dict[str, str]:
    """The process environment of a run capped at ``cap`` (one of :data:`CAPS`)."""
    if cap not in CAPS:
        msg = f"--isa-cap {cap!r} is not one of {', '.join(CAPS)}; leave it out for no cap"
        raise ValueError(msg)
    return {**os.environ, **CAPS[cap], MARKER: cap}


def rerun_capped(cap: str) -> int:
    """This script again in a child process under ``cap``; returns its exit status."""
    command = [sys.executable, *sys.argv]
    print(f"ISA cap {cap}: {' '.join(f'{k}={v}' for k, v in CAPS[cap].items())}", flush=True)
    return subprocess.run(command, env=environment(cap), check=False).returncode


def probe(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What runs under ``env`` (default: this process's): oneDNN's kernels by primitive,
    MKL's ISA line, inductor's vector ISA, fxquant's bfloat16 and VNNI answers."""
    verbose = {**(env or os.environ), "ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=verbose, capture_output=True, text=True, check=False
    )
    out = done.stdout
    kernels = sorted(set(re.findall(r"exec,cpu,(\w+),([\w:]+),", out)))
    mkl = re.search(r"MKL_VERBOSE oneMKL.*? architecture (.*?), Lnx", out)
    keys = ("INDUCTOR_VEC_ISA", "FXQ_BF16", "FXQ_VNNI")
    found = {key: re.search(rf"^{key} (.*)$", out, re.M) for key in keys}
    return {
        "onednn": [f"{kind} {impl}" for kind, impl in kernels],
        "mkl": mkl.group(1) if mkl else "no MKL_VERBOSE line",
        **{key.lower(): m.group(1) if m else None for key, m in found.items()},
        "error": done.stderr.strip().splitlines()[-1] if done.returncode else None,
    }


def describe(seen: dict[str, Any]) -> str:
    """One paragraph of :func:`probe`'s answer, for the table's header."""
    cap = os.environ.get(MARKER)
    settings = ", ".join(f"{k}={v}" for k, v in CAPS[cap].items()) if cap else ""
    where = f"AMX host with the ISA capped to {cap} ({settings}): not a real {cap} machine"
    onednn = "; ".join(seen["onednn"]) or "none"
    return (
        f"{where if cap else 'no ISA cap'}. Kernels seen: oneDNN {onednn}; MKL {seen['mkl']}; "
        f"inductor vec ISA {seen['inductor_vec_isa']}; fxquant bf16_accelerated "
        f"{seen['fxq_bf16']}, has_vnni {seen['fxq_vnni']}"
        + (f"; probe error: {seen['error']}" if seen["error"] else "")
    )
