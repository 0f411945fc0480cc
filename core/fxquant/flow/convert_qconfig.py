"""Convert's ``qconfig_mapping`` argument: turn quantization off for some nodes at convert.

As in torch.ao, the mapping given to convert may only repeat prepare's qconfigs
or set them to ``None``. A node whose qconfig becomes ``None`` is converted as
float: its weighted module is not swapped, it is not lowered, and an observer
whose producer and consumers are all float is removed instead of becoming a
quantize/dequantize pair. Other qconfigs stay those chosen at prepare.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.fx import GraphModule, Node

from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow.convert_copy import ModelCopy
from fxquant.flow.convert_modules import is_observer
from fxquant.flow.qconfig_assign import assign_qconfigs
from fxquant.flow.report import NodeStatus, Reason, ReasonCode, Report
from fxquant.flow.state import node_info, update_info

__all__ = ["converted_report", "turn_off", "turned_off_nodes"]


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


def turn_off(model: ModelCopy, names: set[str]) -> set[Node]:
    """Clear the qconfig (and dtype config) of the nodes named ``names``, in a graph's copy;
    return the observer nodes next to one of them whose neighbours are all float now.

    Example:
        >>> # see turned_off_nodes
    """
    for node in model.graph.nodes:
        if node.name in names:  # quantized at prepare: each has its NodeInfo
            update_info(node, qconfig=None, dtype_config=None)

    def beside_turned_off(node: Node) -> bool:
        neighbours = [*node.all_input_nodes, *node.users]
        turned = any(n.name in names for n in neighbours)
        return turned and not any(node_info(n).quantized for n in neighbours)

    calls = [n for n in model.graph.nodes if n.op == "call_module"]
    return {n for n in calls if is_observer(model.modules[str(n.target)]) and beside_turned_off(n)}


def converted_report(
    report: Report, turned_off: set[str], observers: dict[str, list[str]], stays_float: set[str]
) -> Report:
    """Prepare's report as convert leaves it: quantized nodes ``reference``, and every node
    kept float ``skipped``: ``qconfig_none`` for those the convert ``qconfig_mapping`` turned
    off, ``not_calibrated`` (naming the observer) for those ``stays_float`` holds for a
    never-calibrated observer.

    Example:
        >>> converted_report(Report(), set(), {}, set()).entries()
        []
    """
    # the first observer that names each node (reversed: a dict keeps the last write)
    by_node = {node: obs for obs, nodes in reversed(observers.items()) for node in nodes}
    words = "saw no finite value (the model was not calibrated, or not on this path): kept float"
    reasons = {
        n: Reason(ReasonCode.NOT_CALIBRATED, f"{n}: observer {by_node[n]} {words}")
        for n in stays_float
    }
    none = "the qconfig_mapping given to convert sets its qconfig to None"
    reasons |= {n: Reason(ReasonCode.QCONFIG_NONE, f"{n}: {none}") for n in turned_off}
    quantized = [e.node for e in report.entries() if e.status == NodeStatus.QUANTIZED]
    changes: dict[str, dict[str, Any]] = {n: {"status": NodeStatus.REFERENCE} for n in quantized}
    changes |= {n: {"status": NodeStatus.SKIPPED, "reason": why} for n, why in reasons.items()}
    return report.with_changes(changes)
