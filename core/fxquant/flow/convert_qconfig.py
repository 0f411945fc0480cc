"""Convert's ``qconfig_mapping`` argument: turn quantization off for some nodes at convert.

As in torch.ao, the mapping given to convert may only repeat prepare's qconfigs
or set them to ``None``. A node whose qconfig becomes ``None`` is converted as
float: its weighted module is not swapped, it is not lowered, and an observer
whose producer and consumers are all float is removed instead of becoming a
quantize/dequantize pair. Other qconfigs stay those chosen at prepare.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn
from torch.fx import Graph, GraphModule, Node

from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow.convert_modules import is_observer
from fxquant.flow.qconfig_assign import assign_qconfigs
from fxquant.flow.report import NodeStatus, Reason, ReasonCode, Report
from fxquant.flow.state import node_info, update_info

__all__ = [
    "float_observers",
    "report_not_calibrated",
    "report_turned_off",
    "turn_off",
    "turned_off_nodes",
]


def turned_off_nodes(
    gm: GraphModule, modules: dict[str, nn.Module], mapping: QConfigMapping | None
) -> set[str]:
    """Names of the nodes quantized at prepare whose qconfig ``mapping`` sets to ``None``.

    Example:
        >>> # see tests/flow/test_convert.py: a None qconfig at convert keeps a node float
    """
    if mapping is None:
        return set()
    assignment = assign_qconfigs(gm, modules, mapping)
    return {
        node.name
        for node, qconfig in assignment.qconfigs.items()
        if qconfig is None and node_info(node).quantized
    }


def turn_off(graph: Graph, names: set[str]) -> None:
    """Clear the qconfig (and dtype config) of the nodes named ``names``, in a graph's copy.

    Example:
        >>> # see turned_off_nodes
    """
    for node in graph.nodes:
        if node.name in names:  # quantized at prepare: each has its NodeInfo
            update_info(node, qconfig=None, dtype_config=None)


def float_observers(graph: Graph, modules: dict[str, nn.Module], turned_off: set[str]) -> set[Node]:
    """Observer nodes next to a turned-off node whose neighbours are all float now.

    Example:
        >>> # see apply_convert_qconfigs
    """
    found: set[Node] = set()
    if not turned_off:
        return found
    for node in graph.nodes:
        if node.op != "call_module" or not is_observer(modules[str(node.target)]):
            continue
        neighbours = [*node.all_input_nodes, *node.users]
        if any(n.name in turned_off for n in neighbours) and not any(
            node_info(n).quantized for n in neighbours
        ):
            found.add(node)
    return found


def report_turned_off(report: Report, turned_off: set[str]) -> Report:
    """The report with every turned-off node ``skipped`` for ``qconfig_none``.

    Example:
        >>> report_turned_off(Report(), set()).entries()
        []
    """
    words = "the qconfig_mapping given to convert sets its qconfig to None"
    return _skipped(
        report, {n: Reason(ReasonCode.QCONFIG_NONE, f"{n}: {words}") for n in turned_off}
    )


def _skipped(report: Report, reasons: Mapping[str, Reason]) -> Report:
    """The report with the entry of every node in ``reasons`` skipped for its reason."""
    return report.with_changes(
        {node: {"status": NodeStatus.SKIPPED, "reason": why} for node, why in reasons.items()}
    )


def report_not_calibrated(
    report: Report, observers: dict[str, list[str]], stays_float: set[str]
) -> Report:
    """The report with every node kept float for a never-calibrated observer ``skipped``
    for ``not_calibrated``, naming the observer.

    Example:
        >>> report_not_calibrated(Report(), {}, set()).entries()
        []
    """
    # the first observer that names each node (reversed: a dict keeps the last write)
    by_node = {node: obs for obs, nodes in reversed(observers.items()) for node in nodes}
    words = "saw no finite value (the model was not calibrated, or not on this path): kept float"
    reasons = {
        n: Reason(ReasonCode.NOT_CALIBRATED, f"{n}: observer {by_node[n]} {words}")
        for n in stays_float
    }
    return _skipped(report, reasons)
