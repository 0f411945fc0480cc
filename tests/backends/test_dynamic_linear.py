"""Dynamic linear on every installed CPU backend (issue 5: "dynamic int8 linear available on every
backend that has the kernel", and fp16 weights where the target supports them).

Int8 dynamic linear (int8 weights, activations quantized per call with
qparams chosen at run time) has a kernel on all four backends; fp16 weights
run through FBGEMM's fp16 kernel, so x86 and fbgemm. A stack of linear layers
(no ReLU: dynamic linear does not fuse it) is converted with the dynamic
qconfig on ``nn.Linear``; every layer must be lowered and warn nothing. Int8
must be as accurate against float as the reference model, to 1 dB of SQNR;
fp16 must reach fp16's own precision (>= 60 dB: an 11-bit significand gives
~66 dB; whether a kernel also rounds activations to fp16 moves it by ~2 dB,
int8 would give ~40 dB).
"""

from __future__ import annotations

import copy
import math
import warnings

import fxquant
import pytest
import torch
from fxquant.config.defaults import default_dynamic_qconfig, float16_dynamic_qconfig
from torch import nn

from tests.flow.zoo import seeded

FP16_BACKENDS = ("x86", "fbgemm")
LAYERS = ("_0", "_1", "_2")  # FX names of the Sequential's layers


def linear_stack() -> nn.Module:
    return seeded(lambda: nn.Sequential(nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 8)))


def sqnr(signal: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (signal - approximation).pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(signal.pow(2).sum().item() / noise)


def check_dynamic_linear(backend: str, qconfig: fxquant.QConfig, floor_db: float | None) -> None:
    """Convert ``linear_stack`` with ``qconfig`` on Linear; check lowering, warnings and SQNR
    (at least ``floor_db``, or the reference model's minus 1 dB when None)."""
    torch.set_num_threads(1)
    model = linear_stack()
    inputs = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.QConfigMapping().set_object_type(nn.Linear, qconfig)
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, (inputs,), backend_config=config)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared), backend_config=config)
    lowered = fxquant.convert_fx(prepared, backend_config=config)

    statuses = {e.node: e.status for e in fxquant.explain(lowered, show=False).entries()}
    assert [statuses.get(node) for node in LAYERS] == ["lowered"] * 3, statuses
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        output = lowered(inputs)
        expected, reference_output = model(inputs), reference(inputs)
    assert [str(w.message) for w in caught] == []
    reference_db, lowered_db = sqnr(expected, reference_output), sqnr(expected, output)
    bound = reference_db - 1.0 if floor_db is None else floor_db
    assert lowered_db >= bound, (
        f"{backend}: lowered {lowered_db:.1f} dB vs reference {reference_db:.1f} dB "
        f"(needs >= {bound:.1f})"
    )


def test_dynamic_int8_linear_is_lowered_and_as_accurate_as_reference(backend: str) -> None:
    check_dynamic_linear(backend, default_dynamic_qconfig, floor_db=None)


def test_fp16_weight_linear_is_lowered_and_as_accurate_as_reference(backend: str) -> None:
    if backend not in FP16_BACKENDS:
        pytest.skip(f"{backend} has no fp16-weight linear kernel (FBGEMM's runs on x86, fbgemm)")
    check_dynamic_linear(backend, float16_dynamic_qconfig, floor_db=60.0)
