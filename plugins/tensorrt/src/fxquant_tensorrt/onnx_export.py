"""A converted model as an ONNX model whose quantization is real QuantizeLinear/DequantizeLinear.

Route (why): ``fxquant.tools.export.export_quantized`` gives a ``torch.export`` program
with the weights folded into int8 constants and fxquant's own quantize/dequantize
ops left intact. ``torch.onnx.export(program, dynamo=True)`` then translates it
with a *custom translation table* that maps each fxquant op to one ONNX
``QuantizeLinear``/``DequantizeLinear`` (per channel with ``axis``). Nothing
decomposes them: the dynamo exporter's own route for ``quantize_per_tensor``
goes through ATen decompositions that turn QuantizeLinear into Mul/Round/Add
(pytorch/pytorch#127167), and the TorchScript exporter needs quint8 tensors,
which torch 2.13 deprecates. No torch.ao code and no quint8 tensor is involved::

    program:  x -> fxquant.quantize_per_tensor(x, s, 0, -128, 127, int8)
                -> fxquant.dequantize_per_tensor(...)
                -> aten.conv2d(.., fxquant.dequantize_per_channel(w_int8, ...))
    ONNX:     x -> QuantizeLinear(s, int8 0) -> DequantizeLinear
                -> Conv(.., DequantizeLinear(w_int8, axis=0))

A narrower integer range than the dtype's (``quant_min=-127``) adds a Clip
after the QuantizeLinear, which keeps the numbers exact and which the
placement check reports (TensorRT cannot fuse it). Each ONNX node is traced
back to the converted model's node it came from (``origins``), so the
placement check speaks of the user's nodes and source lines.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from fxquant.errors import ExportError
from fxquant.flow import explain
from fxquant.flow.report import NodeStatus
from fxquant.lowering import CHOOSE_QPARAMS_OP, QUANTIZE_OPS
from fxquant.tools.export import export_quantized, source_of
from torch import fx

from fxquant_tensorrt.origins import consumer_origin, onnx_origins
from fxquant_tensorrt.placement import Placement, check_placement
from fxquant_tensorrt.translation import ONNX_OPSET, translation_table

if TYPE_CHECKING:
    import onnx
    from torch.export import ExportedProgram

__all__ = ["OnnxExport", "export_onnx", "quiet_exporter"]

_FULL_RANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


@dataclass(frozen=True)
class OnnxExport:
    """An exported model: the ONNX proto, where its nodes came from, and its placement check.

    Attributes:
        model: the ONNX model (``onnx.ModelProto``).
        origins: ONNX node name -> name of the converted model's node it came from.
        placement: which Q/DQ TensorRT fuses and which it cannot (:func:`check_placement`).
        path: where the model was written, or ``None``.
        out_spec: the pytree spec of the model's outputs (to rebuild tuples and dicts).
        sources: converted node name -> the user's ``file:line``, when known.
    """

    model: onnx.ModelProto
    origins: Mapping[str, str]
    placement: Placement
    path: Path | None = None
    out_spec: Any = None
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def input_names(self) -> list[str]:
        """The ONNX graph's input names, in the model's positional order."""
        return [value.name for value in self.model.graph.input]

    def serialized(self) -> bytes:
        """The model as bytes (what onnxruntime and TensorRT's parser read)."""
        data: bytes = self.model.SerializeToString()
        return data


# --- checks before translation ----------------------------------------------------------------


def _where(model: fx.GraphModule, name: str | None) -> str:
    if name is None:
        return "a quantize step of the model"
    source = source_of(model, name)
    return f"node {name!r}" + (f" (called from {source})" if source else "")


def _check_translatable(program: ExportedProgram, model: fx.GraphModule) -> None:
    """Refuse what ONNX Q/DQ cannot say: dynamic qparams, int32 quantize steps."""
    names = {n.name for n in model.graph.nodes}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target == CHOOSE_QPARAMS_OP:
            msg = (
                f"cannot export {_where(model, consumer_origin(node, names))} for TensorRT: it "
                "is quantized dynamically (qparams chosen at run time), which TensorRT's explicit "
                "quantization has no form for; give it a static qconfig or qconfig None"
            )
            raise ExportError(msg)
        dtype = node.args[-1] if node.target in QUANTIZE_OPS else None
        if dtype is not None and dtype not in _FULL_RANGE:
            msg = (
                f"cannot export {_where(model, consumer_origin(node, names))} for TensorRT: a "
                f"quantize step to {dtype} (ONNX QuantizeLinear writes int8 or uint8); use an "
                "int8 qconfig"
            )
            raise ExportError(msg)


# --- the export -------------------------------------------------------------------------------


_CHATTY_LOGGERS = (
    "torch.onnx._internal.exporter._registration",  # one warning per missing torchvision op
    "onnx_ir._convenience",  # "attribute type is ambiguous" for an empty ints attribute
)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Keep the exporter's chatter out of the user's output; restore everything after.

    Its loggers warn about things the user cannot act on (torchvision ops, empty
    attribute lists), and its pytree code warns that ``LeafSpec`` is deprecated.
    """
    loggers = [logging.getLogger(name) for name in _CHATTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _to_onnx(program: ExportedProgram, model: fx.GraphModule) -> Any:
    try:
        with quiet_exporter():
            return torch.onnx.export(
                program,
                dynamo=True,
                custom_translation_table=translation_table(),
                opset_version=ONNX_OPSET,
                optimize=True,
                verbose=False,
            )
    except Exception as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        msg = (
            f"torch.onnx could not translate the exported {type(model).__name__} to ONNX: "
            f"{type(error).__name__}: {first}; an op without an ONNX translation must stay out "
            "of the model (or be replaced by one that has one)"
        )
        raise ExportError(msg) from error


def export_onnx(
    model: fx.GraphModule,
    example_inputs: tuple[Any, ...],
    path: str | Path | None = None,
    *,
    strict: bool = False,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | None = None,
) -> OnnxExport:
    """Write a converted model as an ONNX model with QuantizeLinear/DequantizeLinear nodes.

    Args:
        model: a model returned by ``convert_fx`` (or ``convert_to_reference_fx``)
            with the ``tensorrt`` backend. It is not modified.
        example_inputs: positional inputs of ``model``; their shapes are the
            ONNX model's unless ``dynamic_shapes`` says otherwise.
        path: where to write the ``.onnx`` file; ``None`` keeps it in memory.
        strict: raise when TensorRT could not fuse some Q/DQ (see
            :func:`check_placement`) instead of only reporting it.
        dynamic_shapes: passed to ``torch.export`` (e.g. a dynamic batch).

    Returns:
        The :class:`OnnxExport`: the ONNX model, its nodes' origins and the
        placement check (``export.placement.report(model)`` is the explain form).

    Raises:
        ConfigTypeError: ``model`` is not a converted fxquant model.
        ExportError: torch.export or the ONNX translation failed, or the model
            has a quantization ONNX cannot express (dynamic, int32); the message
            names the node and the user's source line.
        UnfusableQDQError: ``strict`` and some Q/DQ cannot be fused by TensorRT.

    Example:
        >>> import fxquant
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
        >>> x = (torch.randn(1, 3, 8, 8),)
        >>> prepared = fxquant.prepare_fx(model, fxquant.get_default_qconfig_mapping("tensorrt"),
        ...     x, backend_config=fxquant.get_backend_config("tensorrt"))
        >>> _ = prepared(*x)
        >>> exported = export_onnx(fxquant.convert_fx(prepared), x)
        >>> [n.op_type for n in exported.model.graph.node]  # doctest: +NORMALIZE_WHITESPACE
        ['QuantizeLinear', 'DequantizeLinear', 'DequantizeLinear', 'Conv', 'Relu',
         'QuantizeLinear', 'DequantizeLinear']
        >>> exported.placement.ok
        True
    """
    program = export_quantized(model, example_inputs, dynamic_shapes=dynamic_shapes)
    _check_translatable(program, model)
    onnx_program = _to_onnx(program, model)
    onnx_model = onnx_program.model_proto
    names = {n.name for n in model.graph.nodes}
    origins = onnx_origins(onnx_model, onnx_program.exported_program, names)
    sources = {name: s for name in set(origins.values()) if (s := source_of(model, name))}
    quantized = {
        entry.node
        for entry in explain(model, show=False).entries()
        if entry.status in (NodeStatus.QUANTIZED, NodeStatus.REFERENCE, NodeStatus.LOWERED)
    }
    placement = check_placement(onnx_model, origins, sources=sources, int8_origins=quantized)
    if strict:
        placement.raise_if_unfusable()
    written = None
    if path is not None:
        import onnx

        written = Path(path)
        onnx.save(onnx_model, written)
    out_spec = program.call_spec.out_spec
    return OnnxExport(onnx_model, origins, placement, written, out_spec, sources)
