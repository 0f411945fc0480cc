"""The deployed model: the exported ONNX model in an onnxruntime CPU session.

onnxruntime is the CPU-side proof that the Q/DQ placement is consumable by a
runtime that fuses Q/DQ: its optimizer rewrites ``DequantizeLinear -> Conv ->
QuantizeLinear`` into ``QLinearConv`` (and Gemm into ``QGemm``, MatMul into
``QLinearMatMul``, Add into ``QLinearAdd``). On x86 it fuses groups with int8
activations (s8s8) only when asked (``session.qdqisint8allowed``; uint8 ones by
default): TensorRT's int8 activations need it. What it fused is in
:attr:`OnnxRuntimeModel.fused_ops`. It is a consumability check, not TensorRT's speed.

The deployed model's ``report`` says what onnxruntime ran: the placement check (what
TensorRT fuses), then, per node it calls ``lowered``, the kernels of onnxruntime's
optimized graph that node became (:attr:`OnnxRuntimeModel.kernels`). A node that
onnxruntime runs in float between its Q/DQ (a conv with a ReLU before its
QuantizeLinear becomes ``FusedConv``; a float-output GEMM stays ``Gemm``) is
``reference`` with reason ``qdq_not_fusable`` and the kernels named::

    placement: _0 lowered   onnxruntime: node_conv2d FusedConv (float)  -> _0 reference
    placement: _3 lowered   onnxruntime: node_max_pool2d MaxPool (int8)  -> _3 lowered
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from fxquant.flow.deployed import DeployedModel
from fxquant.flow.report import NodeStatus, Reason, ReasonCode, Report
from torch.utils import _pytree as pytree

from fxquant_tensorrt.onnx_export import OnnxExport, export_onnx
from fxquant_tensorrt.placement import check_placement

if TYPE_CHECKING:
    import onnx
    from torch import fx

__all__ = [
    "FUSED_OPS",
    "Kernel",
    "OnnxRuntimeModel",
    "deploy",
    "kernels_by_node",
    "session_options",
]

FUSED_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QGemm",
        "QLinearAdd",
        "QLinearMul",
        "QLinearConcat",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearLeakyRelu",
        "QLinearSigmoid",
        "MatMulIntegerToFloat",
        "ConvInteger",
        "MatMulInteger",
    }
)
"""onnxruntime's quantized ops: a Q/DQ group it fused into one integer kernel."""

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
_FLOAT_RESULT_OPS = frozenset({"MatMulIntegerToFloat", "DynamicQuantizeMatMul"})
# onnxruntime names a node it rewrites after the one it replaced, plus "_token_<n>" or
# "/<fusion>" ("node_MatMul_9/MatMulAddFusion")
_RENAMED = re.compile(r"(/.*|_token_\d+)$")


@dataclass(frozen=True, slots=True)
class Kernel:
    """One node of onnxruntime's optimized graph: its name, op type, and whether it
    computes on integers (a fused QLinear*/QGemm op, or a pooling/reshape of int8 values)."""

    onnx_node: str
    op_type: str
    integer: bool

    def __str__(self) -> str:
        return f"{self.onnx_node} {self.op_type} ({'int8' if self.integer else 'float'})"


def kernels_by_node(graph: onnx.GraphProto, origins: Mapping[str, str]) -> dict[str, list[Kernel]]:
    """The converted model's node -> the kernels onnxruntime's optimized ``graph`` runs for it.

    ``origins`` maps the exported ONNX nodes to the converted model's nodes
    (:class:`~fxquant_tensorrt.placement.Placement`). Quantize/dequantize steps and
    nodes of no origin (layout transposes onnxruntime adds) are left out.

    Example:
        >>> from onnx import helper
        >>> nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q"),
        ...          helper.make_node("MaxPool", ["q"], ["p"], name="node_pool"),
        ...          helper.make_node("DequantizeLinear", ["p", "s"], ["d"], name="dq"),
        ...          helper.make_node("FusedConv", ["d"], ["y"], name="node_conv_token_3"),
        ...          helper.make_node("Gemm", ["y"], ["z"], name="node_mm/MatMulAddFusion")]
        >>> graph = helper.make_graph(nodes, "g", [], [])
        >>> origins = {"node_pool": "pool", "node_conv": "conv", "node_mm": "fc"}
        >>> for node, kernels in kernels_by_node(graph, origins).items():
        ...     print(node, *kernels)
        pool node_pool MaxPool (int8)
        conv node_conv_token_3 FusedConv (float)
        fc node_mm/MatMulAddFusion Gemm (float)
    """
    integers: set[str] = set()
    found: dict[str, list[Kernel]] = {}
    for node in graph.node:
        fused = node.op_type in FUSED_OPS
        reads_integers = bool(node.input) and node.input[0] in integers
        keeps_integers = node.op_type not in _FLOAT_RESULT_OPS | {"DequantizeLinear"}
        if node.op_type == "QuantizeLinear" or ((fused or reads_integers) and keeps_integers):
            integers.update(node.output)
        origin = origins.get(_RENAMED.sub("", node.name))
        if origin is not None and node.op_type not in _QDQ_OPS:
            found.setdefault(origin, []).append(
                Kernel(node.name, node.op_type, fused or reads_integers)
            )
    return found


