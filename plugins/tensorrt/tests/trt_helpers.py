"""Helpers of the tensorrt plugin's tests: quantize with the backend, SQNR."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import fxquant
import torch
from torch import fx, nn


def quantize(
    model: nn.Module,
    example: tuple[Any, ...],
    calibration: Sequence[tuple[Any, ...]] = (),
    mapping: fxquant.QConfigMapping | None = None,
    *,
    is_qat: bool = False,
    equalization: fxquant.QConfigMapping | None = None,
) -> fx.GraphModule:
    """``model`` prepared for tensorrt, calibrated on ``calibration`` + ``example``, converted."""
    config = fxquant.get_backend_config("tensorrt")
    if mapping is None:
        mapping = fxquant.get_default_qconfig_mapping("tensorrt", is_qat=is_qat)
    options = {} if equalization is None else {"_equalization_config": equalization}
    prepare = fxquant.prepare_qat_fx if is_qat else fxquant.prepare_fx
    prepared = prepare(copy.deepcopy(model), mapping, example, backend_config=config, **options)
    with torch.no_grad():
        for batch in (*calibration, example):
            prepared(*batch)
    return fxquant.convert_fx(prepared.eval())


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (reference - approximation).pow(2).mean()
    return float(10 * torch.log10(reference.pow(2).mean() / noise)) if noise > 0 else float("inf")
