"""The placement check in ``fxquant.explain``'s form: one entry per node of the converted model.

converted node quantized, its Q/DQ fuse       lowered
converted node quantized, a Q/DQ does not     reference, reason qdq_not_fusable (the
                                              findings' words: node, Q/DQ, source line)
skipped or float at prepare                   as prepare reported it
a finding no converted node owns              an entry named after the ONNX node
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import TYPE_CHECKING

from fxquant.flow.report import NodeReport, NodeStatus, Reason, ReasonCode, Report

if TYPE_CHECKING:
    from torch import fx

    from fxquant_tensorrt.placement import Finding, Placement

__all__ = ["placement_report"]

_QUANTIZED = (NodeStatus.QUANTIZED, NodeStatus.REFERENCE, NodeStatus.LOWERED)


def _reason(findings: list[Finding]) -> Reason:
    words = "; ".join(f.words for f in findings)
    return Reason(ReasonCode.QDQ_NOT_FUSABLE, words, field=findings[0].problem, bound="TensorRT")


def placement_report(placement: Placement, model: fx.GraphModule | None = None) -> Report:
    """The report of ``placement``, over ``model``'s own report when given.

    Example:
        >>> from fxquant_tensorrt.placement import Placement
        >>> placement = Placement((), ("node_conv",), {"node_conv": "conv"})
        >>> str(placement_report(placement).entries()[0].status)
        'lowered'
    """
    by_node: dict[str, list[Finding]] = defaultdict(list)
    for finding in placement.findings:
        by_node[finding.node or finding.onnx_node].append(finding)
    entries: list[NodeReport] = []
    if model is not None:
        import fxquant

        for entry in fxquant.explain(model, show=False).entries():
            if entry.status in _QUANTIZED:
                found = by_node.pop(entry.node, [])
                status, reason = (
                    (NodeStatus.REFERENCE, _reason(found)) if found else (NodeStatus.LOWERED, None)
                )
                entry = dataclasses.replace(entry, status=status, reason=reason)
            entries.append(entry)
    else:
        for name in placement.int8_nodes:
            node = placement.origins.get(name, name)
            if any(e.node == node for e in entries):
                continue
            found = by_node.pop(node, [])
            status, reason = (
                (NodeStatus.REFERENCE, _reason(found)) if found else (NodeStatus.LOWERED, None)
            )
            entries.append(NodeReport(node, "onnx", None, None, status, reason))
    # what is left: findings at a node prepare left float (a Q/DQ it reads is wrong), or at
    # ONNX nodes no converted node owns; one entry per node, the node's own one if it has one
    own = {entry.node: index for index, entry in enumerate(entries)}
    for name, found in by_node.items():
        if name in own:
            entry = entries[own[name]]
            entries[own[name]] = dataclasses.replace(
                entry, status=NodeStatus.REFERENCE, reason=_reason(found)
            )
        else:
            entries.append(
                NodeReport(name, "onnx", None, None, NodeStatus.REFERENCE, _reason(found))
            )
    return Report(entries)
