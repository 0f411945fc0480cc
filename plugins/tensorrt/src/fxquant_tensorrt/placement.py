"""The placement check: which Q/DQ of an ONNX model TensorRT fuses, and which it cannot.

TensorRT's explicit quantization runs a layer in int8 when each tensor it reads
comes from a DequantizeLinear, and fuses the Q/DQ pairs into the layers around
them. It cannot when a pair breaks its rules; the layer then runs in float
between standalone (de)quantize layers. The rules checked, per ONNX node::

    every Q/DQ            int8, zero point 0 (TensorRT has none), activations per tensor,
                          no Clip after a QuantizeLinear (a range narrower than int8's)
    weight DQ             int8 constant, zero point 0, per tensor or along the layer's
                          output channel (Conv 0, ConvTranspose 1, Gemm by transB, MatMul -1)
    Conv, Gemm, MatMul    each activation input from a DequantizeLinear, weights dequantized
    Add, Sub, Mul         each input from a DequantizeLinear, or straight from a conv/GEMM
                          (TensorRT fuses the add into it); a missing Q/DQ on one branch of
                          a residual add keeps the add out of the conv
    Concat                inputs and output on one scale (else TensorRT requantizes each input)
    pooling, reshapes,    input from a DequantizeLinear, output to a QuantizeLinear (TensorRT
    relu, clip, ...       moves Q/DQ across them); relu/clip right after a conv or add fuse

A node is *meant to be int8* when one of its inputs is dequantized or its output
is quantized; only those are checked (float ops are TensorRT's float layers).
``origins`` names the converted model's node each ONNX node came from, so
:meth:`Placement.report` speaks of the user's nodes, in ``fxquant.explain``'s form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fxquant.errors import FxquantError

from fxquant_tensorrt.rules import CHECKED, PROBLEMS, Checker, Finding, Graph

if TYPE_CHECKING:
    import onnx
    from fxquant.flow.report import Report
    from torch import fx

__all__ = ["PROBLEMS", "Finding", "Placement", "UnfusableQDQError", "check_placement"]


class UnfusableQDQError(FxquantError, ValueError):
    """``export_onnx(..., strict=True)``: TensorRT could not fuse some Q/DQ; lists every one."""


@dataclass(frozen=True)
class Placement:
    """The placement check of one ONNX model.

    Attributes:
        findings: every Q/DQ TensorRT could not fuse.
        int8_nodes: ONNX nodes meant to run in int8 (their Q/DQ fuse unless a finding says not).
        origins: ONNX node name -> converted model node name.
    """

    findings: tuple[Finding, ...]
    int8_nodes: tuple[str, ...]
    origins: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when TensorRT fuses every Q/DQ of the model."""
        return not self.findings

    def fused(self) -> list[str]:
        """The ONNX nodes TensorRT runs in int8 with their Q/DQ fused."""
        bad = {f.onnx_node for f in self.findings}
        return [name for name in self.int8_nodes if name not in bad]

    def raise_if_unfusable(self) -> None:
        """Raise :class:`UnfusableQDQError` listing every finding (strict mode)."""
        if self.ok:
            return
        lines = "\n".join(f"  [{f.problem}] {f.words}" for f in self.findings)
        msg = (
            f"TensorRT cannot fuse {len(self.findings)} Q/DQ placement(s) of this model:\n{lines}\n"
            "fix the qconfig mapping (int8, symmetric, per-channel weights), or pass strict=False "
            "to export anyway"
        )
        raise UnfusableQDQError(msg)

    def report(self, model: fx.GraphModule | None = None) -> Report:
        """The check in ``fxquant.explain``'s form (a ``fxquant.flow.report.Report``).

        With the converted ``model``: its own report, each quantized node
        ``lowered`` when TensorRT fuses its Q/DQ, else ``reference`` with
        reason ``qdq_not_fusable``. Without: one entry per ONNX node meant to
        be int8.
        """
        from fxquant_tensorrt.report import placement_report

        return placement_report(self, model)

    def __str__(self) -> str:
        head = (
            f"{len(self.fused())} of {len(self.int8_nodes)} int8 ONNX nodes fuse their Q/DQ"
            " by TensorRT's placement rules"
        )
        return "\n".join([head, *(f"  [{f.problem}] {f.words}" for f in self.findings)])


def check_placement(
    model: onnx.ModelProto,
    origins: Mapping[str, str] | None = None,
    *,
    sources: Mapping[str, str] | None = None,
    int8_origins: Iterable[str] | None = None,
) -> Placement:
    """Check where an ONNX model's Q/DQ sit against TensorRT's fusion rules.

    Args:
        model: the ONNX model (any: it need not come from fxquant).
        origins: ONNX node name -> the converted model's node name, as
            :func:`~fxquant_tensorrt.export_onnx` records it; nodes of one
            origin form one fused layer (conv -> relu).
        sources: converted node name -> the user's ``file:line``, for the words.
        int8_origins: the converted nodes quantized at prepare. When given, an
            ONNX node of any other origin is float on purpose and not checked;
            when not, a node is checked when it reads a dequantized tensor or
            its output is quantized.

    Returns:
        The :class:`Placement`: every finding, and which nodes run in int8.

    Example:
        >>> import onnx
        >>> from onnx import helper, TensorProto
        >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
        >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
        >>> s = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])
        >>> z = helper.make_tensor("z", TensorProto.INT8, [], [3])
        >>> nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
        ...          helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
        ...          helper.make_node("Relu", ["d"], ["y"], name="relu")]
        >>> graph = helper.make_graph(nodes, "g", [x], [y], [s, z])
        >>> placement = check_placement(helper.make_model(graph))
        >>> [(f.onnx_node, f.problem) for f in placement.findings]
        [('relu', 'zero_point')]
    """
    graph = Graph.of(model)
    wanted = set(int8_origins) if int8_origins is not None else None
    checker = Checker(graph, origins or {}, sources or {}, wanted)
    int8_nodes: list[str] = []
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            checker.check_qdq(node)
        elif node.op_type in CHECKED and checker.meant_int8(node):
            int8_nodes.append(node.name)
            checker.check_inputs(node)
            checker.check_output(node)
            if node.op_type == "Concat":
                checker.check_concat(node)
    return Placement(tuple(_unique(checker.findings)), tuple(int8_nodes), dict(origins or {}))


def _unique(findings: Iterable[Finding]) -> list[Finding]:
    # a Q and its DQ state the same zero point: say it once per node and problem
    seen: set[tuple[str, str]] = set()
    kept = []
    for finding in findings:
        key = (finding.onnx_node, finding.problem)
        if key not in seen:
            seen.add(key)
            kept.append(finding)
    return kept
