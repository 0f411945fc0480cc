"""Convert's graph edit for one observer node: quantize -> dequantize on plain integer tensors.

    static, per tensor:  x -> quantize_per_tensor(x, 0.02, 128, 0, 255, uint8)
                         (qparams from the observer; integers in the dtype's full range)
                           -> dequantize_per_tensor(q, 0.02, 128, 0, 255, uint8)
    static, per channel: scales / zero points become buffers (get_attr) of the root
    dynamic:             choose_qparams_per_tensor(x) -> quantize .tensor -> dequantize .tensor
    dynamic, per token:  choose_qparams_per_token_asymmetric(x) -> quantize_per_token
                           -> dequantize_per_token (one grid per row; PerTokenObserver)
    float16 / bfloat16:  x.to(float16).to(float32)
    anything else:       the observer is removed (float32 placeholders, unused observers)

Every qparam but per-channel ones is a Python literal in the graph: no buffer
lookups at run time, and ``torch.export`` keeps them as op arguments.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node

from fxquant import dtypes
from fxquant.flow.names import attribute_value, unique_name
from fxquant.lowering import DEQUANTIZE_OF, PER_CHANNEL_OPS, QParams
from fxquant.numerics import qdq as _qdq  # noqa: F401  # the kernels of torch.ops.fxquant.*

__all__ = ["node_qparams", "observer_range", "replace_observer"]

_OPS = torch.ops.fxquant

_FLOAT_CASTS = (torch.float16, torch.bfloat16)


def observer_range(observer: nn.Module, dtype: torch.dtype) -> tuple[int, int]:
    """The range ``observer`` chooses qparams for (dynamic quantization reads it); the
    ``dtype``'s full range where it names no ``quant_min``/``quant_max``.

    Example:
        >>> from fxquant.observer import MinMaxObserver
        >>> observer_range(MinMaxObserver(quant_min=0, quant_max=127), torch.uint8)
        (0, 127)
    """
    low, high = dtypes.quant_range(dtype)
    quant_min = getattr(observer, "quant_min", None)
    quant_max = getattr(observer, "quant_max", None)
    return (
        low if quant_min is None else int(quant_min),
        high if quant_max is None else int(quant_max),
    )


def _static(root: nn.Module, graph: Graph, node: Node, observer: nn.Module) -> Node:
    dtype: torch.dtype = observer.dtype  # type: ignore[assignment]  # checked by the caller
    plain = dtypes.canonical_dtype(dtype)
    # the observer's quant_min/quant_max shaped the qparams; the stored integers use the
    # dtype's full range, as the 8-bit kernels and torch.ao's reference models do (a value
    # beyond the calibrated range saturates at 255, not at a reduce_range bound of 127)
    quant_min, quant_max = dtypes.quant_range(plain)
    scale, zero_point = observer.calculate_qparams()  # type: ignore[operator]  # duck-typed
    if dtypes.is_per_channel(getattr(observer, "qscheme", None)):
        axis = int(observer.ch_axis)  # type: ignore[arg-type]  # per-channel observers have it
        attributes = []
        for value, what in ((scale, "scale"), (zero_point, "zero_point")):
            name = unique_name(root, f"{node.name}_{what}")
            root.register_buffer(name, value.detach().clone())
            attributes.append(graph.get_attr(name))
        tail = (axis, quant_min, quant_max, plain)
        op = _OPS.quantize_per_channel.default
        return _quantize_dequantize(graph, op, node, tuple(attributes), tail)
    qparams = (float(scale), int(zero_point))
    op = _OPS.quantize_per_tensor.default
    return _quantize_dequantize(graph, op, node, qparams, (quant_min, quant_max, plain))


def _quantize_dequantize(
    graph: Graph, op: Any, node: Node, qparams: tuple[Any, ...], tail: tuple[Any, ...]
) -> Node:
    """``op`` on the observer's input, then the dequantize op of the same arguments."""
    q = graph.call_function(op, (node.args[0], *qparams, *tail))
    dequantize = DEQUANTIZE_OF[op]
    out = (torch.float32,) if dequantize is _OPS.dequantize_per_token.default else ()
    return graph.call_function(dequantize, (q, *qparams, *tail, *out))


def _chosen(graph: Graph, choose: Any, args: tuple[Any, ...]) -> tuple[Node, Node]:
    """The ``(scale, zero_point)`` a dynamic quantization chooses at run time."""
    chosen = graph.call_function(choose, args)
    scale = graph.call_function(operator.getitem, (chosen, 0))
    return scale, graph.call_function(operator.getitem, (chosen, 1))


def _dynamic(graph: Graph, node: Node, observer: nn.Module, *, per_token: bool) -> Node:
    """Qparams chosen at run time: per tensor for the observer's range, or one grid per row."""
    dtype: torch.dtype = observer.dtype  # type: ignore[assignment]  # checked by the caller
    plain = dtypes.canonical_dtype(dtype)
    tail = (*dtypes.quant_range(plain), plain)  # stored integers: as in _static
    if per_token:
        choose = _OPS.choose_qparams_per_token_asymmetric.default
        qparams = _chosen(graph, choose, (node.args[0], plain))
        return _quantize_dequantize(graph, _OPS.quantize_per_token.default, node, qparams, tail)
    choose_args = (node.args[0], *observer_range(observer, plain), plain)
    qparams = _chosen(graph, _OPS.choose_qparams_per_tensor.default, choose_args)
    return _quantize_dequantize(graph, _OPS.quantize_per_tensor.tensor, node, qparams, tail)


def replace_observer(root: nn.Module, graph: Graph, node: Node, observer: nn.Module) -> None:
    """Replace the observer call ``node`` by its quantize/dequantize steps (or by its input).

    Example:
        >>> # see tests/flow/test_convert.py: observers become quantize -> dequantize
    """
    dtype: Any = getattr(observer, "dtype", None)
    replacement: Node | Any = node.args[0]  # removed: float32 placeholders, unused observers
    if node.users and isinstance(dtype, torch.dtype):
        with graph.inserting_before(node):
            per_token = getattr(observer, "is_per_token", False)
            if dtype in _FLOAT_CASTS:
                low = graph.call_method("to", (node.args[0], dtype))
                replacement = graph.call_method("to", (low, torch.float32))
            elif dtypes.is_quantized_dtype(dtype):
                if per_token or getattr(observer, "is_dynamic", False):
                    replacement = _dynamic(graph, node, observer, per_token=per_token)
                else:
                    replacement = _static(root, graph, node, observer)
    node.replace_all_uses_with(replacement)
    graph.erase_node(node)


def node_qparams(gm: GraphModule, node: Node) -> QParams:
    """QParams of a static quantize or dequantize node, read from the arguments written here.

    Example:
        >>> g = torch.fx.Graph()
        >>> x = g.placeholder("x")
        >>> q = g.call_function(_OPS.quantize_per_tensor.default, (x, 0.1, 3, 0, 255, torch.uint8))
        >>> node_qparams(torch.fx.GraphModule(nn.Module(), g), q).zero_point
        3
    """
    args: tuple[Any, ...] = node.args  # as written above: literals and get_attr nodes
    if node.target in PER_CHANNEL_OPS:
        _, scales, zero_points, axis, low, high, dtype = args
        scales, zero_points = attribute_value(gm, scales), attribute_value(gm, zero_points)
        return QParams(dtype, low, high, scales, zero_points, axis)
    _, scale, zero_point, low, high, dtype = args
    return QParams(dtype, low, high, scale, zero_point)
