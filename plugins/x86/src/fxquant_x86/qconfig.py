"""The QConfigMappings of the x86 backend: fxquant-onednn's default, and a bfloat16 float side.

x86 states only its pattern list (:mod:`fxquant_x86.patterns`); which ops are
int8 by default, and why, is :func:`fxquant_onednn.qconfig.default_qconfig_mapping`.
On CPUs without VNNI its weights are 7 bits (-63..63), where oneDNN's uint8 x int8
products would saturate on 8-bit ones (``fxquant.lowering.kernels.cpu``; the rules decline
larger weights there, with the reason, instead of giving wrong results).

:func:`bf16_qconfig_mapping` asks for the bfloat16 float side where the CPU computes
bfloat16: Linear int8 in, bfloat16 out, and the ops the default keeps float32 in bfloat16.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
from fxquant.config.defaults import bfloat16_static_qconfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigWarning
from fxquant_onednn.qconfig import FLOAT_OPS, default_qconfig_mapping
from torch import nn

from fxquant_x86 import precision
from fxquant_x86.patterns import BF16_ONLY_OPS, FLOAT_BF16, pattern_configs

__all__ = ["FLOAT_OPS", "bf16_ops", "bf16_qconfig_mapping", "default_qconfig_mapping"]

_LINEARS = (nn.Linear, torch.nn.functional.linear)


def bf16_ops() -> list[object]:
    """The ops the default leaves float32 that x86 can run in bfloat16 (a :data:`FLOAT_BF16`
    pattern): the default's float ops, and those x86 has no int8 pattern for.

    Example:
        >>> torch.nn.LayerNorm in bf16_ops(), torch.nn.Softmax in bf16_ops()
        (True, False)
    """
    offered = {
        config.pattern
        for config in pattern_configs(bf16=True)
        if FLOAT_BF16 in config.dtype_configs
    }
    ops = [op for op in FLOAT_OPS if op in offered]
    return [*ops, *(op for op in BF16_ONLY_OPS if op in offered and op not in ops)]


def bf16_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """x86's default mapping with a bfloat16 float side, where the CPU computes bfloat16.

    Linear (and ``F.linear``) stay int8 in and write bfloat16 (``output_dtype``); the
    ops the default keeps float32 and x86 offers in bfloat16 (:func:`bf16_ops`: adds,
    matmuls, LayerNorm, softmax, GELU, reshapes) run in bfloat16
    (``bfloat16_static_qconfig``). ``explain`` says so per node; the reference model
    rounds those values to bfloat16 and the compiled deployment runs them in bfloat16.

    On a CPU without AMX-BF16 or AVX512-BF16 (:func:`precision.bf16_accelerated`)
    oneDNN would emulate bfloat16, slower than float32: the default mapping is
    returned instead, with a :class:`fxquant.errors.ConfigWarning` saying why.

    Example:
        >>> # mapping = bf16_qconfig_mapping(); explain(prepare_fx(model, mapping, ...))
    """
    mapping = default_qconfig_mapping(is_qat)
    if not precision.bf16_accelerated():
        warnings.warn(precision.bf16_unavailable_reason(), ConfigWarning, stacklevel=2)
        return mapping
    assert mapping.global_qconfig is not None  # the default quantizes by default
    int8_bf16_out = dataclasses.replace(mapping.global_qconfig, output_dtype=torch.bfloat16)
    for linear in _LINEARS:
        mapping.set_object_type(linear, int8_bf16_out)
    for op in bf16_ops():
        mapping.set_object_type(op, bfloat16_static_qconfig)
    return mapping
