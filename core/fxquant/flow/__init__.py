"""The FX flow: fuse_fx, prepare_fx, prepare_qat_fx, convert_fx, convert_to_reference_fx, explain.

Each public function is a short recipe of the steps in this package::

    trace -> fuse -> (qconfigs, QAT swap, match, plan_observers, insert_observers) -> report

``convert_fx`` and ``convert_to_reference_fx`` live in ``fxquant.flow.convert``
and are re-exported here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import fx, nn

from fxquant.config.backend import BackendConfig
from fxquant.config.custom import FuseCustomConfig, PrepareCustomConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigTypeError
from fxquant.flow.aliases import alias_module_attributes
from fxquant.flow.calibrated import label_observers
from fxquant.flow.context import FlowContext, as_backend_config
from fxquant.flow.convert import convert_fx, convert_to_reference_fx
from fxquant.flow.equalization.prepare import EQUALIZATION_KEY
from fxquant.flow.equalization.prepare import insert_observers as _insert_equalization

# aliased: a bare `fuse`/`prepare`/`trace` here would hide the submodules of the same name
from fxquant.flow.fuse import fuse as _fuse
from fxquant.flow.fuse import fuse_assigned
from fxquant.flow.graph_mode import ComposedMode, compose, warn_composed
from fxquant.flow.inplace import functionalize
from fxquant.flow.mode_flag import drop_eval_identities
from fxquant.flow.prepare import prepare as _prepare_graph
from fxquant.flow.report import Report, raise_if_skipped
from fxquant.flow.state import META_KEY, FlowMeta, FlowState, flow_state, raise_if_flow_model
from fxquant.flow.trace import TRACING_LOCK
from fxquant.flow.trace import trace as _trace
from fxquant.flow.user_model import observe_in_model_mode, raise_if_not_float32, warn_if_training
from fxquant.registry import resolve_backend

__all__ = [
    "convert_fx",
    "convert_to_reference_fx",
    "explain",
    "fuse_fx",
    "prepare_fx",
    "prepare_qat_fx",
]


def _capture(model: nn.Module, ctx: FlowContext) -> fx.GraphModule:
    gm = _trace(model, ctx)
    functionalize(gm)  # in-place ops out of place before any step reads the graph
    drop_eval_identities(gm)  # before fusion: a conv and the add after the identity fuse
    alias_module_attributes(gm)  # a fused or swapped module's weight still reads the same
    return gm


def fuse_fx(
    model: nn.Module,
    fuse_custom_config: FuseCustomConfig | None = None,
    backend_config: BackendConfig | None = None,
) -> fx.GraphModule:
    """Trace ``model`` and fuse the patterns the backend fuses (conv+bn+relu, ...).

    Conv+BN is folded for an eval-mode model. ``model`` is not modified.
    ``backend_config=None`` is this host's native backend, as in :func:`prepare_fx`.

    Example:
        >>> import torch
        >>> m = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU()).eval()
        >>> type(fuse_fx(m).get_submodule("0")).__name__
        'ConvReLU2d'

    Raises:
        ConfigTypeError: ``model`` is one prepare or convert returned.
    """
    raise_if_flow_model(model, "fuse_fx")  # its observers or kernels are no float ops to fuse
    backend = resolve_backend(as_backend_config(backend_config), "fuse_fx")
    ctx = FlowContext.for_fuse(fuse_custom_config, backend)
    with TRACING_LOCK:  # tracing patches torch.nn.Module process-wide
        return _fuse(_capture(model, ctx), ctx)


def _prepare(
    model: nn.Module, ctx: FlowContext, step: str, equalization: QConfigMapping | None = None
) -> fx.GraphModule:
    raise_if_flow_model(model, step)  # observers observed twice, or no float ops left
    raise_if_not_float32(model, step)  # not a run-time dtype error after convert
    if not ctx.is_qat:
        warn_if_training(model, step)
    with TRACING_LOCK:  # tracing patches torch.nn.Module process-wide
        gm = _capture(model, ctx)
        # before fuse: fusion reads the mapping, so the mode's must decide it
        composed = _graph_mode(gm, ctx, equalization, step)
        if composed is not None:
            ctx = dataclasses.replace(ctx, qconfig_mapping=composed.qconfig_mapping)
            equalization = composed.equalization
        gm, assignment = fuse_assigned(gm, ctx, recompile=False)  # prepare recompiles once
        gm, report = _prepare_graph(gm, ctx, assignment)
    pairs = _insert_equalization(gm, equalization) if equalization is not None else ()
    if pairs:
        gm.recompile()
    label_observers(gm)  # observers' own warnings name their edge
    observe_in_model_mode(gm)  # so each can tell a batch recorded in training mode
    assert ctx.qconfig_mapping is not None  # for_prepare always sets it
    gm.meta = FlowMeta(gm.meta)  # so torch.save of a prepared model works (without the state)
    gm.meta[META_KEY] = FlowState(
        ctx.backend_config,
        ctx.qconfig_mapping,
        ctx.is_qat,
        report,
        ctx.prepare_custom_config,
        graph_mode=None if composed is None else composed.mode,
        notes=(*ctx.backend.notes(), *(() if composed is None else composed.lines())),
        backend=ctx.backend,
    )
    if pairs:
        gm.meta[EQUALIZATION_KEY] = pairs
    if ctx.strict:
        raise_if_skipped(report, step)
    return gm


def _graph_mode(
    gm: fx.GraphModule, ctx: FlowContext, equalization: QConfigMapping | None, step: str
) -> ComposedMode | None:
    """The backend's mode for this graph merged under the user's mapping and equalization."""
    assert ctx.qconfig_mapping is not None  # for_prepare always sets it
    answer = ctx.backend.graph_mode(gm, ctx.qconfig_mapping, ctx.is_qat)
    if answer is None:
        return None
    mode, base = answer
    composed = compose(mode, base, ctx.qconfig_mapping, equalization)
    warn_composed(composed, ctx.backend_config.name, step)
    return composed


def _equalization_mapping(value: object) -> QConfigMapping | None:
    if value is None or isinstance(value, QConfigMapping):
        return value
    if isinstance(value, dict):
        return QConfigMapping.from_dict(value)  # torch.ao's qconfig_dict form
    if isinstance(value, BackendConfig):
        msg = (
            f"_equalization_config got the BackendConfig {value.name!r}: prepare_fx takes the "
            "seed's order (model, qconfig_mapping, example_inputs, prepare_custom_config, "
            "_equalization_config, backend_config); pass backend_config=... by keyword"
        )
        raise ConfigTypeError(msg)
    msg = (
        "_equalization_config must be a fxquant.QConfigMapping of equalization qconfigs "
        "(e.g. QConfigMapping().set_object_type(torch.nn.Linear, "
        f"fxquant.default_equalization_qconfig)), its dict form or None, got {value!r} "
        f"of type {type(value).__name__}"
    )
    raise ConfigTypeError(msg)


def prepare_fx(  # noqa: PLR0913  # the seed's six arguments plus keyword-only strict, concrete_args
    model: nn.Module,
    qconfig_mapping: QConfigMapping,
    example_inputs: tuple[Any, ...],
    prepare_custom_config: PrepareCustomConfig | None = None,
    _equalization_config: QConfigMapping | dict[str, Any] | None = None,
    backend_config: BackendConfig | None = None,
    *,
    strict: bool = False,
    concrete_args: dict[str, Any] | None = None,
) -> fx.GraphModule:
    """Prepare an eval-mode model for post-training quantization: insert observers.

    Args:
        model: the float model (left unmodified; call ``model.eval()`` first). A
            ``torch.fx.GraphModule`` (from any tracer, e.g. transformers') is taken
            as it is, not traced again. A ``torch.compile``'d model (or submodule) is
            quantized as the module it compiles. Its floating parameters and buffers
            must be float32.
        qconfig_mapping: which qconfig each part gets.
        example_inputs: positional inputs of ``model.forward`` (their dtypes tell
            float tensors from integer ones).
        prepare_custom_config: tracing and boundary settings.
        _equalization_config: input-weight equalization, as in the seed: a
            ``QConfigMapping`` whose entries are equalization qconfigs
            (``fxquant.default_equalization_qconfig``, or an
            ``fxquant.numerics.EqualizationQConfig`` with a migration strength
            ``alpha``) for the Linears to equalize. Observers are inserted now;
            ``convert_fx`` computes the scales and folds them into the preceding
            LayerNorm or Linear where it can (``explain`` lists each pair).
        backend_config: the backend's patterns; None means this host's native backend,
            as in torch.ao: ``x86`` on an x86 CPU, ``qnnpack`` on ARM, among the
            installed ones (else ``reference``, with a ``NativeBackendWarning`` naming
            the plugin to install); ``explain`` says which and why, and ``convert_fx``
            lowers with it.
        strict: raise :class:`fxquant.QuantizationSkipped` instead of skipping a pattern.
        concrete_args: ``forward`` parameters to trace with fixed values, as in
            ``torch.fx.symbolic_trace`` (e.g. ``{"attention_mask": None}`` for an
            optional input the model is not called with). Keyword-only, after the
            seed's arguments and ``strict``.

    The backend may quantize a graph of a shape it recognizes its own way (a
    transformer on tensorrt: its ``fxquant_graph_mode`` hook): the mode's parts
    fill what your mapping and ``_equalization_config`` leave at the backend's
    default, your own entries win (``fxquant.flow.graph_mode``), and ``explain``
    prints ``mode: NAME (REASON)`` and what of it applied. A
    ``fxquant.errors.GraphModeWarning`` says when a part was not applied or your
    global qconfig is your own.

    Returns:
        A GraphModule with observers; ``fxquant.explain(gm)`` tells what was decided.

    Example:
        >>> import torch, fxquant
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
        >>> mapping = fxquant.get_default_qconfig_mapping("reference")
        >>> reference = fxquant.get_backend_config("reference")
        >>> gm = prepare_fx(m, mapping, (torch.randn(1, 4),), backend_config=reference)
        >>> [n.target for n in gm.graph.nodes if n.op == "call_module"]
        ['activation_post_process_0', '0', 'activation_post_process_1']
    """
    backend = resolve_backend(as_backend_config(backend_config), "prepare_fx")
    seed = (qconfig_mapping, example_inputs, prepare_custom_config, backend)
    ctx = FlowContext.for_prepare(*seed, is_qat=False, strict=strict, concrete_args=concrete_args)
    return _prepare(model, ctx, "prepare_fx", _equalization_mapping(_equalization_config))


def prepare_qat_fx(  # noqa: PLR0913  # the seed's five arguments plus keyword-only strict, concrete_args
    model: nn.Module,
    qconfig_mapping: QConfigMapping,
    example_inputs: tuple[Any, ...],
    prepare_custom_config: PrepareCustomConfig | None = None,
    backend_config: BackendConfig | None = None,
    *,
    strict: bool = False,
    concrete_args: dict[str, Any] | None = None,
) -> fx.GraphModule:
    """Prepare a train-mode model for quantization-aware training: QAT modules, fake quant.

    Same arguments as :func:`prepare_fx` (``concrete_args`` included) but for
    ``_equalization_config``, which QAT does not take (neither does the seed):
    equalization scales come from the weights at convert, and QAT trains those
    weights against its fake-quantized, unequalized inputs, so scaling them after
    training would change the numerics it learned; QAT adapts the weights to the
    input ranges itself. Equalize a float model with ``prepare_fx`` instead.
    ``model`` is copied, never modified. The backend's graph mode applies as in
    :func:`prepare_fx` (its mapping only: no equalization).

    Example:
        >>> import torch, fxquant
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4)).train()
        >>> mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
        >>> gm = prepare_qat_fx(m, mapping, (torch.randn(1, 4),))
        >>> type(gm.get_submodule("0")).__module__
        'fxquant.nn.qat'
    """
    backend = resolve_backend(as_backend_config(backend_config), "prepare_qat_fx")
    seed = (qconfig_mapping, example_inputs, prepare_custom_config, backend)
    ctx = FlowContext.for_prepare(*seed, is_qat=True, strict=strict, concrete_args=concrete_args)
    return _prepare(model, ctx, "prepare_qat_fx")


def explain(model: object, *, show: bool = True) -> Report:
    """The report of a prepared, converted or deployed model; printed unless ``show=False``.

    A deployed model (what a backend's ``Deployment.deploy`` returns) gives its
    own report: per node, what the target runtime took.

    Under the table: the backend ``backend_config=None`` resolved to, and why
    (``backend: NAME (...)``), the backend's graph mode when prepare picked one
    (``mode: NAME (REASON)``, then what of it applied under your entries), then the
    report's notes and the equalized pairs.

    Raises:
        ConfigTypeError: for a model that did not come out of prepare or convert.

    Example:
        >>> import torch, fxquant
        >>> m = torch.nn.Sequential(torch.nn.ReLU()).eval()
        >>> gm = prepare_fx(m, fxquant.get_default_qconfig_mapping("reference"), (torch.randn(2),))
        >>> [str(e.status) for e in explain(gm, show=False).entries()]
        ['float', 'quantized', 'float']
    """
    state = flow_state(model)
    report = getattr(model, "report", None)  # a deployed model (Deployed): its own report
    if state is None and not isinstance(report, Report):
        msg = (
            f"explain(model) needs a model returned by prepare_fx, prepare_qat_fx or "
            f"convert_fx, or a deployed one; got {type(model).__name__} without a report"
        )
        raise ConfigTypeError(msg)
    if state is not None:
        # the flow state's notes first: convert rebuilds the report
        pairs = getattr(model, "meta", {}).get(EQUALIZATION_KEY, ())
        equalized = (f"equalized: {pair.line()}" for pair in pairs)
        notes = (*state.notes, *state.report.notes(), *equalized)
        report = Report(state.report.entries(), state.report.unused(), notes)
    assert isinstance(report, Report)  # the flow state's or the deployed model's
    if show:
        print(report.table())  # printing the table is the point
    return report
