"""x86's deployment: a reference model compiled by inductor, its int8 fusions running it.

The route, with no torch.ao quantizer and no pt2e annotation::

    reference model (fxquant q/dq ops around float ops, float weights)
      -> merge_sibling_linears                     linears of one quantized input (Q/K/V)
                                                   become one wider linear and views of it
      -> flatten_for_compile                       modules inlined, weights quantized once:
                                                   a flat graph of functions (pt2e's form)
      -> torch.compile(options=INDUCTOR_OPTIONS)   dynamo traces it; freezing makes the
                                                   weights constants and folds their quantize
      -> QuantizedDecomposedOps (a joint-graph pass) fxquant q/dq -> quantized_decomposed q/dq
                                                   (same schemas), the form inductor matches
      -> inductor's x86 int8 passes                dq -> conv/linear -> q becomes
                                                   onednn.qconv_pointwise / qlinear_pointwise
                                                   with prepacked weights and fused post-ops
      -> C++ kernels for the rest                  quantize, dequantize and float ops fused
      -> inductor's C++ wrapper (cpp_wrapper)      the per-call code that launches the kernels
                                                   is C++ too, compiled with them (default)

Freezing and the rewrite pass are set in ``torch._inductor.config`` only
while a :class:`CompiledModel` runs (``config.patch`` around each call, since
any call may recompile): other compiled functions of the process never see
them. ``torch.compile(options=...)`` is not enough: dynamo reads ``freezing``
itself, when it traces, to treat parameters as constants (without it the
weights' quantize steps stay in the graph and inductor fails on
``onednn.qconv_prepack``). Freezing only applies with grad disabled, so every
call also runs under ``torch.no_grad()``.

What the compile produced is checked, not assumed: the first call (the cold
compile) captures inductor's generated code and counts its oneDNN int8
kernels against the quantized linear and conv nodes of the model
(:attr:`CompiledModel.kernels`); a node inductor left in float is reported
``not_delegated``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import operator
import re
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.flow.convert_modules import is_observer
from fxquant.flow.deployed import DeployedModel
from fxquant.flow.report import NodeStatus, Reason, ReasonCode, Report
from fxquant.flow.state import FlowState, flow_state, reference_form
from fxquant.lowering import DEQUANTIZE_OPS, QDQ_OPS
from fxquant.nn import reference
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from fxquant_x86 import inputs as input_guard
from fxquant_x86 import precision
from fxquant_x86.inputs import call_on_copies, copy_written, never_into_inputs

__all__ = [
    "INT8_KERNELS",
    "CompiledModel",
    "CompiledPackage",
    "QuantizedDecomposedOps",
    "compile_quantized",
    "deploy",
    "flatten_for_compile",
    "inductor_options",
    "input_signature",
    "load",
    "merge_sibling_linears",
    "save_package",
]

INT8_KERNELS = re.compile(
    r"(?:torch\.ops\.onednn\.|aoti_torch_cpu__)(qlinear_pointwise|qconv\w*?_pointwise)"
    r"(?:\b|(?:_binary)?_tensor\b)"
)
"""oneDNN's int8 linear and conv ops, as inductor's generated wrapper calls them: the Python
wrapper's ``torch.ops.onednn.qlinear_pointwise``, the C++ wrapper's
``aoti_torch_cpu__qlinear_pointwise_tensor`` (group 1: ``qlinear_pointwise``)."""

_LINEAR_CONV = (reference.Linear, reference.Conv1d, reference.Conv2d, reference.Conv3d)


@functools.cache
def _load_inductor() -> None:
    # torch 2.13's inductor imports torch.utils.mkldnn, whose TorchScript classes warn that
    # torch.jit is deprecated: torch's own import, not the user's concern (and an error
    # under -W error). Its quantization passes define the quantized_decomposed library when
    # they load; fxquant never imports torch.ao itself.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch._inductor.compile_fx
        import torch._inductor.fx_passes.quantization  # noqa: F401


def _quantized_decomposed() -> Any:
    _load_inductor()
    return torch.ops.quantized_decomposed


class QuantizedDecomposedOps(CustomGraphPass):
    """An inductor graph pass: fxquant's q/dq ops -> ``quantized_decomposed``'s of the same schema.

    Inductor's x86 int8 passes match ``quantized_decomposed`` quantize and
    dequantize nodes around ``aten`` conv/linear; fxquant's reference model
    spells the same steps with ``torch.ops.fxquant`` ops (input, scale, zero
    point, quant range, dtype), so the pass only swaps targets. ``out_dtype``
    float32 (fxquant's default, spelt out) is dropped: the other schema has
    it as its default too. Dynamic quantization (``choose_qparams``) is left as it is.

    Example:
        >>> g = fx.Graph()
        >>> x = g.placeholder("x")
        >>> q = g.call_function(torch.ops.fxquant.quantize_per_tensor.default,
        ...                     (x, 0.1, 0, 0, 255, torch.uint8))
        >>> _ = g.output(q)
        >>> QuantizedDecomposedOps()(g)
        >>> q.target
        <OpOverload(op='quantized_decomposed.quantize_per_tensor', overload='default')>
    """

    def __call__(self, graph: fx.Graph) -> None:
        """Swap the targets in place."""
        namespace = _quantized_decomposed()
        for node in graph.nodes:
            if node.op != "call_function" or node.target not in QDQ_OPS:
                continue
            op = node.target
            node.target = getattr(getattr(namespace, op.overloadpacket.__name__), op._overloadname)
            if node.kwargs.get("out_dtype") in (None, torch.float32):
                node.kwargs = {k: v for k, v in node.kwargs.items() if k != "out_dtype"}

        _clamps_before_requantize(graph, namespace)
        _max_pools_on_integers(graph, namespace)

    def uuid(self) -> bytes:
        """This file's hash: inductor's cache keys a compile by its passes' code."""
        return get_hash_for_files((__file__, input_guard.__file__))  # its guard shapes the code


def _clamps_before_requantize(graph: fx.Graph, namespace: Any) -> None:
    """``y -> q -> dq -> relu/clamp -> q`` (one qparams) becomes ``y -> relu/clamp -> q``.

    fxquant's x86 patterns quantize a functional relu and a relu6/hardtanh on their
    own, sharing the qparams of their input; pt2e's quantizer makes them the conv's
    or linear's post-op. The two forms compute the same integers: quantizing is
    monotonic, so it commutes with a clamp, and ``q(dq(k)) == k``. Without the
    quantize/dequantize pair in between, inductor's patterns take the clamp as the
    oneDNN kernel's post-op instead of running a separate pass over uint8.
    """
    # inductor's own op library (``quantized_decomposed``), not fxquant's q/dq vocabulary
    quantize = namespace.quantize_per_tensor.default
    clamps = (
        torch.ops.aten.relu.default,
        torch.ops.aten.clamp_min.default,
        torch.ops.aten.hardtanh.default,
    )
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in clamps:
            continue
        # relu; clamp_min (-> clamp_max): relu6 / hardtanh as inductor decomposes them
        last = node
        if node.target == torch.ops.aten.clamp_min.default and len(node.users) == 1:
            (after,) = node.users
            if after.op == "call_function" and after.target == torch.ops.aten.clamp_max.default:
                last = after
        source = node.args[0]
        if _requantize_on_same_grid(source, last, namespace) is None:
            continue
        first = source.args[0]  # source: a dequantize node (checked)
        if not (
            isinstance(first, fx.Node)
            and first.target == quantize
            and len(first.users) == 1
            and first.args[1:] == source.args[1:]
            and not first.kwargs
        ):
            continue
        node.replace_input_with(source, first.args[0])
        graph.erase_node(source)
        graph.erase_node(first)


def _max_pools_on_integers(graph: fx.Graph, namespace: Any) -> None:
    """``k -> dq -> max_pool2d -> q`` (one set of qparams) becomes ``k -> max_pool2d``, on uint8.

    The maximum commutes with quantizing (monotonic) and ``q(dq(k)) == k``, so
    pooling the integers gives the same integers. Inductor then generates the
    pooling loop over uint8 itself, where the quantized form becomes a call of
    ``quantized::max_pool2d``: a fallback op that inductor's C++ wrapper reaches
    through the c10 dispatcher, whose headers add about 7 s of g++ to every
    compile of a model with a max pool (ResNet's stem).
    """
    pools = (
        torch.ops.aten.max_pool2d_with_indices.default,
        torch.ops.aten.max_pool2d.default,
        # what inductor's joint graph holds for an inference max pool (values, offsets)
        torch.ops.prims._low_memory_max_pool_with_offsets.default,
    )
    for pool in list(graph.nodes):
        if pool.op != "call_function" or pool.target not in pools:
            continue
        source = pool.args[0]
        if pool.target == torch.ops.aten.max_pool2d.default:
            value = pool
        else:  # the values, not the indices, and nothing else reading the pair
            if len(pool.users) != 1:
                continue
            (value,) = pool.users
            if value.target is not operator.getitem or value.args[1] != 0:
                continue
        requantize = _requantize_on_same_grid(source, value, namespace)
        if requantize is None:
            continue
        pool.replace_input_with(source, source.args[0])
        # the pooled values are the requantized ones now: their metadata (uint8) too
        if "val" in requantize.meta:
            if value is not pool and isinstance(pool.meta.get("val"), tuple):
                pool.meta["val"] = (requantize.meta["val"], *pool.meta["val"][1:])
            value.meta["val"] = requantize.meta["val"]
        requantize.replace_all_uses_with(value)
        graph.erase_node(requantize)
        graph.erase_node(source)


def _requantize_on_same_grid(source: object, last: fx.Node, namespace: Any) -> fx.Node | None:
    """The quantize node that alone reads ``last``, when ``source`` is a dequantize read only
    by the op (chain) ending in ``last`` and both use one set of qparams; else None.

    What the two passes above need: ``dq(k) -> op -> q`` on the grid ``k`` came from, so
    the op can run on ``k``'s integers (or its float input) with the same result.
    """
    if not (
        isinstance(source, fx.Node)
        and source.target == namespace.dequantize_per_tensor.default
        and len(source.users) == 1
        and not source.kwargs
        and len(last.users) == 1
    ):
        return None
    (requantize,) = last.users
    if (
        requantize.target != namespace.quantize_per_tensor.default
        or requantize.args[1:] != source.args[1:]
        or requantize.kwargs
    ):
        return None
    return requantize


def _mergeable(module: torch.nn.Module) -> bool:
    """A plain reference Linear with a per-channel (axis 0) integer weight: its output
    channels are independent, so it can be a slice of a wider one."""
    return (
        type(module) is reference.Linear
        and module.is_weight_quantized()
        and module.weight_scale.dim() == 1
        and module.weight_axis_int == 0
        and module.weight_scale.numel() == module.out_features
    )


def _merge_key(module: Any) -> tuple[Any, ...]:
    return (
        module.in_features,
        module.bias is not None,
        module.weight_qscheme,
        module.weight_dtype,
        module.weight_quant_min,
        module.weight_quant_max,
        module.weight.dtype,
        module.weight_zero_point.dtype,
    )


def _merged_module(modules: list[Any]) -> Any:
    merged = copy.deepcopy(modules[0])
    with torch.no_grad():
        merged.weight = torch.nn.Parameter(torch.cat([m.weight for m in modules]), False)
        if merged.bias is not None:
            merged.bias = torch.nn.Parameter(torch.cat([m.bias for m in modules]), False)
        merged.weight_scale = torch.cat([m.weight_scale for m in modules])
        merged.weight_zero_point = torch.cat([m.weight_zero_point for m in modules])
    merged.out_features = sum(m.out_features for m in modules)
    return merged


def _rounded_like(wide: fx.Node, nodes: list[fx.Node]) -> fx.Node:
    """``wide`` rounded to bfloat16 (``.to(bfloat16).to(float32)``) where every linear it
    replaces had its output rounded so (int8 in, bfloat16 out: attention's q, k, v), else
    ``wide``: the merged linear is then one int8 GEMM writing bfloat16
    (:func:`fxquant_x86.precision.float_side_in`), not a float32 GEMM and a cast after it.
    The slices' own roundings stay: rounding a bfloat16 value again changes nothing."""
    if not all(precision.rounded_to_bf16(node) for node in nodes):
        return wide
    graph = wide.graph
    with graph.inserting_after(wide):
        low = graph.call_method("to", (wide, torch.bfloat16))
    with graph.inserting_after(low):
        return graph.call_method("to", (low, torch.float32))


def merge_sibling_linears(model: fx.GraphModule) -> dict[str, list[str]]:
    """Linears reading one dequantized input become one wider linear and slices of its output.

    Attention's query, key and value projections read the same quantized
    activation: three ``dequantize -> linear`` of one input. With per-channel
    weights each output channel is computed on its own (its weight row, scale,
    zero point and bias), so one linear over the concatenated weights computes the
    same channels; each former linear's output becomes a ``narrow`` (a view) of
    it. Inductor then runs one oneDNN int8 GEMM (N = 3 x hidden) instead of
    three: one pass over the input and one kernel call, where a small GEMM's
    per-call cost is a large part of its time. In place on ``model``.

    Only plain reference ``Linear`` modules (not fused ones) with per-channel
    weights of the same scheme, input size and bias presence merge.

    Returns:
        The merged node's name -> the names of the nodes it replaced.

    Example:
        >>> # merged = merge_sibling_linears(reference_model)
        >>> # merged -> {'layers_0_attention_query_key_value': ['layers_0_attention_query', ...]}
    """
    modules = dict(model.named_modules())
    merged_nodes: dict[str, list[str]] = {}
    for source in list(model.graph.nodes):
        if source.op != "call_function" or source.target not in DEQUANTIZE_OPS:
            continue
        # merge key -> module target -> its calls on this input (a module called twice on
        # one input is one computation: both calls read the same slice)
        groups: dict[tuple[Any, ...], dict[str, list[fx.Node]]] = {}
        for user in source.users:  # users in graph order
            if user.op != "call_module" or user.args != (source,) or user.kwargs:
                continue
            module = modules[str(user.target)]
            if _mergeable(module):
                calls = groups.setdefault(_merge_key(module), {})
                calls.setdefault(str(user.target), []).append(user)
        for calls in groups.values():
            if len(calls) < 2:
                continue
            nodes = [node for same in calls.values() for node in same]
            first = min(nodes, key=list(model.graph.nodes).index)
            parts = [modules[target] for target in calls]
            target = next(iter(calls)) + "_merged"
            model.add_submodule(target, _merged_module(parts))
            with model.graph.inserting_before(first):
                wide = model.graph.call_module(target, (source,))
            base, start = _rounded_like(wide, nodes), 0
            for same, part in zip(calls.values(), parts, strict=True):
                with model.graph.inserting_after(base):
                    piece = model.graph.call_function(
                        torch.narrow, (base, -1, start, part.out_features)
                    )
                start += part.out_features
                for node in same:
                    node.replace_all_uses_with(piece)
            merged_nodes[wide.name] = [n.name for n in nodes]
            for node in nodes:
                model.graph.erase_node(node)
    if merged_nodes:
        model.graph.lint()
        model.delete_all_unused_submodules()
        model.recompile()
    return merged_nodes


class _InlineAll(fx.Tracer):
    """A tracer that inlines every module: the graph holds only functions and attributes."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return False


_WEIGHT_QUANTIZE = ("quantize_per_channel", "quantize_per_tensor")


def flatten_for_compile(model: fx.GraphModule) -> fx.GraphModule:
    """``model`` as one flat graph of functions, its weights already integers (what pt2e hands
    inductor).

    Every submodule call is inlined (a reference ``Conv2d`` becomes ``get_attr``
    weight -> ``dequantize_per_channel`` -> ``conv2d``), and each quantize step
    whose inputs are all attributes (a weight's) is computed once and stored as
    an integer tensor. Dynamo then traces plain function calls: no module
    attributes to read and guard (the reference modules' ``weight_qscheme``,
    ``weight_dtype``... gave thousands of guards, 3-6 ms of guard evaluation
    per call on a quick ResNet-50 here) and fewer Python frames to trace at
    compile time; inductor sees the same ops, with the weights' quantize
    folded as freezing would fold it. A new model; ``model`` is unchanged.

    Example:
        >>> # flat = flatten_for_compile(reference_model); flat(x) equals reference_model(x)
    """
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    for node in model.graph.nodes:
        if node.op == "call_module":
            env[node] = _inline_call(graph, model, node, env)
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    flat = fx.GraphModule(model, graph)
    folded = 0
    for node in list(flat.graph.nodes):
        if not (
            node.op == "call_function"
            and node.target in QDQ_OPS
            and node.target.overloadpacket.__name__ in _WEIGHT_QUANTIZE
        ):
            continue
        inputs = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
        if not inputs or any(a.op != "get_attr" for a in inputs):
            continue
        values = {a: operator.attrgetter(str(a.target))(flat) for a in inputs}
        args = fx.node.map_arg(node.args, values.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
        with torch.no_grad():
            value = node.target(*args, **kwargs)
        name = f"_quantized_weight_{folded}"
        folded += 1
        flat.register_buffer(name, value)
        with flat.graph.inserting_before(node):
            constant = flat.graph.get_attr(name)
        node.replace_all_uses_with(constant)
        flat.graph.erase_node(node)
    flat.graph.eliminate_dead_code()
    flat.delete_all_unused_submodules()
    flat.recompile()
    return flat


def _inline_call(
    graph: fx.Graph, model: fx.GraphModule, node: fx.Node, env: dict[fx.Node, Any]
) -> Any:
    """Copy the traced body of ``node``'s module into ``graph``; returns its output value."""
    module = model.get_submodule(str(node.target))
    body = _InlineAll().trace(module)
    placeholders = [n for n in body.nodes if n.op == "placeholder"]
    bound = inspect.signature(module.forward).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    values = list(bound.arguments.values())
    if len(values) != len(placeholders):
        msg = f"cannot inline {node.target}: {len(values)} arguments, {len(placeholders)} inputs"
        raise ValueError(msg)
    for inner in body.nodes:  # attributes of the module, named from the root
        if inner.op == "get_attr":
            inner.target = f"{node.target}.{inner.target}"
    val_map: dict[fx.Node, Any] = {
        ph: fx.node.map_arg(v, env.__getitem__) for ph, v in zip(placeholders, values, strict=True)
    }
    return graph.graph_copy(body, val_map)


def inductor_options(*, cpp_wrapper: bool = False) -> dict[str, Any]:
    """The inductor options of the compiled deployment: freezing, the q/dq rewrite and,
    with ``cpp_wrapper``, inductor's C++ wrapper.

    Set with ``torch._inductor.config.patch`` around each guarded call of a
    :class:`CompiledModel`, and as AOTInductor's ``inductor_configs`` (without
    ``cpp_wrapper``: AOTInductor's wrapper is C++ anyway).

    ``cpp_wrapper``: the code that runs a call (allocate buffers, launch each oneDNN
    kernel and fused C++ loop in order) is C++ compiled with the kernels into one
    library, instead of a Python function calling them one by one: less per-call
    overhead, and one C++ compile instead of one per fused kernel.

    Example:
        >>> sorted(inductor_options(cpp_wrapper=True))
        ['cpp_wrapper', 'freezing', 'joint_custom_pre_pass']
    """
    options: dict[str, Any] = {"freezing": True, "joint_custom_pre_pass": QuantizedDecomposedOps()}
    if cpp_wrapper:
        options["cpp_wrapper"] = True
    return options


def _reference_model(model: object, argument: str) -> tuple[fx.GraphModule, FlowState]:
    """The reference form of ``convert_fx``'s model (kept by convert_fx for x86) or
    ``convert_to_reference_fx``'s model itself, with its flow state."""
    if flow_state(model) is None:
        msg = (
            f"{argument} must be a model returned by fxquant.convert_fx (or "
            f"convert_to_reference_fx), got {type(model).__name__}; prepare it with "
            "fxquant.get_backend_config('x86'), calibrate, and convert it first"
        )
        raise ConfigTypeError(msg)
    observers = _observers(model)
    if observers:  # a prepared model would compile as float with its observers recording
        msg = (
            f"{argument} is a prepared model (observers {', '.join(observers[:3])}"
            f"{'...' if len(observers) > 3 else ''}), not a converted one; calibrate it and "
            "pass fxquant.convert_fx(prepared) (or convert_to_reference_fx(prepared)) instead"
        )
        raise ConfigTypeError(msg)
    reference = reference_form(model)
    state = flow_state(reference)
    if reference is None or state is None:
        report = flow_state(model).report  # type: ignore[union-attr]  # checked above
        lowered = [e.node for e in report.entries() if e.status == NodeStatus.LOWERED]
        msg = (
            f"{argument} is lowered to kernels (nodes {', '.join(lowered[:3])}"
            f"{'...' if len(lowered) > 3 else ''}) and holds no reference form: convert_fx "
            "keeps it only for backend x86; pass fxquant.convert_to_reference_fx(prepared) "
            "instead"
        )
        raise ConfigTypeError(msg)
    return reference, state


def _observers(model: object) -> list[str]:
    """The observer nodes of ``model``'s graph (a prepared model has them, a converted none)."""
    if not isinstance(model, fx.GraphModule):
        return []
    modules = dict(model.named_modules())
    return [
        str(n.target)
        for n in model.graph.nodes
        if n.op == "call_module" and is_observer(modules[str(n.target)])
    ]


def _int8_linear_conv(model: fx.GraphModule) -> dict[str, str]:
    """Nodes running a quantized linear or conv on a statically quantized input, each with
    its kind (``"linear"`` or ``"conv"``).

    Those are what inductor's x86 passes turn into oneDNN int8 kernels; a
    linear whose input stays float (a float-kept node) or is quantized
    dynamically is not counted.
    """
    modules = dict(model.named_modules())
    found = {}
    for node in model.graph.nodes:
        if node.op != "call_module" or not node.args:
            continue
        module = modules[str(node.target)]
        inner = module[0] if isinstance(module, torch.nn.Sequential) and len(module) else module
        source = node.args[0]
        static_input = (
            isinstance(source, fx.Node)
            and source.op == "call_function"
            and source.target in DEQUANTIZE_OPS
        )
        if isinstance(inner, _LINEAR_CONV) and static_input:
            found[node.name] = "linear" if isinstance(inner, reference.Linear) else "conv"
    return found


FUSED_LINEAR_NOTE = (
    "{node}: a one-row GEMM this small runs inside a fused C++ loop of inductor's, on its "
    "dequantized int8 input and weight (inductor rewrites a one-row addmm with a weight of at "
    "most 16 x 16 so, before its int8 passes run): the reference's float linear on the same "
    "values, and faster at this size than a oneDNN int8 GEMM call"
)
"""The report's note on a quantized linear :func:`_fused_small_linears` finds."""

_SMALL_GEMM_LOOP = re.compile(r"cpp_fused_\w*addmm")


def _fused_small_linears(
    model: fx.GraphModule, example_inputs: tuple[Any, ...], code: str
) -> list[str]:
    """The quantized linears inductor computes in a fused float loop, not an int8 kernel.

    On CPU, inductor's decomposition of ``aten.addmm`` rewrites a GEMM of one row by a
    weight of at most 16 x 16 (or with one output column) as a multiply and a sum while
    it traces, before its x86 int8 passes look for ``dequantize -> addmm``: a small
    classifier after a global mean, at batch 1, becomes part of a fused C++ loop. That is
    inductor's choice and the faster one (tests/test_compiled.py's residual CNN: 205 us
    per call against 280 us with the int8 GEMM forced); the loop computes what the
    reference model does. Found by that rule (torch 2.13's) on the example's shapes, and
    only where the generated code has such a loop.
    """
    if not _SMALL_GEMM_LOOP.search(code):
        return []
    shapes = _OutputShapes(model)
    with torch.no_grad():
        shapes.run(*example_inputs)
    modules = dict(model.named_modules())
    found = []
    linears = [name for name, kind in _int8_linear_conv(model).items() if kind == "linear"]
    for node in (n for n in model.graph.nodes if n.name in linears):
        module = modules[str(node.target)]
        inner = module[0] if isinstance(module, torch.nn.Sequential) else module
        outputs, inputs = inner.weight.shape
        rows = shapes.of[node.args[0].name].numel() // inputs
        small = outputs == 1 or (inputs <= 16 and outputs <= 16)
        if rows == 1 and inner.bias is not None and small:
            found.append(node.name)
    return found


class _OutputShapes(fx.Interpreter):
    """Runs the model, keeping each node's output shape by node name (``of``)."""

    def __init__(self, model: fx.GraphModule) -> None:
        super().__init__(model)
        self.of: dict[str, torch.Size] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if isinstance(value, torch.Tensor):
            self.of[n.name] = value.shape
        return value


def _distinct(model: fx.GraphModule, names: Iterable[str]) -> int:
    """How many computations ``names`` are: a module called twice on the same input (DemoNet's
    ``fc``) is one, as inductor's common-subexpression elimination makes it."""
    wanted = set(names)
    nodes = [n for n in model.graph.nodes if n.name in wanted]
    return len({(str(n.target), n.args, tuple(n.kwargs.items())) for n in nodes})


def _kernel_kinds(kernels: Counter[str]) -> Counter[str]:
    """``kernels`` (oneDNN op name -> calls) counted by the kind of node each one runs."""
    kinds: Counter[str] = Counter()
    for name, count in kernels.items():
        kinds["linear" if name.startswith("qlinear") else "conv"] += count
    return kinds


def _not_delegated(node: str, kind: str, distinct: int, kernels: int) -> Reason | None:
    """Why ``node`` (a quantized ``kind``) is not an int8 kernel, or None when it is.

    Inductor's code does not say which node a kernel came from, so kernels are
    matched to nodes by kind: a kind with as many kernels as computations is all
    int8, one with none is all float; only a kind between the two stays a count.
    """
    if kernels >= distinct:
        return None
    if kernels == 0:
        words = (
            f"inductor compiled no oneDNN int8 {kind} kernel (quantized {kind} computations: "
            f"{distinct}): {node} runs as a float {kind} on dequantized values"
        )
    else:
        words = (
            f"inductor compiled {kernels} oneDNN int8 {kind} kernels for {distinct} quantized "
            f"{kind} computations: the others run dequantize -> float {kind} -> quantize "
            "(which ones, inductor's code does not say)"
        )
    return Reason(ReasonCode.NOT_DELEGATED, f"{node}: {words}")


def _compiled_report(
    report: Report, expected: Mapping[str, str], distinct: Counter[str], kernels: Counter[str]
) -> Report:
    """Quantized nodes are ``lowered`` (compiled by inductor); a quantized linear or conv
    (``expected``: node -> kind) whose kind got fewer oneDNN int8 kernels than it has
    distinct computations is ``not_delegated``, saying so."""
    entries = []
    for entry in report.entries():
        kind = expected.get(entry.node)
        reason = (
            None
            if kind is None
            else _not_delegated(entry.node, kind, distinct[kind], kernels[kind])
        )
        if reason is not None:
            entry = dataclasses.replace(entry, status=NodeStatus.REFERENCE, reason=reason)
        elif entry.status == NodeStatus.REFERENCE:
            entry = dataclasses.replace(entry, status=NodeStatus.LOWERED, reason=None)
        entries.append(entry)
    return Report(entries, report.unused(), report.notes())


class CompiledModel(DeployedModel):
    """A reference model compiled by inductor with freezing; call it like the model.

    The deployed-object protocol (``fxquant.registry.Deployed``): ``report``,
    ``explain()``, ``save(path)`` (an AOTInductor ``.pt2`` package) and
    ``CompiledModel.load(path)`` (a :class:`CompiledPackage`).

    Attributes:
        report: the model's report: quantized nodes ``lowered`` (compiled), a
            linear/conv inductor left in float ``not_delegated``.
        compile_seconds: wall time of the cold compile (the first call).
        kernels: oneDNN int8 ops in inductor's generated code, by name
            (``qlinear_pointwise``, ``qconv_pointwise``...).
        expected_kernels: distinct quantized linear/conv computations of the
            model that inductor runs as oneDNN int8 kernels when it fuses them (a
            module called twice on one input counts once; linears merged by
            :func:`merge_sibling_linears` count as one; a one-row linear small enough
            for inductor's fused float loop does not count: the report's note names it).
        merged: each merged linear's node -> the nodes it replaced.
        code: inductor's generated wrapper code of the first compile (with the C++
            wrapper: a Python module holding the C++ source).
        cpp_wrapper: whether inductor's C++ wrapper runs the calls (the default).
        written_inputs: positions of the inputs the compiled code would change
            (none with the guard of :mod:`fxquant_x86.inputs`); each call copies
            those before it runs, so the caller's tensors are never written.
        float_dtype: the dtype the float parts between quantize steps run in:
            ``torch.bfloat16`` where any node does (the config's bfloat16 nodes, or
            every float part with ``float_dtype=torch.bfloat16``), else ``torch.float32``.
        reference: the graph inductor compiled, as an eager model (the flat
            reference model, with its bfloat16 casts where ``float_dtype`` says so):
            what the compiled model computes, for ``fxquant.numerics`` comparisons.

    Each call runs under ``torch.no_grad()`` (freezing needs it). The first call of
    each input signature (the example's at construction) runs on copies of the
    inputs and checks which the compiled code changed. Inputs of
    another shape than the example's trigger a recompile (see the x86 README:
    a new batch size recompiles once with a symbolic batch dimension).

    Example:
        >>> # compiled = compile_quantized(reference_model, (x,)); compiled(x)
    """

    def __init__(
        self,
        model: fx.GraphModule,
        example_inputs: tuple[Any, ...],
        report: Report,
        *,
        merged: Mapping[str, list[str]] | None = None,
        flat: fx.GraphModule | None = None,
        cpp_wrapper: bool = True,
        **options: Any,
    ) -> None:
        self._model = model
        self._example_inputs = example_inputs
        self.cpp_wrapper = cpp_wrapper
        self._inductor_options = inductor_options(cpp_wrapper=cpp_wrapper)
        _load_inductor()
        # what inductor compiles: the flat form of the model when there is one
        self.flat = flat is not None
        self._compiled = torch.compile(model if flat is None else flat, **options)
        self._seen: set[tuple[Any, ...]] = set()
        self.written_inputs: frozenset[int] = frozenset()
        self._checked = False
        codes: list[str] = []
        start = time.perf_counter()
        # GraphLowering calls save_output_code with each compiled graph's code, also when it
        # comes from inductor's cache; patched only for the cold compile
        with mock.patch.object(_graph_lowering(), "save_output_code", codes.append):
            self(*example_inputs)
        self.compile_seconds = time.perf_counter() - start
        self.code = "\n".join(codes)
        self.kernels: Counter[str] = Counter(INT8_KERNELS.findall(self.code))
        fused = _fused_small_linears(model, example_inputs, self.code)
        expected = {n: k for n, k in _int8_linear_conv(model).items() if n not in fused}
        self.expected_kernels = _distinct(model, expected)
        self.merged = dict(merged or {})
        self.float_dtype = torch.float32
        self.reference: fx.GraphModule = model if flat is None else flat
        distinct: Counter[str] = Counter()
        for kind in set(expected.values()):
            distinct[kind] = _distinct(model, [n for n, k in expected.items() if k == kind])
        # the report names the model's own nodes: a merged linear stands for those it replaced
        named = {
            part: kind for name, kind in expected.items() for part in self.merged.get(name, [name])
        }
        found = _compiled_report(report, named, distinct, _kernel_kinds(self.kernels))
        self.report = found.with_notes(FUSED_LINEAR_NOTE.format(node=n) for n in fused)

    def __call__(self, *inputs: Any) -> Any:
        """Run the compiled model (grad disabled, the inductor options set for the call).

        A call whose inputs have a signature (:func:`input_signature`) that an
        earlier call ran with skips dynamo's guard evaluation: that earlier call
        passed every guard (or compiled a graph for it), and nothing else the
        guards check can change (the model is a private frozen copy, grad is off).
        Other calls evaluate the guards and may recompile.
        """
        key = input_signature(inputs)
        if key is not None and key in self._seen:
            with torch.no_grad(), _skip_guards():
                return self._compiled(*copy_written(inputs, self.written_inputs))
        options = _inductor_config().patch(self._inductor_options)
        with options, torch.no_grad(), never_into_inputs():  # any of these calls may compile
            if key is None and self._checked:  # inputs it cannot sign: checked once, not per call
                return self._compiled(*copy_written(inputs, self.written_inputs))
            out, copies, written = call_on_copies(self._compiled, inputs)
        self._checked = True
        self.written_inputs |= written
        if key is not None and input_signature(copies) == key:  # copies alias as inputs do
            self._seen.add(key)
        return out

    def save(self, path: str | Path, *, dynamic_batch: bool = True) -> Path:  # type: ignore[override]  # the base's **options, named
        """Compile the model ahead of time (AOTInductor) into a ``.pt2`` package at ``path``.

        The package holds the compiled C++ code and the frozen, prepacked
        weights; the report goes to ``PATH.fxquant.json``. ``CompiledModel.load``
        (or :func:`load`, without the report) runs it. ``dynamic_batch``: dim 0
        of every tensor input is a batch dimension (any size from 1; an example
        of batch 1 is traced at batch 2); otherwise the package takes the
        example inputs' shapes only. This is a second compile (tens of seconds
        for a BERT-base).

        Raises:
            fxquant.errors.ExportError: ``torch.export`` could not capture the
                model (with ``dynamic_batch``, the message says to try without).

        Example:
            >>> # compiled.save("model.pt2"); CompiledModel.load("model.pt2")(x)
        """
        return super().save(path, dynamic_batch=dynamic_batch)

    suffix = ".pt2"

    def save_artifact(self, path: Path, **options: Any) -> Mapping[str, Any]:
        """The AOTInductor package at ``path`` (:meth:`save`)."""
        save_package(self._model, self._example_inputs, path, **options)
        return {}

    @classmethod
    def load_artifact(
        cls, path: Path, report: Report, extras: Mapping[str, Any]
    ) -> CompiledPackage:
        """The package :meth:`save` wrote, as a :class:`CompiledPackage`."""
        return CompiledPackage(path, report)

    def __repr__(self) -> str:
        found = ", ".join(f"{n} {name}" for name, n in sorted(self.kernels.items())) or "none"
        return (
            f"CompiledModel(oneDNN int8 kernels: {found}; {self.expected_kernels} expected for "
            f"the quantized linear/conv nodes; cold compile {self.compile_seconds:.1f} s)"
        )


class CompiledPackage(DeployedModel):
    """An AOTInductor package :meth:`CompiledModel.save` wrote, loaded; call it like the model.

    Runs the package's compiled code (no inductor compile, no fxquant model);
    ``report`` is the deployed model's, read from ``PATH.fxquant.json``.

    Example:
        >>> # package = CompiledModel.load("model.pt2"); package(x); package.explain()
    """

    suffix = ".pt2"

    def __init__(self, path: str | Path, report: Report) -> None:
        self.path = Path(path)
        self.report = report
        self._run = load(self.path)

    def __call__(self, *inputs: Any) -> Any:
        """Run the package (grad disabled, as the compiled model)."""
        with torch.no_grad():
            return self._run(*inputs)

    def save_artifact(self, path: Path, **options: Any) -> Mapping[str, Any]:
        """A copy of the package at ``path`` (``options``: none; it is compiled already)."""
        if options:
            msg = f"a loaded package is compiled already: save(path) takes no {sorted(options)}"
            raise ConfigTypeError(msg)
        if path.resolve() != self.path.resolve():
            shutil.copyfile(self.path, path)
        return {}

    @classmethod
    def load_artifact(
        cls, path: Path, report: Report, extras: Mapping[str, Any]
    ) -> CompiledPackage:
        """The package at ``path``."""
        return cls(path, report)

    def __repr__(self) -> str:
        return f"CompiledPackage({str(self.path)!r})"


def input_signature(inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """What dynamo's guards check of a call's inputs and state, or ``None`` if unsure.

    Tensors: shape, strides, storage offset, dtype, device, ``requires_grad``
    and which earlier input shares their storage; bools, ints, floats, strings and ``None`` by
    value; the default dtype, CPU autocast, grad mode and inference mode. Any other input,
    or an active torch function mode, gives ``None`` (the call evaluates the guards).

    Example:
        >>> input_signature((torch.zeros(2, 3), 1)) == input_signature((torch.ones(2, 3), 1))
        True
        >>> input_signature((torch.zeros(2, 3),)) == input_signature((torch.zeros(3, 2),))
        False
    """
    if _function_modes():
        return None
    key: list[Any] = [
        torch.get_default_dtype(),
        torch.is_autocast_enabled("cpu"),
        # dynamo compiles a graph per grad mode: a call in the other mode must not reuse it
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
    ]
    storages: list[int] = []
    for x in inputs:
        if type(x) is torch.Tensor:
            pointer = x.untyped_storage().data_ptr()
            shared = storages.index(pointer) if pointer in storages else -1
            storages.append(pointer)
            key.append(
                (
                    x.shape,
                    x.stride(),
                    x.storage_offset(),
                    x.dtype,
                    x.device,
                    x.requires_grad,
                    shared,
                )
            )
        elif x is None or type(x) in (bool, int, float, str):
            key.append((type(x), x))
        else:
            return None
    return tuple(key)


def _function_modes() -> int:
    count = getattr(torch._C, "_len_torch_function_stack", None)
    return 1 if count is None else int(count())


def _skip_guards() -> Any:
    # only for an input signature a guarded call already ran with (CompiledModel.__call__)
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


def _inductor_config() -> Any:
    from torch._inductor import config

    return config


def _graph_lowering() -> type:
    from torch._inductor.graph import GraphLowering

    return GraphLowering


def _batch_shapes(example_inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    batch = torch.export.Dim("batch", min=1, max=2**16)
    return tuple(
        {0: batch} if isinstance(x, torch.Tensor) and x.dim() > 0 else None for x in example_inputs
    )


def _batch_of_two(example_inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The example at batch 2 when it is at batch 1: torch.export takes a size-1 dimension
    for a constant, so a batch-1 example cannot trace a dynamic batch."""
    batched = [x for x in example_inputs if isinstance(x, torch.Tensor) and x.dim() > 0]
    if not batched or any(x.shape[0] != 1 for x in batched):
        return example_inputs
    return tuple(
        torch.cat([x, x]) if isinstance(x, torch.Tensor) and x.dim() > 0 else x
        for x in example_inputs
    )


def _exported(
    model: fx.GraphModule, example_inputs: tuple[Any, ...], dynamic_batch: bool
) -> torch.export.ExportedProgram:
    from fxquant.errors import ExportError

    shapes = _batch_shapes(example_inputs) if dynamic_batch else None
    inputs = _batch_of_two(tuple(example_inputs)) if dynamic_batch else tuple(example_inputs)
    try:
        return torch.export.export(model, inputs, dynamic_shapes=shapes, strict=False)
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        msg = f"torch.export could not capture the model for AOTInductor: {first}"
        if dynamic_batch:
            msg += (
                "; with dynamic_batch=True dim 0 of every tensor input is one batch "
                "dimension: save(path, dynamic_batch=False) packages the example's shapes only"
            )
        raise ExportError(msg) from error


def save_package(
    model: fx.GraphModule,
    example_inputs: tuple[Any, ...],
    path: str | Path,
    *,
    dynamic_batch: bool = True,
) -> Path:
    """AOTInductor package of a converted model (see :meth:`CompiledModel.save`).

    Example:
        >>> # save_package(converted, (x,), "model.pt2")
    """
    if Path(path).suffix != ".pt2":
        msg = f"path must name a .pt2 file (AOTInductor's package), got {str(path)!r}"
        raise ConfigError(msg)
    _load_inductor()
    model, _ = _reference_model(model, "model")
    if any(not t.is_contiguous() for t in (*model.parameters(), *model.buffers())):
        model = copy.deepcopy(model)  # the caller's model keeps its own tensors
        _contiguous_tensors(model)
    with torch.no_grad():
        program = _exported(model, example_inputs, dynamic_batch)
        with never_into_inputs():
            written = torch._inductor.aoti_compile_and_package(
                program,
                package_path=str(path),
                inductor_configs=inductor_options(cpp_wrapper=False),
            )
    return Path(written)


def load(path: str | Path) -> Any:
    """Load a package :meth:`CompiledModel.save` wrote; call the result with the model's inputs.

    torch's own runner, without the report: ``CompiledModel.load(path)`` gives
    the deployed model (:class:`CompiledPackage`).

    Example:
        >>> # run = load("model.pt2"); run(x)
    """
    return torch._inductor.aoti_load_package(str(path))


def compile_quantized(  # noqa: PLR0913  (keyword-only switches of the public entry, each documented)
    model: fx.GraphModule,
    example_inputs: tuple[Any, ...],
    *,
    dynamic: bool | None = None,
    merge_linears: bool = True,
    flatten: bool = True,
    cpp_wrapper: bool = True,
    float_dtype: torch.dtype | None = None,
) -> CompiledModel:
    """Compile an x86 reference model with inductor (freezing on); compile it now, on the example.

    Args:
        model: what ``fxquant.convert_fx`` returned for a model prepared with
            the ``x86`` backend (its reference form, which convert_fx keeps, is
            compiled), or ``convert_to_reference_fx``'s for ``x86`` (or
            ``onednn``). A copy is compiled: later changes to ``model`` do not
            reach the compiled one.
        example_inputs: positional inputs; the first call compiles for their shapes.
        dynamic: ``torch.compile``'s: ``None`` (default) compiles for the
            example's shapes and recompiles once, with symbolic sizes, when a
            size changes; ``True`` compiles symbolic sizes from the start.
        merge_linears: linears reading one quantized input (attention's query,
            key and value) run as one wider int8 GEMM (:func:`merge_sibling_linears`).
        flatten: compile the model as one flat graph with integer weights
            (:func:`flatten_for_compile`): fewer guards per call, a faster compile.
        cpp_wrapper: inductor's C++ wrapper runs each call (:func:`inductor_options`):
            less per-call overhead and a faster cold compile; ``False`` for the
            Python wrapper (its generated code is easier to read).
        float_dtype: ``None`` (default): what the config says, node by node: the
            nodes a bfloat16 ``DTypeConfig`` was chosen for (the reference model
            rounds them to bfloat16; :func:`fxquant_x86.qconfig.bf16_qconfig_mapping`
            asks for them) run in bfloat16 (:func:`fxquant_x86.precision.float_side_in`),
            the rest as the reference does. A shorthand over the whole model:
            ``torch.bfloat16`` runs every float part between the quantize steps
            (LayerNorm, softmax, GELU, residual adds, attention) in bfloat16 and the
            int8 GEMMs hand them bfloat16 (:func:`fxquant_x86.precision.float_parts_in`);
            ``torch.float32`` runs the reference model as it is (its bfloat16
            roundings computed in float32). Needs the flat graph (``flatten``);
            without one, the reference model as it is.

    Returns:
        The compiled model (:class:`CompiledModel`).

    Raises:
        ConfigTypeError: ``model`` is not a converted fxquant model, or is
            lowered to another backend's kernels.

    Example:
        >>> # compiled = compile_quantized(convert_fx(prepared), (x,))
        >>> # compiled.kernels  -> Counter({'qlinear_pointwise': 2})
    """
    model, state = _reference_model(model, "model")
    if not isinstance(example_inputs, tuple):
        got = type(example_inputs).__name__
        msg = f"example_inputs must be a tuple of the model's positional inputs, got {got}"
        raise ConfigTypeError(msg)
    if float_dtype not in (None, torch.float32, torch.bfloat16):
        msg = (
            f"float_dtype must be torch.float32, torch.bfloat16 or None (what the config's "
            f"DTypeConfigs say, node by node), got {float_dtype!r}"
        )
        raise ConfigTypeError(msg)
    copied = copy.deepcopy(model)
    merged: dict[str, list[str]] = {}
    if merge_linears:
        merged = _merged_or_not(copied, example_inputs)
        if not merged:
            copied = copy.deepcopy(model)  # the pass may have touched it before giving up
    _contiguous_tensors(copied)
    flat = _flat_or_not(copied, example_inputs) if flatten else None
    if flat is not None:
        _conv1d_as_conv2d(flat)
    chosen, report = _float_side(flat, float_dtype, example_inputs, state.report)
    options: Mapping[str, Any] = {} if dynamic is None else {"dynamic": dynamic}
    compiled = CompiledModel(
        copied,
        example_inputs,
        report,
        merged=merged,
        flat=flat,
        cpp_wrapper=cpp_wrapper,
        **options,
    )
    compiled.float_dtype = chosen
    compiled.reference = flat if flat is not None else copied
    return compiled


def _float_side(
    flat: fx.GraphModule | None,
    float_dtype: torch.dtype | None,
    example_inputs: tuple[Any, ...],
    report: Report,
) -> tuple[torch.dtype, Report]:
    """Rewrite ``flat`` for the precision asked (``float_dtype``, else the config's); the
    dtype the float parts run in and the report with a note saying so."""
    if flat is None:
        return torch.float32, report
    if float_dtype == torch.bfloat16:
        precision.float_parts_in(flat, float_dtype)
        return float_dtype, report.with_notes([precision.BF16_NOTE])
    if float_dtype is None and precision.rounds_to_bf16(flat):
        count = precision.float_side_in(flat, example_inputs)
        note = precision.BF16_CONFIG_NOTE.format(count=count)
        return torch.bfloat16, report.with_notes([note])
    return precision.default_float_dtype(), report


def _contiguous_tensors(model: torch.nn.Module) -> None:
    """Every parameter and buffer of ``model`` (the private copy compiled) stored contiguous,
    in place; tied ones stay tied.

    Inductor's x86 int8 linear pass hands the weight constant to ``onednn.qlinear_prepack``,
    which reads its storage as if it were contiguous: a transposed view (transformers' GPT-2
    ``Conv1D`` weights, which the reference Linear holds as ``weight.t()``) ran as another
    matrix, the zoo's GPT-2 185 quantization steps from its reference model.
    """
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, tensor in list(store.items()):
                if tensor is None or tensor.is_contiguous():
                    continue
                if id(tensor) not in done:
                    dense = tensor.detach().contiguous()
                    if isinstance(tensor, torch.nn.Parameter):
                        dense = torch.nn.Parameter(dense, requires_grad=tensor.requires_grad)
                    done[id(tensor)] = dense
                setattr(module, name, done[id(tensor)])  # an LSTM re-reads its weights


def _conv1d_as_conv2d(flat: fx.GraphModule) -> int:
    """Each int8 ``conv1d`` of ``flat`` (dequantized input and weight) as a ``conv2d`` over a
    height of one, between an ``unsqueeze`` of its integer input and a ``squeeze`` of its
    output; how many.

    Inductor prepacks a conv1d's weight for oneDNN as 4-D and its shape function then takes
    the height of one for the kernel width: the output is propagated one size (Wav2Vec2's
    first conv: 80 for 79 samples) and the next op that checks a shape (GroupNorm's reshape)
    fails the compile. A 2-D conv is what oneDNN runs either way, and its shape is right.
    """
    graph, count = flat.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not torch.conv1d or node.kwargs:
            continue
        x, w, bias, stride, padding, dilation, groups = (*node.args, *(None,) * 7)[:7]
        if not (_dequantized(x) and _dequantized(w) and w.args[0].op == "get_attr"):
            continue
        if not all(isinstance(v, tuple) and len(v) == 1 for v in (stride, padding, dilation)):
            continue
        name = f"_conv2d_weight_{count}"
        flat.register_buffer(name, operator.attrgetter(str(w.args[0].target))(flat).unsqueeze(2))
        with graph.inserting_before(node):
            ints = graph.call_method("unsqueeze", (x.args[0], 2))
            x2 = graph.call_function(x.target, (ints, *x.args[1:]), dict(x.kwargs))
            w2 = graph.call_function(w.target, (graph.get_attr(name), *w.args[1:]), dict(w.kwargs))
            args = (x2, w2, bias, (1, *stride), (0, *padding), (1, *dilation), groups or 1)
            out = graph.call_method("squeeze", (graph.call_function(torch.conv2d, args), 2))
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        count += 1
    graph.eliminate_dead_code()
    flat.recompile()
    return count


def _dequantized(value: object) -> bool:
    """``value`` is a dequantize node of an integer tensor the graph holds."""
    return (
        isinstance(value, fx.Node)
        and value.op == "call_function"
        and value.target in DEQUANTIZE_OPS
        and isinstance(value.args[0], fx.Node)
    )


def _flat_or_not(model: fx.GraphModule, example_inputs: tuple[Any, ...]) -> fx.GraphModule | None:
    """:func:`flatten_for_compile`, kept only if it traces and computes the same output as
    ``model`` on the example, bit for bit (the same ops on the same values)."""
    try:
        flat = flatten_for_compile(model)
        with torch.no_grad():
            expected, got = model(*example_inputs), flat(*example_inputs)
    except Exception:  # a module fx cannot trace through: compile the model as it is
        return None
    same = torch.utils._pytree.tree_flatten(expected), torch.utils._pytree.tree_flatten(got)
    (left, left_spec), (right, right_spec) = same
    if left_spec != right_spec or not all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        for a, b in zip(left, right, strict=True)
    ):
        return None
    return flat


def _merged_or_not(model: fx.GraphModule, example_inputs: tuple[Any, ...]) -> dict[str, list[str]]:
    """:func:`merge_sibling_linears`, kept only if the merged model runs the example: a
    later ``view`` that flattens a sliced output (not contiguous) would fail to trace."""
    merged = merge_sibling_linears(model)
    if merged:
        try:
            with torch.no_grad():
                model(*example_inputs)
        except RuntimeError:
            return {}
    return merged


def deploy(model: fx.GraphModule, example_inputs: tuple[Any, ...]) -> CompiledModel:
    """The ``fxquant_deployment`` entry: :func:`compile_quantized` with the defaults.

    Example:
        >>> # fxquant.registry.get_deployment("x86").deploy(fxquant.convert_fx(prepared), (x,))
    """
    return compile_quantized(model, example_inputs)
