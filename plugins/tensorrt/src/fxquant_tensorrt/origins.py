"""Which node of the converted model each ONNX node came from.

``torch.export`` and every pass after it (decompositions, the ONNX exporter's own
program) record provenance in ``node.meta["from_node"]``, one level per pass; the
ONNX exporter names each ONNX node's FX node in its ``pkg.torch.onnx.fx_node``
metadata. Together they lead from an ONNX node to the user's node::

    ONNX "node_view" -> "view" (decomposed) -> "flatten" (exported) -> "flatten" (converted)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
    from torch import fx
    from torch.export import ExportedProgram

__all__ = ["consumer_origin", "converted_origin", "onnx_origins"]


def converted_origin(node: fx.Node, names: set[str]) -> str | None:
    """The converted model's node ``node`` (of an exported program) came from, if any.

    ``node.meta["from_node"]`` is a chain: the decomposed program's node comes
    from the exported program's, which comes from the converted model's. The
    deepest name that is a node of the converted model wins (a decomposition
    may rename: ``flatten`` becomes ``view``).

    Example:
        >>> import torch
        >>> node = next(iter(torch.fx.symbolic_trace(torch.nn.ReLU()).graph.nodes))
        >>> converted_origin(node, {"x"}) is None  # a traced node has no chain
        True
    """
    found: str | None = None
    depth_found = -1
    stack = [(source, 0) for source in node.meta.get("from_node") or []]
    while stack:
        source, depth = stack.pop()
        name = getattr(source, "name", None)
        if isinstance(name, str) and name in names and depth > depth_found:
            found, depth_found = name, depth
        stack += [(inner, depth + 1) for inner in getattr(source, "from_node", None) or []]
    return found


def consumer_origin(node: fx.Node, names: set[str]) -> str | None:
    # a quantize step (or a choose_qparams) has no origin of its own: name the first node
    # downstream that has one (through getitem, quantize and dequantize steps)
    frontier, seen = list(node.users), set()
    while frontier:
        user = frontier.pop(0)
        if user in seen:
            continue
        seen.add(user)
        found = converted_origin(user, names)
        if found is not None:
            return found
        frontier += list(user.users)
    return None


_FX_NODE = re.compile(r"^%(\S+) :")


def onnx_origins(
    onnx_model: onnx.ModelProto, program: ExportedProgram, names: set[str]
) -> dict[str, str]:
    """ONNX node name -> converted node name, via the exporter's ``pkg.torch.onnx.fx_node`` field.

    Example:
        >>> # see export_onnx
    """
    by_name = {n.name: n for n in program.graph.nodes}
    origins: dict[str, str] = {}
    for onnx_node in onnx_model.graph.node:
        props = {p.key: p.value for p in onnx_node.metadata_props}
        match = _FX_NODE.match(props.get("pkg.torch.onnx.fx_node", ""))
        fx_node = by_name.get(match.group(1)) if match else None
        origin = converted_origin(fx_node, names) if fx_node is not None else None
        if origin is not None:
            origins[onnx_node.name] = origin
    return origins
