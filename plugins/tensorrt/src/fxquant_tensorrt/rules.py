"""The rules of the placement check, over one ONNX graph (see :mod:`fxquant_tensorrt.placement`).

``Graph`` indexes the ONNX graph once (producers, consumers, constants, element
types); ``Checker`` applies TensorRT's rules node by node and collects
:class:`Finding` records, each anchored at the layer that reads the Q/DQ.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["CHECKED", "PROBLEMS", "Checker", "Finding", "Graph"]

PROBLEMS = (
    "missing_qdq",
    "zero_point",
    "not_int8",
    "per_channel_activation",
    "narrow_range",
    "weight_axis",
    "float_weight",
    "scale_mismatch",
    "output_not_quantized",
)
"""What a finding can say is wrong (``Finding.problem``)."""

_WEIGHTED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul"})
_EPILOGUE = frozenset({"Relu", "Clip", "LeakyRelu", "BatchNormalization"})
_MOVES_QDQ = frozenset(
    {
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "ReduceMean",
        "ReduceMax",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Relu",
        "Clip",
        "Resize",
        "Slice",
        "Identity",
        "Split",
        "Expand",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
    }
)
CHECKED = _WEIGHTED | _ELEMENTWISE | _MOVES_QDQ | {"Concat"}
_NOT_DATA = frozenset({"Constant", "Shape", "ConstantOfShape", "Range", "Size"})
_INT8, _UINT8 = 3, 2  # onnx.TensorProto.INT8, UINT8
_FLOATS = frozenset({1, 10, 11, 16})  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass(frozen=True, slots=True)
class Finding:
    """One Q/DQ TensorRT could not fuse.

    Attributes:
        onnx_node: the ONNX node the problem is at.
        node: the converted model's node it came from (``None`` when unknown).
        problem: one of :data:`PROBLEMS`.
        words: the sentence users read (names the node, the Q/DQ and the source line).

    Example:
        >>> Finding("node_add", "add", "missing_qdq", "add: input 1 ...").problem
        'missing_qdq'
    """

    onnx_node: str
    node: str | None
    problem: str
    words: str

    def __post_init__(self) -> None:
        if self.problem not in PROBLEMS:
            msg = f"Finding problem {self.problem!r} is not one of {', '.join(PROBLEMS)}"
            raise ValueError(msg)


# --- the graph, as the checks need it ---------------------------------------------------------


@dataclass
class Graph:
    producer: dict[str, Any]
    consumers: dict[str, list[Any]]
    constants: dict[str, np.ndarray]
    types: dict[str, int]
    graph_inputs: set[str]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> Graph:
        import onnx
        from onnx import numpy_helper

        graph = model.graph
        producer = {out: node for node in graph.node for out in node.output}
        consumers: dict[str, list[Any]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                consumers[name].append(node)
        constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant":
                for attribute in node.attribute:
                    if attribute.name == "value":
                        constants[node.output[0]] = numpy_helper.to_array(attribute.t)
        try:
            inferred = onnx.shape_inference.infer_shapes(model).graph
        except Exception:  # types are a help, not a need: unknown ones count as float
            inferred = graph
        types = {
            v.name: v.type.tensor_type.elem_type
            for v in (*inferred.input, *inferred.value_info, *inferred.output)
        }
        types.update({name: _np_type(value) for name, value in constants.items()})
        return cls(producer, consumers, constants, types, {v.name for v in graph.input})

    def node_of(self, tensor: str) -> Any:
        return self.producer.get(tensor)

    def is_data(self, tensor: str) -> bool:
        """A float activation: not a constant, not a shape, not an integer tensor."""
        if not tensor or tensor in self.constants:
            return False
        node = self.producer.get(tensor)
        if node is not None and node.op_type in _NOT_DATA:
            return False
        kind = self.types.get(tensor, 0)
        return kind == 0 or kind in _FLOATS

    def dequantized(self, tensor: str) -> bool:
        node = self.producer.get(tensor)
        return node is not None and node.op_type == "DequantizeLinear"

    def quantized(self, tensor: str) -> bool:
        return any(c.op_type == "QuantizeLinear" for c in self.consumers.get(tensor, ()))


def _np_type(value: np.ndarray) -> int:
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(value.dtype))


def _attr(node: Any, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return default


# --- the checks -------------------------------------------------------------------------------


class Checker:
    def __init__(
        self,
        graph: Graph,
        origins: Mapping[str, str],
        sources: Mapping[str, str],
        int8_origins: set[str] | None,
    ) -> None:
        self.graph = graph
        self.origins = origins
        self.sources = sources
        self.int8_origins = int8_origins
        self.findings: list[Finding] = []

    def who(self, node: Any) -> str:
        """How a finding names a node: the converted node, its source line, the ONNX node."""
        origin = self.origins.get(node.name)
        if origin is None:
            return f"{node.op_type} {node.name!r}"
        source = self.sources.get(origin)
        at = f", {source}" if source else ""
        return f"{origin!r} ({node.op_type} {node.name!r}{at})"

    def add(self, node: Any, problem: str, words: str) -> None:
        finding = Finding(
            node.name, self.origins.get(node.name), problem, f"{self.who(node)}: {words}"
        )
        self.findings.append(finding)

    def same_group(self, a: Any, b: Any) -> bool:
        origin = self.origins.get(a.name)
        return origin is not None and origin == self.origins.get(b.name)

    def describe(self, tensor: str) -> str:
        node = self.graph.node_of(tensor)
        if node is None:
            return f"graph input {tensor!r}"
        return f"{tensor!r} from {self.who(node)}"

    # -- per-node rules

    def meant_int8(self, node: Any) -> bool:
        origin = self.origins.get(node.name)
        if self.int8_origins is not None and origin is not None:
            # the converted model says: a node left float on purpose (qconfig None) reading a
            # dequantized tensor is a float layer after a standalone DQ, not a missing Q/DQ
            return origin in self.int8_origins
        data = [t for t in node.input if self.graph.is_data(t)]
        return any(self.graph.dequantized(t) for t in data) or any(
            self.graph.quantized(t) for t in node.output
        )

    def input_fused(self, node: Any, tensor: str) -> bool:
        producer = self.graph.node_of(tensor)
        if self.graph.dequantized(tensor):
            return True
        if producer is None:
            return False
        if self.same_group(producer, node):
            return True  # conv -> relu inside one converted node: TensorRT fuses the chain
        if node.op_type in _ELEMENTWISE | _EPILOGUE and producer.op_type in _WEIGHTED:
            return True  # conv -> add (residual fusion), conv -> relu
        return node.op_type in _EPILOGUE and producer.op_type in _ELEMENTWISE

    def check_inputs(self, node: Any) -> None:
        positions = (0, 1) if node.op_type in _WEIGHTED else range(len(node.input))
        for position in positions:
            if position >= len(node.input):
                continue
            tensor = node.input[position]
            if tensor in self.graph.constants and node.op_type in _WEIGHTED and position == 1:
                self.add(
                    node,
                    "float_weight",
                    f"its weight {tensor!r} is a float constant with no DequantizeLinear: "
                    "TensorRT runs the layer in float (quantize the weight)",
                )
                continue
            if not self.graph.is_data(tensor) or self.input_fused(node, tensor):
                continue
            self.add(
                node,
                "missing_qdq",
                f"input {position} ({self.describe(tensor)}) has no QuantizeLinear/"
                "DequantizeLinear: TensorRT cannot run this "
                f"{node.op_type} in int8 nor fuse it; quantize that input too",
            )

    def check_output(self, node: Any) -> None:
        if node.op_type in _WEIGHTED or not node.output:
            return  # int8 in, float out is a valid TensorRT layer
        readers = self.graph.consumers.get(node.output[0], [])
        if self.graph.quantized(node.output[0]) or any(self.same_group(node, r) for r in readers):
            return
        if any(r.op_type in _ELEMENTWISE | _EPILOGUE for r in readers):
            return  # an add/relu reading it decides (it is checked itself)
        if not readers:
            return  # a graph output: TensorRT dequantizes there anyway
        self.add(
            node,
            "output_not_quantized",
            f"its output {node.output[0]!r} has no QuantizeLinear: its input DequantizeLinear "
            "runs as a standalone layer and the op in float",
        )

    def check_concat(self, node: Any) -> None:
        grids = {self.grid_of(t) for t in node.input if self.graph.dequantized(t)}
        output_q = [
            c for c in self.graph.consumers.get(node.output[0], []) if c.op_type == "QuantizeLinear"
        ]
        grids |= {self.qparams(q) for q in output_q}
        known = sorted(grid for grid in grids if grid is not None)
        if len(known) > 1:
            scales = ", ".join(f"{s:.6g}" for s, _ in known)
            self.add(
                node,
                "scale_mismatch",
                f"its inputs and output are on different scales ({scales}): TensorRT requantizes "
                "each input before the concat; let them share one observer",
            )

    def grid_of(self, tensor: str) -> tuple[float, int] | None:
        producer = self.graph.node_of(tensor)
        return self.qparams(producer) if producer is not None else None

    def qparams(self, node: Any) -> tuple[float, int] | None:
        scale = self.graph.constants.get(node.input[1]) if len(node.input) > 1 else None
        zero = self.graph.constants.get(node.input[2]) if len(node.input) > 2 else None
        if scale is None or scale.size != 1:
            return None
        return float(scale.reshape(())), int(zero.reshape(())) if zero is not None else 0

    # -- the Q/DQ nodes themselves

    def check_qdq(self, node: Any) -> None:
        scale = self.graph.constants.get(node.input[1]) if len(node.input) > 1 else None
        zero = self.graph.constants.get(node.input[2]) if len(node.input) > 2 else None
        anchor = self.anchor_of(node)
        kind = "uint8" if zero is None else str(zero.dtype)  # no zero point means uint8
        if kind != "int8":
            self.add(
                anchor, "not_int8", f"its {node.op_type} is {kind}, TensorRT quantizes to int8"
            )
        elif zero is not None and bool((zero != 0).any()):
            self.add(
                anchor,
                "zero_point",
                f"its {node.op_type} has zero point {zero.reshape(-1)[:4].tolist()}: TensorRT "
                "supports only symmetric quantization (zero point 0); use a symmetric qconfig",
            )
        weight = node.op_type == "DequantizeLinear" and node.input[0] in self.graph.constants
        if weight:
            self.check_weight_axis(node, scale)
        elif scale is not None and scale.size > 1:
            self.add(
                anchor,
                "per_channel_activation",
                f"its activation {node.op_type} is per channel: TensorRT quantizes activations "
                "per tensor",
            )
        if node.op_type == "QuantizeLinear":
            for reader in self.graph.consumers.get(node.output[0], []):
                if reader.op_type == "Clip":
                    self.add(
                        anchor,
                        "narrow_range",
                        "its QuantizeLinear is clipped to a range narrower than int8's "
                        "(quant_min/quant_max): TensorRT fuses only the full -128..127",
                    )

    def anchor_of(self, node: Any) -> Any:
        """The node a Q/DQ finding is reported at: the layer that reads the quantized tensor.

        For a QuantizeLinear, the reader of its DequantizeLinear (the int8 layer it
        was placed for); with none (a quantized graph output), what feeds it.
        """
        dequantizes = (
            [
                c
                for c in self.graph.consumers.get(node.output[0], [])
                if c.op_type == "DequantizeLinear"
            ]
            if node.op_type == "QuantizeLinear"
            else [node]
        )
        for dequantize in dequantizes:
            readers = self.graph.consumers.get(dequantize.output[0], [])
            if readers:
                return readers[0]
        producer = self.graph.node_of(node.input[0])
        if producer is not None and producer.op_type == "QuantizeLinear":
            producer = self.graph.node_of(producer.input[0])  # a DQ at the graph's output
        return producer if producer is not None else node

    def check_weight_axis(self, node: Any, scale: np.ndarray | None) -> None:
        if scale is None or scale.size <= 1:
            return  # per tensor: TensorRT takes it
        for reader in self.graph.consumers.get(node.output[0], []):
            wanted = self.output_axis(reader, node)
            if wanted is None:
                continue
            rank = self.graph.constants[node.input[0]].ndim
            axis = _attr(node, "axis", 1) % rank
            if axis != wanted % rank:
                self.add(
                    reader,
                    "weight_axis",
                    f"its weight is quantized per channel along axis {axis}, TensorRT wants the "
                    f"output channel (axis {wanted % rank}) or one scale",
                )

    def output_axis(self, reader: Any, dq: Any) -> int | None:
        if reader.input[1:2] != [dq.output[0]]:
            return None  # the DQ is not this layer's weight
        if reader.op_type == "Conv":
            return 0
        if reader.op_type == "ConvTranspose":
            return 1
        if reader.op_type == "Gemm":
            return 0 if _attr(reader, "transB", 0) else 1
        if reader.op_type == "MatMul":
            return -1
        return None
