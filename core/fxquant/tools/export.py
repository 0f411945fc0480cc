"""``torch.export`` of a converted model, with its weights stored as integers.

A converted model computes each quantized weight in forward: a reference module
runs ``dequantize(quantize(w))`` on its float parameter, so that lowering can
recognise the pattern. Deployment toolchains (ExecuTorch, ONNX) expect the
integers themselves as constants, as a quantized kernel stores them::

    converted: w (float parameter) -> quantize_per_channel -> dequantize_per_channel -> conv
    exported:  w_int8 (constant)   ->                         dequantize_per_channel -> conv

:func:`export_quantized` runs ``torch.export`` on a copy of the model, then folds
every quantize step whose tensor inputs are all parameters, buffers or
constants into an integer constant; a float parameter that nothing else reads
leaves the program. The ``fxquant`` quantize/dequantize ops stay as they are: a
backend plugin maps them to its toolchain's ops (:data:`QUANTIZE_OPS`,
:data:`DEQUANTIZE_OPS`). :func:`origin` tells which node of the converted model
an exported node came from, so a plugin can report in the user's terms.
"""

from __future__ import annotations

import copy
import re
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from fxquant.errors import ConfigTypeError, ExportError
from fxquant.flow.convert_modules import is_observer
from fxquant.flow.state import flow_state, node_info
from fxquant.lowering import DEQUANTIZE_OPS, QUANTIZE_OPS

__all__ = [
    "DEQUANTIZE_OPS",
    "QUANTIZE_OPS",
    "export_quantized",
    "origin",
    "source_of",
]


_CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _check_converted(model: object) -> fx.GraphModule:
    if not isinstance(model, fx.GraphModule) or flow_state(model) is None:
        msg = (
            f"export_quantized expects a model returned by fxquant.convert_fx or "
            f"convert_to_reference_fx, got {type(model).__name__}; prepare, calibrate and "
            "convert the model first"
        )
        raise ConfigTypeError(msg)
    modules = dict(model.named_modules())
    observers = [
        n.name
        for n in model.graph.nodes
        if n.op == "call_module" and is_observer(modules[str(n.target)])
    ]
    if observers:
        msg = (
            f"export_quantized got a prepared model (observers {', '.join(observers[:3])}); "
            "call fxquant.convert_fx on it first"
        )
        raise ConfigTypeError(msg)
    return model


def export_quantized(
    model: fx.GraphModule,
    example_inputs: tuple[Any, ...],
    *,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | None = None,
) -> ExportedProgram:
    """Export a converted model with ``torch.export``, its quantized weights as integer constants.

    Args:
        model: a model returned by ``convert_fx`` or ``convert_to_reference_fx``
            in reference form (kernels of a CPU backend are opaque to export).
            It is not modified.
        example_inputs: positional inputs of ``model``.
        dynamic_shapes: passed to ``torch.export.export``.

    Returns:
        The exported program: ``fxquant`` quantize/dequantize ops around ATen
        ops, every weight quantization folded into an integer constant.

    Raises:
        ConfigTypeError: ``model`` is not a converted fxquant model.
        ExportError: ``torch.export`` could not capture it; the message names
            the node of ``model`` that failed and the user's source line.

    Example:
        >>> import torch, fxquant
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
        >>> x = (torch.randn(3, 4),)
        >>> prepared = fxquant.prepare_fx(
        ...     model, fxquant.get_default_qconfig_mapping("reference"), x)
        >>> _ = prepared(*x)
        >>> program = export_quantized(fxquant.convert_to_reference_fx(prepared), x)
        >>> sorted({v.dtype for v in program.constants.values()})
        [torch.int8]
    """
    model = _check_converted(model)
    copied = copy.deepcopy(model)  # export may set attributes; the user's model stays as it is
    try:
        program = torch.export.export(
            copied, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=False
        )
    except Exception as error:
        raise ExportError(_export_failure(copied, error)) from error
    fold_constant_quantize(program)
    return program


def _failing_node(gm: fx.GraphModule, error: BaseException) -> fx.Node | None:
    """The node of ``gm`` that was running when ``error`` was raised.

    torch.export runs a GraphModule through ``fx.Interpreter``, whose
    ``run_node(n)`` frame holds the node; the innermost such frame wins.
    """
    found = None
    nodes = set(gm.graph.nodes)
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_name == "run_node":
            node = frame.f_locals.get("n")
            if isinstance(node, fx.Node) and node in nodes:
                found = node
    return found


def _user_line(error: BaseException) -> str | None:
    """``file:line`` of the innermost frame outside torch and fxquant (the user's code)."""
    found = None
    for frame, lineno in traceback.walk_tb(error.__traceback__):
        filename = frame.f_code.co_filename
        ours = any(f"{sep}{pkg}{sep}" in filename for pkg in ("torch", "fxquant") for sep in "/\\")
        if not ours and not filename.startswith("<"):
            found = f"{filename}:{lineno}"
    return found


def _export_failure(gm: fx.GraphModule, error: BaseException) -> str:
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    node = _failing_node(gm, error)
    where = "the model"
    if node is not None:
        info = node_info(node)
        module = f" (module {info.module_path!r})" if info.module_path else ""
        source = f", called from {info.source}" if info.source else ""
        where = f"node {node.name!r}{module}{source}"
    line = _user_line(error)
    at = f" at {line}" if line else ""
    return (
        f"torch.export could not capture {where}: {type(error).__name__}{at}: {first_line}; "
        "if that code has data-dependent control flow, rewrite it with torch.cond or keep it "
        "out of the exported model"
    )


# --- folding the weight quantization --------------------------------------------------------


