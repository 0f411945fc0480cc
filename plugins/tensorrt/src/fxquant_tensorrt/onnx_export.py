"""A converted model as an ONNX model whose quantization is real QuantizeLinear/DequantizeLinear.

Route (why): ``fxquant.export.export_quantized`` gives a ``torch.export`` program
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
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from fxquant.errors import ExportError
from fxquant.export import export_quantized, source_of
from fxquant.flow import explain
from torch import fx

from fxquant_tensorrt.placement import Placement, check_placement

if TYPE_CHECKING:
    import onnx
    from torch.export import ExportedProgram

__all__ = ["ONNX_OPSET", "OnnxExport", "export_onnx", "translation_table"]

ONNX_OPSET = 18
"""The opset written: the dynamo exporter's lowest; TensorRT 10 parses it."""

_OPS = torch.ops.fxquant
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


# --- the translation of fxquant's ops ---------------------------------------------------------


def _onnx_type(dtype: Any) -> int:
    # the exporter passes ScalarType arguments as onnx_ir DataType members (TensorProto ints)
    return int(dtype)


def _range_clip(op: Any, q: Any, quant_min: int, quant_max: int, dtype: Any) -> Any:
    """``q`` clamped to ``quant_min..quant_max`` when that is narrower than the dtype's range."""
    import onnx

    onnx_type = _onnx_type(dtype)
    ranges = {int(onnx.TensorProto.INT8): (-128, 127), int(onnx.TensorProto.UINT8): (0, 255)}
    full = ranges.get(onnx_type)
    if full is None or (quant_min, quant_max) == full:
        return q
    low = op.Cast(op.Constant(value_int=quant_min), to=onnx_type)
    high = op.Cast(op.Constant(value_int=quant_max), to=onnx_type)
    return op.Clip(q, low, high)


def _zero_point(op: Any, zero_point: int, dtype: Any) -> Any:
    return op.Cast(op.Constant(value_int=zero_point), to=_onnx_type(dtype))


def _out(op: Any, value: Any, out_dtype: Any) -> Any:
    import onnx

    if out_dtype is None or _onnx_type(out_dtype) == onnx.TensorProto.FLOAT:
        return value
    return op.Cast(value, to=_onnx_type(out_dtype))


def _scalar(op: Any, tensor: Any, to: int) -> Any:
    # a 0-d or one-element tensor as an ONNX scalar of type ``to`` (the .tensor overloads)
    return op.Cast(op.Reshape(tensor, op.Constant(value_ints=[])), to=to)


