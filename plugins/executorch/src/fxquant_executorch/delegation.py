"""Which nodes XNNPACK took, which stayed in ExecuTorch's portable runtime, and why.

After ``to_edge_transform_and_lower``, the top-level graph of the edge program
holds one ``executorch_call_delegate`` per XNNPACK subgraph and, between them,
the ops the partitioner refused, which the portable runtime runs::

    x -> [XNNPACK: q, conv, relu, add] -> aten.mean.dim (portable) -> [XNNPACK: linear] -> y

Every edge op carries its provenance (``node.meta["from_node"]``) back to the
converted model's node (:func:`fxquant.tools.export.origin`), so the verdict is
given per node of the model the user converted, in ``fxquant.explain`` form:
a quantized node whose ops all run in XNNPACK is ``lowered``; one with an op
in the portable runtime keeps ``reference`` with the reason ``not_delegated``,
the partitioner's own words (captured from its ``WhyNoPartition`` log) and
the user's source line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import operator
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from fxquant.flow.report import NodeReport, NodeStatus, Reason, ReasonCode, Report
from fxquant.tools.export import origin
from torch import fx, nn
from torch.export import ExportedProgram

from fxquant_executorch.edge_ops import target_name

__all__ = [
    "Placement",
    "capture_partitioner_reasons",
    "delegation_report",
    "explain_float",
    "placements",
]

_PARTITIONER_LOGGER = "executorch.backends.xnnpack.partition"
_QUANTIZED = (NodeStatus.REFERENCE, NodeStatus.LOWERED, NodeStatus.QUANTIZED)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one node of the converted model runs in the ExecuTorch program.

    Attributes:
        node: the converted model's node (``""`` for a quantize/dequantize
            step of no node, at a boundary between delegates).
        delegated: the edge ops that run in XNNPACK.
        portable: the edge ops that run in the portable runtime.
        why: the partitioner's reasons for the portable ones.

    Example:
        >>> Placement("conv", ("aten::convolution",), (), ()).in_xnnpack
        True
    """

    node: str
    delegated: tuple[str, ...]
    portable: tuple[str, ...]
    why: tuple[str, ...]

    @property
    def in_xnnpack(self) -> bool:
        """Every op of the node runs in XNNPACK."""
        return not self.portable


class _ReasonHandler(logging.Handler):
    """Collects ``WhyNoPartition`` records: edge node name -> the partitioner's reasons."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: dict[str, list[str]] = defaultdict(list)

    def emit(self, record: logging.LogRecord) -> None:
        # the record's msg is the WhyNoPartition object, read when it is logged
        node, reason = getattr(record.msg, "node", None), getattr(record.msg, "reason", None)
        if isinstance(node, fx.Node) and isinstance(reason, str):
            found = self.reasons[node.name]
            if reason not in found:
                found.append(reason)


@contextlib.contextmanager
def capture_partitioner_reasons() -> Iterator[Mapping[str, list[str]]]:
    """While active, collect why XNNPACK's partitioner refused each edge node (by node name).

    The partitioner logs its reasons at DEBUG; they are caught here and kept
    from the user's log handlers.

    Example:
        >>> with capture_partitioner_reasons() as reasons:
        ...     pass
        >>> dict(reasons)
        {}
    """
    logger = logging.getLogger(_PARTITIONER_LOGGER)
    handler = _ReasonHandler()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield handler.reasons
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _is_plumbing(node: fx.Node) -> bool:
    name = getattr(node.target, "__name__", "")
    return node.target is operator.getitem or name == "executorch_call_delegate"


def placements(edge: ExportedProgram, reasons: Mapping[str, Sequence[str]]) -> list[Placement]:
    """Where each converted-model node's edge ops run, in graph order of first appearance.

    Args:
        edge: the edge program after ``to_edge_transform_and_lower``.
        reasons: the partitioner's reasons by edge node name
            (:func:`capture_partitioner_reasons`).

    Example:
        >>> # see to_executorch; tests/test_delegation.py checks a refused mean
    """
    delegated: dict[str, list[str]] = defaultdict(list)
    portable: dict[str, list[str]] = defaultdict(list)
    why: dict[str, list[str]] = defaultdict(list)
    order: dict[str, None] = {}
    graph_module = edge.graph_module
    for node in edge.graph.nodes:
        if node.op == "get_attr":
            lowered = getattr(graph_module, str(node.target), None)
            original = getattr(lowered, "original_module", None)
            for inner in [] if original is None else original.graph.nodes:
                if inner.op == "call_function":
                    name = origin(inner) or ""
                    order.setdefault(name)
                    delegated[name].append(target_name(inner.target))
        elif node.op == "call_function" and not _is_plumbing(node):
            name = origin(node) or ""
            order.setdefault(name)
            portable[name].append(target_name(node.target))
            for reason in reasons.get(node.name, ()):
                if reason not in why[name]:
                    why[name].append(reason)
    return [
        Placement(
            name,
            tuple(dict.fromkeys(delegated[name])),
            tuple(dict.fromkeys(portable[name])),
            tuple(why[name]),
        )
        for name in order
    ]


def _words(entry: NodeReport, placement: Placement) -> str:
    ops = ", ".join(placement.portable)
    why = "; ".join(placement.why) or "XNNPACK's partitioner has no rule that takes it"
    where = f" ({entry.source})" if entry.source else ""
    return f"{entry.node}{where}: {ops} ran in ExecuTorch's portable runtime, not XNNPACK: {why}"


@functools.cache
def _kept_float_words() -> tuple[tuple[frozenset[str], str], ...]:
    """``(report labels, why)`` for each group of ops the default mapping keeps float: a
    transformer's own ops, the ops a CNN has too, the float activations. Residual adds, relus,
    dropouts and reshapes are in CNNs (ResNet, VGG, ShuffleNet): a CNN's report must not
    explain them by a transformer's LayerNorm and GELU."""
    from fxquant.config.pattern import pattern_str

    from fxquant_executorch.qconfig import FLOAT_ACTIVATIONS, FLOAT_RELUS, TRANSFORMER_FLOAT_OPS

    own = [
        nn.LayerNorm, F.layer_norm, nn.Softmax, F.softmax, torch.softmax, "softmax",
        nn.GELU, F.gelu, torch.matmul, operator.matmul, torch.bmm, "matmul",
        F.scaled_dot_product_attention, operator.truediv, torch.div, "div",
        operator.pow, torch.pow, "pow",
    ]  # fmt: skip
    shared = [op for op in (*TRANSFORMER_FLOAT_OPS, *FLOAT_RELUS) if op not in own]
    groups = ((own, _WHY_FLOAT), (shared, _WHY_FLOAT_CNN), (FLOAT_ACTIVATIONS, _WHY_FLOAT_ACT))
    return tuple((frozenset(f"({pattern_str(op)})" for op in ops), why) for ops, why in groups)