def _constant_inputs(program: ExportedProgram) -> dict[str, InputSpec]:
    """Placeholder name -> spec, for the parameters, buffers and constants of ``program``."""
    return {
        spec.arg.name: spec
        for spec in program.graph_signature.input_specs
        if spec.kind in _CONSTANT_KINDS and isinstance(spec.arg, TensorArgument)
    }


def _value(program: ExportedProgram, spec: InputSpec) -> torch.Tensor:
    assert spec.target is not None  # parameters, buffers and constants are named
    if spec.kind == InputKind.CONSTANT_TENSOR or spec.target not in program.state_dict:
        value = program.constants[spec.target]
    else:
        value = program.state_dict[spec.target]
    assert isinstance(value, torch.Tensor)  # TensorArgument specs hold tensors
    return value


def _foldable(node: fx.Node, constants: Mapping[str, InputSpec]) -> bool:
    if node.op != "call_function" or node.target not in QUANTIZE_OPS:
        return False
    tensors = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
    return bool(tensors) and all(a.op == "placeholder" and a.name in constants for a in tensors)


@dataclass
class _NewConstants:
    """Where new lifted constants go: found once per program, not once per constant.

    Placeholders are ordered parameters, buffers, constants, then user inputs;
    each new constant goes before the first user input, in the order made.
    """

    program: ExportedProgram
    anchor: fx.Node
    index: int
    fake_mode: Any
    taken: set[str]

    @classmethod
    def of(cls, program: ExportedProgram) -> _NewConstants:
        specs = program.graph_signature.input_specs
        first_user = next(i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT)
        placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
        fake_mode = torch._guards.detect_fake_mode(  # the mode of the program's own values
            [n.meta["val"] for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)]
        )
        taken = {n.name for n in program.graph.nodes}
        taken |= set(program.constants) | set(program.state_dict)
        return cls(program, placeholders[first_user], first_user, fake_mode, taken)

    def add(self, base: str, value: torch.Tensor) -> fx.Node:
        """A new lifted constant named after ``base`` (made unique) holding ``value``."""
        name, index = base, 0
        while name in self.taken:
            index += 1
            name = f"{base}_{index}"
        self.taken.add(name)
        with self.program.graph.inserting_before(self.anchor):
            node: fx.Node = self.program.graph.placeholder(name)
        # static: a constant has one shape, and a symbolic one would leak into every shape
        mode = self.fake_mode
        node.meta["val"] = mode.from_tensor(value, static_shapes=True) if mode else value
        spec = InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(name), name)
        self.program.graph_signature.input_specs.insert(self.index, spec)
        self.index += 1
        self.program.constants[name] = value
        return node


def _remove_unused(program: ExportedProgram, constants: Mapping[str, InputSpec]) -> None:
    # a deployed program carries every input it declares: the float weights once folded,
    # and the reference modules' axis buffers, were never read by a kernel
    graph = program.graph
    for node in list(graph.nodes):
        if node.op != "placeholder" or node.users or node.name not in constants:
            continue
        spec = constants[node.name]
        program.graph_signature.input_specs.remove(spec)
        assert spec.target is not None  # parameters and constants are named
        program.state_dict.pop(spec.target, None)
        program.constants.pop(spec.target, None)
        graph.erase_node(node)


def fold_constant_quantize(program: ExportedProgram) -> int:
    """Fold, in place, each quantize step of constant tensors into an integer constant.

    Returns:
        How many quantize steps were folded.

    Example:
        >>> # see export_quantized, which calls it
    """
    constants = _constant_inputs(program)
    foldable = [n for n in program.graph.nodes if _foldable(n, constants)]
    if not foldable:
        return 0
    new = _NewConstants.of(program)
    for node in foldable:
        args = [
            _value(program, constants[a.name]) if isinstance(a, fx.Node) else a for a in node.args
        ]
        assert callable(node.target)  # an OpOverload, checked by _foldable
        with torch.no_grad():
            value = node.target(*args, **node.kwargs)
        weight = next(a for a in node.args if isinstance(a, fx.Node))
        # "c_" as torch.export names lifted constants: "p_conv_weight" -> "c_conv_weight_int"
        base = re.sub(r"^(p|b|c)_", "", weight.name)
        replacement = new.add(re.sub(r"\W", "_", f"c_{base}_int"), value)
        replacement.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        node.replace_all_uses_with(replacement)
        program.graph.erase_node(node)
    _remove_unused(program, constants)
    program.graph_module.recompile()
    return len(foldable)


# --- mapping exported nodes back ------------------------------------------------------------


def origin(node: fx.Node) -> str | None:
    """The name of the converted model's node that ``node`` (of an exported program) came from.

    ``torch.export`` and the passes after it record provenance in
    ``node.meta["from_node"]``, each pass adding a level; the deepest level is
    the converted model's node. Quantize and dequantize steps have none (``None``).

    Example:
        >>> # after export_quantized: origin(conv_node) == "conv" for the model's node "conv"
    """
    sources = list(node.meta.get("from_node") or [])
    found = None
    while sources:
        source = sources[0]
        name = getattr(source, "name", None)
        if isinstance(name, str):
            found = name
        sources = list(getattr(source, "from_node", None) or [])
    return found


def source_of(model: fx.GraphModule, name: str | None) -> str | None:
    """``file:line`` of the user's code for the converted model's node ``name``, when known.

    Example:
        >>> source_of(torch.fx.symbolic_trace(torch.nn.ReLU()), "missing") is None
        True
    """
    if name is None:
        return None
    for node in model.graph.nodes:
        if node.name == name:
            return node_info(node).source
    return None
