"""The deployed model: the exported ONNX model in an onnxruntime CPU session.

onnxruntime is the CPU-side proof that the Q/DQ placement is consumable by a
runtime that fuses Q/DQ: its optimizer rewrites ``DequantizeLinear -> Conv ->
QuantizeLinear`` into ``QLinearConv`` (and Gemm into ``QGemm``, MatMul into
``QLinearMatMul``, Add into ``QLinearAdd``). On x86 it fuses groups with int8
activations (s8s8) only when asked (``session.qdqisint8allowed``; uint8 ones by
default): TensorRT's int8 activations need it. What it fused is in
:attr:`OnnxRuntimeModel.fused_ops`. It is a consumability check, not TensorRT's speed.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from fxquant.flow.deployed import DeployedModel
from fxquant.flow.report import Report
from torch.utils import _pytree as pytree

from fxquant_tensorrt.onnx_export import OnnxExport, export_onnx
from fxquant_tensorrt.placement import check_placement

if TYPE_CHECKING:
    from torch import fx

__all__ = ["FUSED_OPS", "OnnxRuntimeModel", "deploy", "session_options"]

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
        self._report = exported.placement.report(converted) if report is None else report
        self._inputs = [i.name for i in self.session.get_inputs()]

    @property
    def report(self) -> Report:
        """Per node of the converted model: its Q/DQ fused by TensorRT (lowered), or why not."""
        return self._report

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
