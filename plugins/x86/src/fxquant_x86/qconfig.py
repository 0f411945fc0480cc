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
from collections.abc import Iterable

import torch
from fxquant.config.defaults import bfloat16_static_qconfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigWarning
from fxquant_onednn.qconfig import FLOAT_OPS, default_qconfig_mapping
from torch import fx, nn

from fxquant_x86 import precision
from fxquant_x86.attention import AttentionBlock, attention_blocks, why_no_blocks
from fxquant_x86.patterns import BF16_ONLY_OPS, FLOAT_BF16, pattern_configs

__all__ = [
    "FLOAT_OPS",
    "attention_bf16_qconfig_mapping",
    "bf16_ops",
    "bf16_qconfig_mapping",
    "default_qconfig_mapping",
    "with_bf16_attention",
]

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


def _no_blocks_message(model: nn.Module, graph: fx.GraphModule) -> str:
    return (
        f"attention_bf16_qconfig_mapping: no attention block found in "
        f"{type(model).__name__}: {why_no_blocks(graph)}. The finder needs a module of its "
        "own whose softmax sits between two matmuls fed by reshaped nn.Linear outputs "
        "(transformers' BertSelfAttention); the default mapping comes back, its attention "
        "in float32"
    )


def _traced(model: nn.Module) -> fx.GraphModule | None:
    """``model``'s graph, or ``None`` with a warning saying how to hand one over: the finder
    reads a plain ``torch.fx`` graph, which models with Python control flow on their inputs
    (``nn.TransformerEncoderLayer``'s fast path, transformers' models) do not give."""
    if isinstance(model, fx.GraphModule):
        return model
    try:
        return fx.symbolic_trace(model)
    except Exception as error:  # any tracing failure: the mapping still works, without blocks
        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    msg = (
        f"attention_bf16_qconfig_mapping: torch.fx.symbolic_trace could not trace "
        f"{type(model).__name__} to look for attention blocks ({reason}). Pass a GraphModule "
        "traced already (a transformers model: transformers.utils.fx.symbolic_trace(model, "
        "input_names=[...]); a torch.nn layer: wrap it in a module of your own); the default "
        "mapping comes back, its attention in float32"
    )
    warnings.warn(msg, ConfigWarning, stacklevel=3)
    return None


def attention_bf16_qconfig_mapping(model: nn.Module) -> QConfigMapping:
    """x86's default mapping with ``model``'s attention blocks in bfloat16, where the CPU has it.

    Each block :func:`fxquant_x86.attention.attention_blocks` finds (a softmax between
    two matmuls, in a module of its own) gets module-name entries: its query, key and
    value Linears int8 in, bfloat16 out (``output_dtype``), its other Linears (the
    output projection) the default int8, and every other op of the module, the
    additive mask's add included, bfloat16 (``bfloat16_static_qconfig``). The compiled
    deployment then runs each block as one bfloat16 flash-attention kernel, which on
    an AMX Xeon takes about 0.7x the float32 one; LayerNorm, GELU and the residual
    adds stay float32, as in the default (in bfloat16 they cost BERT 2.3 dB).

    Args:
        model: the float model (traced with ``torch.fx.symbolic_trace``), or a
            ``GraphModule`` traced already (transformers' ``symbolic_trace``). A model
            that plain ``torch.fx`` cannot trace gets the default mapping and a warning
            saying how to pass its graph.

    On a CPU without AMX-BF16 or AVX512-BF16, and on a model where no block is found
    (:func:`fxquant_x86.attention.why_no_blocks` says why), the default mapping is
    returned, with a :class:`fxquant.errors.ConfigWarning` saying why.

    Example:
        >>> # mapping = attention_bf16_qconfig_mapping(model); prepare_fx(model, mapping, ...)
    """
    mapping = default_qconfig_mapping(False)
    if not precision.bf16_accelerated():
        warnings.warn(precision.bf16_unavailable_reason(), ConfigWarning, stacklevel=2)
        return mapping
    graph = _traced(model)
    if graph is None:
        return mapping
    blocks = attention_blocks(graph)
    if not blocks:
        warnings.warn(_no_blocks_message(model, graph), ConfigWarning, stacklevel=2)
    return with_bf16_attention(mapping, graph, blocks)


def with_bf16_attention(
    mapping: QConfigMapping, model: nn.Module, blocks: Iterable[AttentionBlock]
) -> QConfigMapping:
    """``mapping`` with module-name entries putting each of ``blocks`` in bfloat16: the
    block's module ``bfloat16_static_qconfig``, its query, key and value Linears int8 in,
    bfloat16 out, its other Linears ``mapping``'s global int8 qconfig.

    Example:
        >>> m = with_bf16_attention(default_qconfig_mapping(False), nn.Linear(2, 2), [])
        >>> m.module_name_qconfigs
        {}
    """
    int8 = mapping.global_qconfig
    assert int8 is not None  # x86's default quantizes by default
    int8_bf16_out = dataclasses.replace(int8, output_dtype=torch.bfloat16)
    for block in blocks:
        mapping.set_module_name(block.module, bfloat16_static_qconfig)
        for name, module in model.get_submodule(block.module).named_modules():
            if isinstance(module, nn.Linear):
                mapping.set_module_name(f"{block.module}.{name}", int8)
        for projection in block.projections:
            mapping.set_module_name(projection, int8_bf16_out)
    return mapping