def translation_table() -> dict[Callable[..., Any], Callable[..., Any]]:
    """fxquant's quantize/dequantize ops -> functions that emit ONNX Q/DQ (opset 18).

    Example:
        >>> torch.ops.fxquant.dequantize_per_channel.default in translation_table()
        True
    """
    import onnx
    from onnxscript import opset18

    # untyped on purpose: onnxscript's per-op type stubs reject the exporter's symbolic values
    op: Any = opset18
    float32 = onnx.TensorProto.FLOAT

    def quantize_per_tensor(  # the op's schema
        x: Any, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype: Any
    ) -> Any:
        q = op.QuantizeLinear(x, op.Constant(value_float=scale), _zero_point(op, zero_point, dtype))
        return _range_clip(op, q, quant_min, quant_max, dtype)

    def quantize_per_tensor_tensor(  # the op's schema
        x: Any, scale: Any, zero_point: Any, quant_min: int, quant_max: int, dtype: Any
    ) -> Any:
        zp = _scalar(op, zero_point, _onnx_type(dtype))
        q = op.QuantizeLinear(x, _scalar(op, scale, float32), zp)
        return _range_clip(op, q, quant_min, quant_max, dtype)

    def dequantize_per_tensor(  # noqa: PLR0913, PLR0917  # the op's schema
        q: Any,
        scale: float,
        zero_point: int,
        quant_min: int,
        quant_max: int,
        dtype: Any,
        out_dtype: Any = None,
    ) -> Any:
        del quant_min, quant_max  # the integers are already in range
        scale_value = op.Constant(value_float=scale)
        value = op.DequantizeLinear(q, scale_value, _zero_point(op, zero_point, dtype))
        return _out(op, value, out_dtype)

    def dequantize_per_tensor_tensor(  # noqa: PLR0913, PLR0917  # the op's schema
        q: Any,
        scale: Any,
        zero_point: Any,
        quant_min: int,
        quant_max: int,
        dtype: Any,
        out_dtype: Any = None,
    ) -> Any:
        del quant_min, quant_max
        zp = _scalar(op, zero_point, _onnx_type(dtype))
        return _out(op, op.DequantizeLinear(q, _scalar(op, scale, float32), zp), out_dtype)

    def quantize_per_channel(  # noqa: PLR0913, PLR0917  # the op's schema
        x: Any, scales: Any, zero_points: Any, axis: int, quant_min: int, quant_max: int, dtype: Any
    ) -> Any:
        # per-channel scales are float64 buffers in fxquant: ONNX wants the output's float32
        zp = op.Cast(zero_points, to=_onnx_type(dtype))
        q = op.QuantizeLinear(x, op.Cast(scales, to=float32), zp, axis=axis)
        return _range_clip(op, q, quant_min, quant_max, dtype)

    def dequantize_per_channel(  # noqa: PLR0913, PLR0917  # the op's schema
        q: Any,
        scales: Any,
        zero_points: Any,
        axis: int,
        quant_min: int,
        quant_max: int,
        dtype: Any,
        out_dtype: Any = None,
    ) -> Any:
        del quant_min, quant_max
        zp = op.Cast(zero_points, to=_onnx_type(dtype))
        value = op.DequantizeLinear(q, op.Cast(scales, to=float32), zp, axis=axis)
        return _out(op, value, out_dtype)

    return {
        _OPS.quantize_per_tensor.default: quantize_per_tensor,
        _OPS.quantize_per_tensor.tensor: quantize_per_tensor_tensor,
        _OPS.dequantize_per_tensor.default: dequantize_per_tensor,
        _OPS.dequantize_per_tensor.tensor: dequantize_per_tensor_tensor,
        _OPS.quantize_per_channel.default: quantize_per_channel,
        _OPS.dequantize_per_channel.default: dequantize_per_channel,
    }


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
        if node.target == _OPS.choose_qparams_per_tensor.default:
            msg = (
                f"cannot export {_where(model, _consumer_origin(node, names))} for TensorRT: it "
                "is quantized dynamically (qparams chosen at run time), which TensorRT's explicit "
                "quantization has no form for; give it a static qconfig or qconfig None"
            )
            raise ExportError(msg)
        dtype = node.args[-1] if node.target in _QUANTIZE_TARGETS else None
        if dtype is not None and dtype not in _FULL_RANGE:
            msg = (
                f"cannot export {_where(model, _consumer_origin(node, names))} for TensorRT: a "
                f"quantize step to {dtype} (ONNX QuantizeLinear writes int8 or uint8); use an "
                "int8 qconfig"
            )
            raise ExportError(msg)


_QUANTIZE_TARGETS = frozenset(
    {
        _OPS.quantize_per_tensor.default,
        _OPS.quantize_per_tensor.tensor,
        _OPS.quantize_per_channel.default,
    }
)


# --- tracing ONNX nodes back to the converted model -------------------------------------------


def converted_origin(node: fx.Node, names: set[str]) -> str | None:
    """The converted model's node ``node`` (of an exported program) came from, if any.

    ``node.meta["from_node"]`` is a chain: the decomposed program's node comes
    from the exported program's, which comes from the converted model's. The
    deepest name that is a node of the converted model wins (a decomposition
    may rename: ``flatten`` becomes ``view``).

    Example:
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


def _consumer_origin(node: fx.Node, names: set[str]) -> str | None:
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


# --- the export -------------------------------------------------------------------------------


_CHATTY_LOGGERS = (
    "torch.onnx._internal.exporter._registration",  # one warning per missing torchvision op
    "onnx_ir._convenience",  # "attribute type is ambiguous" for an empty ints attribute
)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
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
        with _quiet_exporter():
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
        if entry.status in ("quantized", "reference", "lowered")
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
