"""Convert a prepared model: observers -> quantize/dequantize, weighted modules -> reference.

One pass over the graph of a copy of the prepared model::

    prepared:  x -> obs_0 -> fc (Linear) -> obs_1 -> relu -> out
    reference: x -> quantize_per_tensor -> dequantize_per_tensor -> fc (reference.Linear)
                 -> quantize_per_tensor -> dequantize_per_tensor -> relu -> out

Observers become ``torch.ops.fxquant`` quantize/dequantize steps on plain integer
tensors (see ``flow/convert_qdq.py``), weighted modules their reference modules
(``flow/convert_modules.py``), QAT modules float ones. ``convert_fx`` then lowers
the reference patterns with the backend's lowering rules (``flow/lower.py``).
The report on ``gm.meta["fxquant"]`` is updated: quantized nodes become
``reference`` (or ``lowered``).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
from torch import fx, nn
from torch.fx import GraphModule, Node

from fxquant.config.backend import BackendConfig
from fxquant.config.custom import ConvertCustomConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.flow.calibrated import (
    outlier_batches,
    single_valued,
    uncalibrated,
    warn_calibration,
    within_one_step,
)
from fxquant.flow.context import FlowContext, as_backend_config, as_config
from fxquant.flow.convert_copy import ModelCopy, copy_model, observed_constant, preserve
from fxquant.flow.convert_modules import is_observer, swap_weighted_module
from fxquant.flow.convert_qconfig import converted_report, turn_off, turned_off_nodes
from fxquant.flow.convert_qdq import replace_observer
from fxquant.flow.equalization.convert import apply_equalization
from fxquant.flow.equalization.prepare import EQUALIZATION_KEY
from fxquant.flow.kept_reference import release_replaced_weights
from fxquant.flow.lower import lower
from fxquant.flow.lowered_model import as_lowered
from fxquant.flow.names import attribute_value
from fxquant.flow.report import Report, raise_if_skipped
from fxquant.flow.state import META_KEY, FlowMeta, FlowState, flow_state, is_converted, node_info
from fxquant.flow.trace import drop_string_annotations
from fxquant.flow.user_model import warn_if_calibrated_in_training, warn_if_converted_in_training
from fxquant.lowering import DEQUANTIZE_OPS
from fxquant.registry import resolve_backend
from fxquant.registry.resolution import ResolvedBackend

__all__ = ["convert_fx", "convert_to_reference_fx"]


def _flow_state(graph_module: object, step: str) -> FlowState:
    state = flow_state(graph_module)
    if state is None:
        msg = (
            f"{step} expects a model returned by fxquant.prepare_fx or prepare_qat_fx, got "
            f"{type(graph_module).__name__}; prepare (and calibrate) the model first "
            "(a model saved with torch.save loses its flow state: convert before saving)"
        )
        raise ConfigTypeError(msg)
    if is_converted(state):
        msg = (
            f"{step} expects a prepared model, got one that convert_fx or "
            "convert_to_reference_fx already converted; pass the prepared model (convert "
            "leaves it unchanged, so it converts again) or use the converted model as it is"
        )
        raise ConfigTypeError(msg)
    return state


def _swap_custom_module(root: nn.Module, node: Node, module: nn.Module, cls: type) -> nn.Module:
    from_observed = getattr(cls, "from_observed", None)
    if not callable(from_observed):
        msg = (
            f"observed_to_quantized mapping names {cls!r} for {type(module).__name__} at "
            f"{node.target!r}, but it has no from_observed(observed_module) classmethod"
        )
        raise ConfigTypeError(msg)
    quantized: nn.Module = from_observed(module)
    root.set_submodule(str(node.target), quantized)
    return quantized


def _rewrite(model: ModelCopy, drop: set[Node], config: ConvertCustomConfig) -> None:
    """Every module call of the copy, in one pass: a dropped observer goes, a custom module
    becomes its quantized class, an observer its quantize/dequantize steps, a weighted module
    its reference module."""
    root, graph, modules = model.root, model.graph, model.modules
    mappings = config.observed_to_quantized_mapping.values()
    swaps = {observed: cls for mapping in mappings for observed, cls in mapping.items()}
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        module = modules[str(node.target)]
        if node in drop:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif type(module) in swaps:  # the quantized module is at its path for its other calls
            modules[str(node.target)] = _swap_custom_module(root, node, module, swaps[type(module)])
        elif is_observer(module):
            if observed_constant(node):
                # weights on a functional's edge: observed now, as torch.ao does
                module(attribute_value(root, node.args[0]))
            replace_observer(root, graph, node, module)
        else:
            swap_weighted_module(root, node, node_info(node), modules)


def _quantized_outputs(graph: fx.Graph, indexes: list[int]) -> None:
    """Outputs listed in ``output_quantized_idxs`` return the integer tensor, not the float."""
    if not indexes:
        return
    output = graph.output_node()
    value = output.args[0]
    values = list(value) if isinstance(value, (tuple, list)) else [value]
    for index in indexes:
        item = values[index] if index < len(values) else None
        if isinstance(item, Node) and item.op == "call_function" and item.target in DEQUANTIZE_OPS:
            values[index] = item.args[0]
    new = type(value)(values) if isinstance(value, (tuple, list)) else values[0]
    output.args = (new,)


def _tidy(graph: fx.Graph) -> None:
    # only a dequantize step left unused goes (a quantized output that returns the integers)
    graph.eliminate_dead_code(is_impure_node=lambda node: node.target not in DEQUANTIZE_OPS)
    drop_string_annotations(graph)  # a prepared graph may not come from fxquant's trace
    graph.lint()


def _unlowered_copy(gm: GraphModule) -> GraphModule:
    """A copy of the reference model before lowering that shares its weight tensors:
    lowering replaces modules and adds integer buffers but changes no tensor in place."""
    shared = {id(t): t for t in (*gm.parameters(), *gm.buffers())}
    return copy.deepcopy(gm, shared)


def _finish(gm: GraphModule, source: GraphModule, state: FlowState, report: Report) -> GraphModule:
    # the prepared model's mode, on every module: kernels and containers convert builds are
    # fresh modules, which start in training mode
    gm.train(source.training)
    gm.meta = FlowMeta({**source.meta, **gm.meta})  # convert's own entries win
    gm.meta[META_KEY] = dataclasses.replace(state, report=report)
    return gm


def _check_remove_qconfig(value: object, step: str) -> bool:
    if isinstance(value, bool):
        return value
    msg = (
        f"_remove_qconfig must be a bool, got {value!r} of type {type(value).__name__}; "
        f"{step}'s third positional argument is _remove_qconfig, as in torch.ao: pass "
        "qconfig_mapping= and backend_config= by keyword"
    )
    raise ConfigTypeError(msg)


def _remove_qconfig_attributes(model: nn.Module) -> None:
    """Delete the ``qconfig`` attributes a user set on modules (eager-mode style), as torch.ao.

    fxquant itself sets none: the qconfigs it applied live in the flow state,
    which ``fxquant.explain`` reads, and are kept.
    """
    for module in model.modules():
        if "qconfig" in vars(module):
            delattr(module, "qconfig")


def reference_model(
    graph_module: GraphModule,
    convert_custom_config: object,
    qconfig_mapping: object,
    step: str,
    *,
    strict: bool = False,
) -> tuple[GraphModule, FlowState, Report]:
    """The reference model of a prepared model, its flow state and its updated report.

    Example:
        >>> # see convert_to_reference_fx
    """
    state = _flow_state(graph_module, step)
    config = as_config(convert_custom_config, ConvertCustomConfig, "convert_custom_config")
    mapping: QConfigMapping | None = None  # None: prepare's qconfigs stand
    if qconfig_mapping is not None:
        mapping = as_config(qconfig_mapping, QConfigMapping, "qconfig_mapping")
    source_modules = dict(graph_module.named_modules())
    turned_off = turned_off_nodes(graph_module, source_modules, mapping)
    # never-calibrated observers: their nodes stay float, reported and warned about
    not_calibrated = uncalibrated(graph_module, source_modules)
    warn_calibration(
        step,
        {} if strict else not_calibrated,  # strict raises naming them instead
        single_valued(graph_module, source_modules),
        outlier_batches(graph_module, source_modules),
        within_one_step(graph_module, source_modules),
    )
    if not state.is_qat:  # QAT observes in training mode by design
        warn_if_calibrated_in_training(graph_module, step)
    stays_float = {n for nodes in not_calibrated.values() for n in nodes} - turned_off
    off = turned_off | stays_float
    model = copy_model(graph_module, source_modules, off)
    equalized = apply_equalization(model)  # before observers go
    drop = turn_off(model, off)
    graph = model.graph
    drop |= {n for n in graph.nodes if n.op == "call_module" and n.target in not_calibrated}
    with torch.no_grad():
        _rewrite(model, drop, config)
    _quantized_outputs(graph, list(state.prepare_custom_config.output_quantized_indexes))
    _tidy(graph)
    # graph._tracer_cls stays None: torch.load re-traces the code with the recorded
    # tracer class, and the quantization tracer needs constructor arguments
    gm = GraphModule(model.root, graph, class_name=type(graph_module).__name__)
    preserved = [*state.prepare_custom_config.preserved_attributes, *config.preserved_attributes]
    preserve(graph_module, gm, preserved)
    if equalized:
        gm.meta[EQUALIZATION_KEY] = equalized
    warn_if_converted_in_training(gm, step)
    report = converted_report(state.report, turned_off, not_calibrated, stays_float)
    return gm, state, report


def convert_to_reference_fx(
    graph_module: GraphModule,
    convert_custom_config: ConvertCustomConfig | dict[str, Any] | None = None,
    _remove_qconfig: bool = True,
    qconfig_mapping: QConfigMapping | dict[str, Any] | None = None,
    backend_config: BackendConfig | dict[str, Any] | None = None,
) -> GraphModule:
    """Convert a prepared and calibrated model to a reference quantized model.

    Every observer becomes a quantize -> dequantize pair of ``torch.ops.fxquant``
    ops on plain ``uint8``/``int8``/``int32`` tensors, and every quantized
    weighted module its ``reference_quantized_module`` (``from_float``). The
    prepared model is not modified; the result carries the updated report
    (``fxquant.explain``).

    Args:
        graph_module: the model returned by ``prepare_fx``/``prepare_qat_fx``.
        convert_custom_config: custom module swaps and preserved attributes
            (or its torch.ao dict form).
        _remove_qconfig: as in torch.ao, delete the ``qconfig`` attributes set
            on the model's modules (eager-mode style) from the result; ``False``
            keeps them. fxquant sets no such attribute itself: the qconfigs it
            applied stay in the report either way.
        qconfig_mapping: optional; as in torch.ao it may set to ``None`` the
            qconfig of nodes quantized at prepare, which then stay float
            (reported ``qconfig_none``); other qconfigs are prepare's.
        backend_config: accepted for torch.ao compatibility (a ``BackendConfig``
            or its dict form); the prepare backend's pattern configs are used.
            Another backend's config is refused, as by ``convert_fx``, unless
            either of them is ``reference``.

    Returns:
        The reference model (a new ``GraphModule``).

    Raises:
        ConfigTypeError: ``graph_module`` is not a prepared model, or an
            argument is not of its type (nor its dict form).
        ConfigError: ``backend_config`` names another backend than prepare's
            (neither of them ``reference``); the message names both and the fix.

    Example:
        >>> import torch, fxquant
        >>> from fxquant.flow import convert_to_reference_fx, prepare_fx
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
        >>> mapping = fxquant.get_default_qconfig_mapping("reference")
        >>> prepared = prepare_fx(model, mapping, (torch.randn(2, 4),))
        >>> _ = prepared(torch.randn(2, 4))
        >>> reference = convert_to_reference_fx(prepared)
    """
    step = "convert_to_reference_fx"
    remove = _check_remove_qconfig(_remove_qconfig, step)
    chosen = as_backend_config(backend_config)  # the patterns were decided at prepare; see Args
    _check_same_backend(_flow_state(graph_module, step).backend, chosen, step)
    gm, state, report = reference_model(graph_module, convert_custom_config, qconfig_mapping, step)
    if remove:
        _remove_qconfig_attributes(gm)
    return _finish(gm, graph_module, state, report)


def _lowering_backend(state: FlowState, chosen: BackendConfig | None) -> ResolvedBackend:
    """The kernels of the backend ``convert_fx`` lowers with: what prepare resolved.

    The model records prepare's resolution, so convert asks the registry nothing,
    even when a plugin was registered in between; a config of the same name (a JSON
    round trip, a copy) keeps prepare's kernels. A model prepared for ``reference``
    (the generic patterns, no kernels) may be lowered with any backend's kernels,
    resolved here; another pair of backends is refused (``_check_same_backend``).
    """
    config = state.backend_config if chosen is None else chosen
    recorded = state.backend
    _check_same_backend(recorded, config, "convert_fx")
    if recorded is None or recorded.name != config.name:
        return resolve_backend(config, "convert_fx")
    return recorded if recorded.config is config else recorded.with_config(config)


def _check_same_backend(
    recorded: ResolvedBackend | None, config: BackendConfig | None, step: str
) -> None:
    """Refuse kernels of another backend than the one whose observers prepare chose:
    they may not honour them (fbgemm's kernels saturate on the full-range activations
    x86 and qnnpack observe; qnnpack's want the ranges it observes)."""
    if recorded is None or config is None:
        return
    prepared, chosen = recorded.name, config.name
    if prepared == chosen or "reference" in (prepared, chosen):  # generic: no kernels to differ
        return
    msg = (
        f"{step}: backend_config names backend {chosen!r}, but the model was prepared "
        f"for backend {prepared!r}; the backend is resolved once, at prepare, and its "
        f"observers, dtypes and fusions were chosen for {prepared!r}. Drop backend_config= "
        f"to keep backend {prepared!r} (and its kernels), or prepare the float model again with "
        f"backend_config=fxquant.get_backend_config({chosen!r})."
    )
    raise ConfigError(msg)


def convert_fx(
    graph_module: GraphModule,
    convert_custom_config: ConvertCustomConfig | dict[str, Any] | None = None,
    _remove_qconfig: bool = True,
    qconfig_mapping: QConfigMapping | dict[str, Any] | None = None,
    backend_config: BackendConfig | dict[str, Any] | None = None,
    *,
    strict: bool = False,
) -> GraphModule:
    """Convert a prepared model and lower it to the kernels of its backend.

    The reference model (:func:`convert_to_reference_fx`) is lowered with the
    lowering rules that plugins contribute for ``backend_config.name`` (the
    backend used at prepare when ``None``). Each lowered pattern becomes one
    kernel on integer tensors; a pattern without a rule stays in reference
    form and the report says ``no_lowering_kernel``, except on a backend that
    deploys its models outside PyTorch (``fxquant.registry.Deployment``:
    ExecuTorch, ONNX), whose toolchain takes the reference form as it is.

    Args:
        graph_module: the model returned by ``prepare_fx``/``prepare_qat_fx``.
        convert_custom_config: custom module swaps and preserved attributes
            (or its torch.ao dict form).
        _remove_qconfig: delete the modules' ``qconfig`` attributes (as above).
        qconfig_mapping: optional; ``None`` entries keep nodes float (as above).
        backend_config: whose lowering rules to use (a ``BackendConfig`` or its
            dict form); default: prepare's. Another backend's config is refused,
            unless the model was prepared for ``reference`` (see Raises).
        strict: raise instead of leaving any pattern skipped or unlowered.

    Returns:
        The lowered model (a new ``GraphModule``).

    Raises:
        ConfigTypeError: as :func:`convert_to_reference_fx`.
        ConfigError: as :func:`convert_to_reference_fx`.
        QuantizationSkipped: ``strict=True`` and a node was skipped or not lowered.

    Example:
        >>> import torch, fxquant
        >>> model, x = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval(), torch.randn(2, 4)
        >>> mapping = fxquant.get_default_qconfig_mapping("reference")
        >>> prepared = fxquant.prepare_fx(model, mapping, (x,))
        >>> _ = prepared(x)  # calibration
        >>> torch.allclose(convert_fx(prepared)(x), model(x), atol=0.05)
        True
    """
    remove = _check_remove_qconfig(_remove_qconfig, "convert_fx")
    chosen = as_backend_config(backend_config)  # before any work: a bad argument changes nothing
    gm, state, report = reference_model(
        graph_module, convert_custom_config, qconfig_mapping, "convert_fx", strict=strict
    )
    backend = _lowering_backend(state, chosen)
    ctx = FlowContext.for_convert(backend, strict=strict)
    if remove:  # before the copy below: neither model keeps them; no kernel reads them
        _remove_qconfig_attributes(gm)
    # the deployment of a backend that also lowers (x86) compiles the reference form
    reference = _unlowered_copy(gm) if backend.deployed and backend.lowering_rules else None
    lowered_report = lower(gm, ctx, report).with_notes([backend.kernels_note()])
    gm.graph.lint()
    gm = as_lowered(gm)  # recompiles; a node that fails when called names itself
    if reference is not None:
        release_replaced_weights(reference, gm)  # the kernels hold them: no float copy kept
        kept = _finish(reference, graph_module, state, report)
        state = dataclasses.replace(state, reference_model=kept)
    gm = _finish(gm, graph_module, state, lowered_report)
    if strict:
        raise_if_skipped(lowered_report, "convert_fx")
    return gm
