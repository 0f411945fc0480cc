"""The tensorrt backend's graph modes: a transformer quantized its own way by default.

A transformer's residual stream carries a few outlier channels: int8 Q/DQ on the
residual adds and symmetric per-tensor int8 on the LayerNorm-fed GEMM inputs spend
their whole range on them (a real MiniLM: 0.63 cosine to float with the default
mapping). When the graph has a transformer block's shape, a Linear whose output
reaches a LayerNorm through a residual add::

    x -> Linear -> (Dropout) -> add(., residual) -> LayerNorm

:func:`graph_mode` answers the ``transformer`` mode: ``transformer_qconfig_mapping``
(every GEMM int8, the residual adds and attention matmuls float, as TensorRT runs
them next to its float LayerNorm) plus input-weight equalization on every Linear,
its SmoothQuant migration strength chosen per input from the calibration data
(``alpha="auto"``: only inputs with channels worth moving are scaled; scales folded
into the LayerNorm before it, or into the weights, where the graph allows). A CNN has
no such block and keeps the default mapping. QAT gets the mapping without equalization
(QAT takes none).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F  # the usual alias
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.registry import GraphMode
from torch import fx, nn

from fxquant_tensorrt.qconfig import transformer_qconfig_mapping

__all__ = ["ALPHA", "graph_mode", "residual_blocks"]

ALPHA = "auto"
"""The migration strength the transformer mode equalizes with: chosen per input
(``fxquant.flow.equalization.observers.choose_alpha``). A fixed 0.75 was best on
all-MiniLM-L6-v2 (0.996 cosine in onnxruntime; "auto" 0.996, none 0.983:
bench/accuracy_transformer.py, tensorrt rows) but cost models without outlier
channels up to 8 dB (the zoo's Swin 24.2 dB, "auto" 33.6)."""

_ADDS: tuple[Any, ...] = (operator.add, torch.add, "add")
_PASS_THROUGH_MODULES = (nn.Dropout, nn.Identity)
_PASS_THROUGH_FUNCTIONS: tuple[Any, ...] = (F.dropout, "contiguous")


def _module(node: fx.Node, modules: Mapping[str, nn.Module]) -> nn.Module | None:
    return modules.get(str(node.target)) if node.op == "call_module" else None


def _is_linear(node: fx.Node, modules: Mapping[str, nn.Module]) -> bool:
    module = _module(node, modules)
    if module is not None:
        first = module[0] if isinstance(module, nn.Sequential) and len(module) else module
        return isinstance(first, nn.Linear)
    return node.op == "call_function" and node.target is F.linear


def _is_layer_norm(node: fx.Node, modules: Mapping[str, nn.Module]) -> bool:
    if isinstance(_module(node, modules), nn.LayerNorm):
        return True
    return node.op == "call_function" and node.target is F.layer_norm


def _is_add(node: fx.Node) -> bool:
    return node.op in ("call_function", "call_method") and node.target in _ADDS


def _passes_through(node: fx.Node, modules: Mapping[str, nn.Module]) -> bool:
    if isinstance(_module(node, modules), _PASS_THROUGH_MODULES):
        return True
    return node.op in ("call_function", "call_method") and node.target in _PASS_THROUGH_FUNCTIONS


def _through(node: fx.Node, modules: Mapping[str, nn.Module]) -> Iterator[fx.Node]:
    """The users of ``node``, looking through dropouts and identities."""
    for user in node.users:
        if _passes_through(user, modules):
            yield from _through(user, modules)
        else:
            yield user


def residual_blocks(model: fx.GraphModule) -> list[fx.Node]:
    """The Linear nodes whose output reaches a LayerNorm through a residual add.

    Example:
        >>> class Block(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc, self.norm = nn.Linear(4, 4), nn.LayerNorm(4)
        ...     def forward(self, x):
        ...         return self.norm(self.fc(x) + x)
        >>> [n.name for n in residual_blocks(fx.symbolic_trace(Block()))]
        ['fc']
    """
    modules = dict(model.named_modules())
    found = []
    for node in model.graph.nodes:
        if not _is_linear(node, modules):
            continue
        adds = [user for user in _through(node, modules) if _is_add(user)]
        if any(_is_layer_norm(n, modules) for add in adds for n in _through(add, modules)):
            found.append(node)
    return found


def transformer_equalization() -> QConfigMapping:
    """Input-weight equalization at alpha :data:`ALPHA` on every ``nn.Linear`` and ``F.linear``.

    Example:
        >>> transformer_equalization().qconfig_for("", nn.Linear).input_activation().alpha
        'auto'
    """
    from fxquant.flow.equalization.observers import (  # heavy: only for a transformer
        EqualizationQConfig,
        InputEqualizationObserver,
        WeightEqualizationObserver,
    )

    qconfig = EqualizationQConfig(
        input_activation=InputEqualizationObserver.with_args(alpha=ALPHA),
        weight=WeightEqualizationObserver,
    )
    return QConfigMapping().set_object_type(nn.Linear, qconfig).set_object_type(F.linear, qconfig)


def graph_mode(model: fx.GraphModule, is_qat: bool) -> GraphMode | None:
    """The ``transformer`` mode for a graph with residual blocks, else ``None``.

    Example:
        >>> model = fx.symbolic_trace(nn.Sequential(nn.Conv2d(1, 1, 1), nn.ReLU()))
        >>> graph_mode(model, is_qat=False) is None
        True
    """
    blocks = residual_blocks(model)
    if not blocks:
        return None
    count = f"{len(blocks)} Linear -> residual add -> LayerNorm block{'s' * (len(blocks) > 1)}"
    if is_qat:
        reason = f"{count}: residual adds and attention matmuls float, GEMMs int8"
        return GraphMode("transformer", reason, transformer_qconfig_mapping(is_qat=True))
    reason = (
        f"{count}: residual adds and attention matmuls float, GEMMs int8, "
        f"Linear inputs equalized (alpha {ALPHA})"
    )
    return GraphMode(
        "transformer", reason, transformer_qconfig_mapping(), transformer_equalization()
    )