def session_options(optimized_path: str | None = None) -> Any:
    """onnxruntime options: QDQ fusion (int8 on x86 too), PyTorch's thread count.

    Example:
        >>> session_options().get_session_config_entry("session.qdqisint8allowed")
        '1'
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    # ALL: the QDQ fusion (EXTENDED) plus the CPU layout transforms (NCHWc, NHWC for
    # QLinearConv) that make onnxruntime's own fp32 models fast: the two compare like for like
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # onnxruntime fuses int8 (s8s8) QDQ groups on ARM only unless told; TensorRT's activations
    # are int8, so without this its x86 session would run every conv in float between Q/DQ
    options.add_session_config_entry("session.qdqisint8allowed", "1")
    options.log_severity_level = 3  # errors only: no warning per session on stderr
    # as many threads as PyTorch uses here: a latency compared with PyTorch's is like for like
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    if optimized_path is not None:
        options.optimized_model_filepath = optimized_path
    return options


class OnnxRuntimeModel(DeployedModel):
    """An exported model running in onnxruntime (CPU): a ``fxquant`` ``Deployed``.

    Called with the model's positional inputs (torch tensors), it returns what
    the converted model returns, as torch tensors. ``report`` is the TensorRT
    placement check in ``explain`` form (``explain()`` prints it); ``fused_ops``
    counts the integer ops in onnxruntime's optimized graph. ``save(path)``
    writes the ONNX model (what TensorRT's parser reads) and
    ``PATH.fxquant.json``; ``OnnxRuntimeModel.load(path)`` reads them back.

    Example:
        >>> # see deploy()
    """

    def __init__(
        self,
        exported: OnnxExport,
        converted: fx.GraphModule | None = None,
        *,
        report: Report | None = None,
    ) -> None:
        import onnx
        import onnxruntime as ort

        self.exported = exported
        with tempfile.TemporaryDirectory() as folder:
            optimized = str(Path(folder) / "optimized.onnx")
            self.session = ort.InferenceSession(
                exported.serialized(),
                session_options(optimized),
                providers=["CPUExecutionProvider"],
            )
            graph = onnx.load(optimized).graph
        self.optimized_ops: Counter[str] = Counter(node.op_type for node in graph.node)
        self.kernels: dict[str, list[Kernel]] = kernels_by_node(graph, exported.placement.origins)
        """Per converted node, the kernels onnxruntime ran for it (see :func:`kernels_by_node`)."""
        self._target_report: Report = exported.placement.report(converted)
        self._report: Report = (
            _what_ran(self._target_report, self.kernels) if report is None else report
        )
        self._inputs = [i.name for i in self.session.get_inputs()]

    @property
    def report(self) -> Report:
        """Per node of the converted model: ``lowered`` when TensorRT fuses its Q/DQ and
        onnxruntime ran it on integers; else ``reference`` and why (module docstring)."""
        return self._report

    @property
    def target_report(self) -> Report:
        """What TensorRT itself would run, by its Q/DQ placement rules: each quantized node
        ``lowered`` when TensorRT fuses its Q/DQ. :attr:`report` says what onnxruntime, which
        stands in for TensorRT on the CPU, ran; ``fxquant check`` reads this one."""
        return self._target_report

    def kernel_summary(self) -> str:
        """What onnxruntime ran for each node the placement check finds int8, one line each.

        A node with no kernel of its own was folded into its neighbours (a transpose
        into the matmul reading it), so nothing of it runs in float.

        Example:
            >>> # on a conv -> relu -> maxpool CNN:
            >>> # onnxruntime ran 1 of 2 int8 nodes on integers only
            >>> #   _0: node_conv2d FusedConv (float)
            >>> #   _3: node_max_pool2d MaxPool (int8)
        """
        placement = self.exported.placement
        nodes = list(dict.fromkeys(placement.origins.get(n, n) for n in placement.int8_nodes))
        integer = [node for node in nodes if all(k.integer for k in self.kernels.get(node, ()))]
        lines = [f"onnxruntime ran {len(integer)} of {len(nodes)} int8 nodes on integers only"]
        for node in nodes:
            ran = ", ".join(map(str, self.kernels.get(node, ()))) or "folded into its neighbours"
            lines.append(f"  {node}: {ran}")
        return "\n".join(lines)

    suffix = ".onnx"

    def save_artifact(self, path: Path, **options: Any) -> Mapping[str, Any]:
        """The ONNX model at ``path``; its output structure goes in the report file."""
        if options:
            msg = f"OnnxRuntimeModel.save(path) takes no options, got {sorted(options)}"
            raise TypeError(msg)
        path.write_bytes(self.exported.serialized())
        spec = self.exported.out_spec
        return {"out_spec": None if spec is None else pytree.treespec_dumps(spec)}

    @classmethod
    def load_artifact(
        cls, path: Path, report: Report, extras: Mapping[str, Any]
    ) -> OnnxRuntimeModel:
        """The ONNX model at ``path`` in a new session, its placement checked again."""
        import onnx

        model = onnx.load(str(path))
        spec = extras.get("out_spec")
        out_spec = None if spec is None else pytree.treespec_loads(spec)
        exported = OnnxExport(model, {}, check_placement(model), path, out_spec)
        return cls(exported, report=report)

    @property
    def fused_ops(self) -> Counter[str]:
        """onnxruntime's integer ops in its optimized graph, by op type."""
        return Counter({op: n for op, n in self.optimized_ops.items() if op in FUSED_OPS})

    def __call__(self, *inputs: Any) -> Any:
        """Run the model on ``inputs`` (tensors, in the converted model's order)."""
        flat = [x for x in pytree.tree_leaves(inputs) if isinstance(x, torch.Tensor)]
        if len(flat) != len(self._inputs):
            msg = (
                f"the deployed model takes {len(self._inputs)} tensor input(s) "
                f"({', '.join(self._inputs)}), got {len(flat)}"
            )
            raise TypeError(msg)
        for spec, x in zip(self.session.get_inputs(), flat, strict=True):
            fixed = [(i, d) for i, d in enumerate(spec.shape) if isinstance(d, int)]
            if x.dim() != len(spec.shape) or any(x.shape[i] != d for i, d in fixed):
                msg = (
                    f"input {spec.name!r} has shape {tuple(x.shape)}, the exported model takes "
                    f"{tuple(spec.shape)} (names are dynamic dimensions); export with "
                    "dynamic_shapes (e.g. a torch.export.Dim for the batch) to take others"
                )
                raise ValueError(msg)
        feeds = {name: x.detach().cpu().numpy() for name, x in zip(self._inputs, flat, strict=True)}
        outputs = [torch.from_numpy(array) for array in self.session.run(None, feeds)]
        if self.exported.out_spec is None:
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        return pytree.tree_unflatten(outputs, self.exported.out_spec)


def _what_ran(report: Report, kernels: Mapping[str, list[Kernel]]) -> Report:
    """``report`` with each ``lowered`` node that onnxruntime ran in float ``reference``."""
    for entry in report.entries():
        floats = [k for k in kernels.get(entry.node, ()) if not k.integer]
        if entry.status != NodeStatus.LOWERED or not floats:
            continue
        ran = ", ".join(f"{k.onnx_node} as {k.op_type}" for k in floats)
        words = (
            f"{entry.node}: onnxruntime ran {ran} in float, on dequantized values: its CPU"
            " optimizer fused no integer kernel for it (TensorRT fuses these Q/DQ: the"
            " placement check passes)"
        )
        reason = Reason(
            ReasonCode.QDQ_NOT_FUSABLE, words, field="float_kernel", bound="onnxruntime"
        )
        report = report.with_entry(
            dataclasses.replace(entry, status=NodeStatus.REFERENCE, reason=reason)
        )
    return report


def deploy(
    model: fx.GraphModule,
    example_inputs: tuple[Any, ...],
    *,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | None = None,
) -> OnnxRuntimeModel:
    """Export ``model`` (``convert_fx`` with tensorrt) to ONNX and load it in onnxruntime.

    The ONNX model takes inputs of the shapes of ``example_inputs``, but for the
    dimensions ``dynamic_shapes`` (as ``torch.export`` takes it) makes dynamic.

    Example:
        >>> import fxquant
        >>> conv = torch.nn.Conv2d
        >>> model = torch.nn.Sequential(conv(3, 4, 3), conv(4, 4, 3)).eval()
        >>> x = (torch.randn(2, 3, 8, 8),)
        >>> prepared = fxquant.prepare_fx(model, fxquant.get_default_qconfig_mapping("tensorrt"),
        ...     x, backend_config=fxquant.get_backend_config("tensorrt"))
        >>> _ = prepared(*x)
        >>> deployed = deploy(fxquant.convert_fx(prepared), x)
        >>> deployed(*x).shape, dict(deployed.fused_ops)  # onnxruntime fused each Q/DQ conv
        (torch.Size([2, 4, 4, 4]), {'QLinearConv': 2})
        >>> [(e.node, str(e.status)) for e in deployed.report.entries()][1]
        ('_0', 'lowered')
    """
    return OnnxRuntimeModel(
        export_onnx(model, example_inputs, dynamic_shapes=dynamic_shapes), model
    )