_WHY_FLOAT = (
    "the executorch default mapping keeps a transformer's LayerNorm, softmax, GELU, "
    "attention (its matmuls, sdpa, the scores' scaling), residual adds and reshapes, and "
    "standalone relus, float (fxquant_executorch.qconfig.TRANSFORMER_FLOAT_OPS, FLOAT_RELUS): "
    "its Linear layers return float (dynamic int8 per token), and int8 here XNNPACK would "
    "requantize the residual stream between them; XNNPACK runs them in float32"
)
_WHY_FLOAT_CNN = (
    "the executorch default mapping keeps residual adds, standalone relus, dropouts and "
    "reshapes float (fxquant_executorch.qconfig.TRANSFORMER_FLOAT_OPS, FLOAT_RELUS): XNNPACK "
    "runs them in float32 between the int8 ops around them (a relu fused into a conv stays "
    "int8 with it)"
)
_WHY_FLOAT_ACT = (
    "executorch has no int8 kernel for sigmoid, tanh, hardswish, hardsigmoid, SiLU, Mish "
    "or ELU (fxquant_executorch.qconfig.FLOAT_ACTIVATIONS): XNNPACK runs them in float32 "
    "between the int8 ops around them (ELU in the portable runtime)"
)


def explain_float(entry: NodeReport) -> NodeReport:
    """``entry`` with the default mapping's reason when it kept the node float.

    Example:
        >>> entry = NodeReport("norm", "call_module", None, None, "float",
        ...                    Reason(ReasonCode.QCONFIG_NONE, "norm (LayerNorm): qconfig is None"))
        >>> "TRANSFORMER_FLOAT_OPS" in explain_float(entry).reason.words
        True
    """
    reason = entry.reason
    if reason is None or reason.code != ReasonCode.QCONFIG_NONE:
        return entry
    why = next(
        (w for labels, w in _kept_float_words() if any(x in reason.words for x in labels)), None
    )
    if why is None:
        return entry
    words = f"{reason.words}; {why}"
    return dataclasses.replace(entry, reason=dataclasses.replace(reason, words=words))


def delegation_report(report: Report, found: Sequence[Placement]) -> Report:
    """The converted model's report, told where each node runs in the program.

    Quantized nodes whose ops all run in XNNPACK become ``lowered``; those with
    an op in the portable runtime stay ``reference`` with reason
    ``not_delegated``; float nodes in the portable runtime get that reason
    when they have none (a float node keeps the reason it was left float).
    A quantized node with no op left in the program (a dropout, a reshape
    folded away) counts as ``lowered``.

    Example:
        >>> entry = NodeReport("conv", "call_module", "Conv2d", "q", "reference")
        >>> where = [Placement("conv", ("aten::convolution",), (), ())]
        >>> str(delegation_report(Report([entry]), where).entries()[0].status)
        'lowered'
    """
    by_node = {p.node: p for p in found}
    entries = []
    for entry in report.entries():
        entry = explain_float(entry)
        placement = by_node.get(entry.node)
        quantized = entry.status in _QUANTIZED
        if quantized and (placement is None or placement.in_xnnpack):
            entry = dataclasses.replace(entry, status=NodeStatus.LOWERED, reason=None)
        elif placement is not None and not placement.in_xnnpack:
            reason = Reason(ReasonCode.NOT_DELEGATED, _words(entry, placement))
            if quantized:
                entry = dataclasses.replace(entry, status=NodeStatus.REFERENCE, reason=reason)
            elif entry.reason is None:
                entry = dataclasses.replace(entry, reason=reason)
        entries.append(entry)
    return Report(entries, report.unused())
