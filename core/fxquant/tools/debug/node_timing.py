"""Per-node kernel timings for :func:`fxquant.numerics.choose_precision`.

Each candidate module's input is captured while the calibration data runs
through the float model (a forward hook); the module alone then runs on the
first batch's input in each precision, as that precision runs it:

    fp32   the float module
    bf16   a bfloat16 copy on the input in bfloat16 (AMX / AVX512-BF16 where the CPU has them)
    int8   the module alone through prepare_fx -> calibrate (every captured input) -> convert_fx
           with the backend: its lowered kernel, with its input's quantize step

The median of ``repeats`` timed calls, after two warm-up calls, in milliseconds.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fxquant.config.backend import BackendConfig
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow import convert_fx, prepare_fx

__all__ = ["PRECISIONS", "capture_inputs", "median_ms", "time_node"]

PRECISIONS = ("int8", "bf16", "fp32")
"""From the least accurate to the most (and, on a CPU with int8 and bf16 units, the fastest
to the slowest)."""


def capture_inputs(
    model: nn.Module, names: Sequence[str], batches: Sequence[tuple[Any, ...]]
) -> dict[str, list[torch.Tensor]]:
    """The input of each named submodule of ``model`` for every batch (detached)."""
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    modules = dict(model.named_modules())
    handles = []
    for name in names:

        def hook(_: nn.Module, args: tuple[Any, ...], name: str = name) -> None:
            captured[name].append(args[0].detach().clone())

        handles.append(modules[name].register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for batch in batches:
                model(*batch)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def median_ms(run: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``run()`` in ms, after two warm-up calls."""
    with torch.no_grad():
        run()
        run()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _int8_module(
    module: nn.Module,
    qconfig: QConfig,
    inputs: Sequence[torch.Tensor],
    backend: BackendConfig | None,
) -> nn.Module:
    alone = nn.Sequential(copy.deepcopy(module)).eval()
    mapping = QConfigMapping().set_global(qconfig)
    prepared = prepare_fx(alone, mapping, (inputs[0],), backend_config=backend)
    with torch.no_grad():
        for x in inputs:
            prepared(x)
    return convert_fx(prepared, backend_config=backend)


def time_node(
    module: nn.Module,
    inputs: Sequence[torch.Tensor],
    qconfigs: Mapping[str, QConfig | None],
    backend: BackendConfig | None,
    repeats: int,
) -> dict[str, float]:
    """The module's ms in each precision of ``qconfigs`` (``int8`` needs its qconfig)."""
    timings: dict[str, float] = {}
    for precision, qconfig in qconfigs.items():
        run = _runner(module, precision, qconfig, inputs, backend)
        timings[precision] = median_ms(run, repeats)
    return timings


def _runner(
    module: nn.Module,
    precision: str,
    qconfig: QConfig | None,
    inputs: Sequence[torch.Tensor],
    backend: BackendConfig | None,
) -> Callable[[], Any]:
    """The call that runs ``module`` on the first input as ``precision`` runs it."""
    x = inputs[0]
    if precision == "fp32":
        return lambda: module(x)
    if precision == "bf16":
        low, low_x = copy.deepcopy(module).to(torch.bfloat16), x.to(torch.bfloat16)
        return lambda: low(low_x)
    assert qconfig is not None  # the int8 precision is the mapping's own qconfig
    kernel = _int8_module(module, qconfig, inputs, backend)
    return lambda: kernel(x)
