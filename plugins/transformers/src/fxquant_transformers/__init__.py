"""Tracing a transformers model with transformers' own tracer and fxquant's leaf rules.

An optional part of fxquant, in the distribution ``fxquant-transformers``: the core's
flow asks the tracers registered in ``fxquant.flow.trace.MODEL_TRACERS`` and imports no
optional part; this package registers itself there on import, and ``import fxquant`` imports
it when it is installed. Its old path, ``fxquant.flow.hf_trace``, gives this package.

    BertModel --HFQuantizationTracer(example inputs as dummy inputs)--> fx.Graph

transformers models ask their tensors for their rank and dtype in Python
(``if attention_mask.dim() == 3``, ``torch.finfo(dtype)``), which torch.fx's
tracer cannot answer: a proxy has no rank. transformers' ``HFTracer`` runs each
op on meta tensors alongside the proxies and answers those questions; this
module gives it fxquant's leaf rules and ``NodeInfo`` records (the MRO puts
:class:`~fxquant.flow.trace.QuantizationTracer` first). The example inputs are
its dummy inputs, bound to ``forward``'s parameters; the parameters they leave
out and ``concrete_args`` are concrete (their defaults, or the values given), as
with ``transformers.utils.fx.symbolic_trace``. transformers is imported only
when a transformers model is traced: the core does not depend on it.

Causal masks: transformers 4.5x builds the masks of decoder models (GPT-2,
Llama, ...; ``masking_utils.sdpa_mask`` / ``eager_mask``) by ``torch.vmap`` over
per-element mask functions, which symbolic tracing cannot enter. While tracing,
:func:`broadcast_mask_function` takes the place of ``masking_utils._vmap_for_bhqkv``:
the same mask function called once on index tensors shaped to broadcast
(``batch[:, None, None, None]`` ... ``kv[None, None, None, :]``), giving the same
boolean mask as plain tensor ops (comparisons, indexing, ``&``) in the graph.

Known limit: ``torch.save`` of the whole converted model does not load back,
since torch.fx traces a GraphModule's code again when loading it, and this code
(a buffer sliced by a traced length) needs transformers' tracer; save and load
its ``state_dict`` into a model quantized the same way instead.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from fxquant.errors import ConfigError, UntraceableModelError
from fxquant.flow.context import FlowContext
from fxquant.flow.trace import MODEL_TRACERS, QuantizationTracer, mark_internal
from torch import fx, nn

__all__ = ["available", "broadcast_mask_function", "trace_transformers_model", "tracer_class"]


def available() -> bool:
    """Whether the installed transformers has ``transformers.utils.fx`` (4.x; 5.0 dropped it).

    Example:
        >>> available() in (True, False)
        True
    """
    try:
        tracer_class()
    except ImportError:
        return False
    return True


@functools.cache
def tracer_class() -> type[QuantizationTracer]:
    """``HFQuantizationTracer``: transformers' ``HFTracer`` with fxquant's leaves and records.

    Raises:
        ImportError: transformers, or its ``transformers.utils.fx``, is not installed.

    Example:
        >>> # see tests/backends/test_transformers.py: a BertModel quantized end to end
    """
    module = importlib.import_module("transformers.utils.fx")
    mark_internal(inspect.getfile(module))  # its wrappers are not the user's source lines
    cls: type[QuantizationTracer] = type(
        "HFQuantizationTracer",
        (QuantizationTracer, module.HFTracer),
        # found by name (see __getattr__): torch.fx re-creates a GraphModule's tracer class
        # by name when it loads one
        {"__module__": __name__, "__doc__": tracer_class.__doc__, "iter": _iter_by_metadata},
    )
    return cls


def _iter_by_metadata(tracer: fx.Tracer, obj: Any) -> Iterator[Any]:
    """``*x.shape[:-1]``: a proxy whose metadata has a length iterates as its items.

    torch.fx iterates a proxy only where the bytecode unpacks a known count (``a, b = x``);
    GPT-2's ``(*key.shape[:-1], -1, head_dim)`` builds a list instead. transformers' tracer
    knows the value's length from its meta run; the items stay traced (``size[0]``, ...),
    so only the rank is fixed, as it is for the model anyway.
    """
    metadata = getattr(obj, "_metadata", None)
    if isinstance(metadata, (tuple, list)):  # torch.Size is a tuple
        return iter([obj[index] for index in range(len(metadata))])
    return fx.Tracer.iter(tracer, obj)  # torch.fx's rule


def __getattr__(name: str) -> Any:
    if name == "HFQuantizationTracer":
        return tracer_class()
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def trace_transformers_model(
    root: nn.Module,
    ctx: FlowContext,
    leaves: tuple[set[str], tuple[type, ...]],
    *,
    owns_modules: bool = False,
) -> tuple[fx.Tracer, fx.Graph]:
    """Trace ``root`` with ``HFQuantizationTracer``; returns the tracer and its graph.

    With ``owns_modules`` (``root`` is the flow's own copy), transformers' ``Conv1D``
    layers become ``nn.Linear`` first (:func:`linear_for_conv1d`).

    Raises:
        ConfigError: the example inputs do not fit ``root.forward``'s parameters.

    Example:
        >>> # see tests/backends/test_transformers.py: a BertModel quantized end to end
    """
    signature = inspect.signature(root.forward)
    try:
        bound = signature.bind_partial(*ctx.example_inputs).arguments
    except TypeError as error:
        msg = (
            f"example_inputs ({len(ctx.example_inputs)} values) do not fit "
            f"{type(root).__name__}.forward{signature}: {error}"
        )
        raise ConfigError(msg) from error
    concrete: dict[str, Any] = dict(ctx.concrete_args or {})
    # None in example_inputs (GPT-2's (input_ids, None, None, attention_mask)) is concrete:
    # a dummy input None had no metadata, and `cache_position.unsqueeze` failed
    concrete.update({name: None for name, value in bound.items() if value is None})
    dummy = {name: value for name, value in bound.items() if name not in concrete}
    concrete.update(_defaults(signature, dummy, concrete))
    if owns_modules:
        linear_for_conv1d(root, leaves)
    tracer: Any = tracer_class()(*leaves)  # HFTracer.trace takes dummy_inputs
    with _undecorated(root, owns_modules=owns_modules), _tracing_fixes():
        graph: fx.Graph = tracer.trace(
            root,
            concrete_args=concrete,
            dummy_inputs=dummy,
            complete_concrete_args_with_inputs_not_in_dummy_inputs=False,
        )
    _keep_positions(graph, list(bound))
    return tracer, graph


def _keep_positions(graph: fx.Graph, positional: list[str]) -> None:
    """A placeholder (default None) for each example input None before the last tensor one.

    transformers' tracer drops the placeholders of concrete arguments; the model traced
    from ``(input_ids, None, None, attention_mask)`` then took ``(input_ids, attention_mask)``
    and calibrating it with the example's own layout failed.
    """
    placeholders = {n.target: n for n in graph.nodes if n.op == "placeholder"}
    later: fx.Node | None = None
    inserted = False
    for name in reversed(positional):
        if name in placeholders:
            later = placeholders[name]
        elif later is not None:  # trailing Nones need no place
            with graph.inserting_before(later):
                later = graph.placeholder(name, default_value=None)
            inserted = True
    if not inserted:
        return
    # keyword calls (``prepared(input_ids, attention_mask=mask)``) still work: the
    # placeholders after a default one take None as their default too (Python's rule)
    defaulted = False
    for node in graph.find_nodes(op="placeholder"):
        defaulted = defaulted or bool(node.args)
        if defaulted and not node.args:
            node.args = (None,)


def linear_for_conv1d(root: nn.Module, leaves: tuple[set[str], tuple[type, ...]]) -> list[str]:
    """Replace transformers' ``Conv1D`` layers of ``root`` by ``nn.Linear``; returns their paths.

    GPT-2's ``Conv1D`` (also GPT, CTRL, ...) is a linear layer with its weight stored
    transposed, computed as ``torch.addmm(bias, x, weight)``: traced through, it was a
    float ``addmm`` no backend quantizes, and the whole GPT-2 stayed float. As an
    ``nn.Linear`` whose weight is a transposed *view* of the same storage (no copy) and
    whose bias is the same Parameter, it computes the same numbers and matches every
    backend's Linear patterns (int8 weights, fusions, dynamic). Only called on the flow's
    own copy; a ``Conv1D`` configured as a leaf (by name or class) stays as it is.

    Example:
        >>> from transformers.pytorch_utils import Conv1D
        >>> model = nn.Sequential(Conv1D(4, 3))
        >>> linear_for_conv1d(model, (set(), ())), type(model[0]).__name__
        (['0'], 'Linear')
    """
    utils = sys.modules.get("transformers.pytorch_utils")
    conv1d = getattr(utils, "Conv1D", None)
    if conv1d is None:
        return []
    names, classes = leaves
    swapped = [
        path
        for path, module in root.named_modules()
        if type(module) is conv1d and path not in names and not isinstance(module, classes)
    ]
    for path in swapped:
        module: Any = root.get_submodule(path)
        linear = nn.Linear(module.nx, module.nf, bias=True, device="meta")
        linear.weight = nn.Parameter(module.weight.detach().t(), module.weight.requires_grad)
        linear.bias = module.bias
        # a module traced in training mode reads the flow's mode flag (fxquant.flow.mode_flag)
        linear.train(module.training is not False)
        root.set_submodule(path, linear)
    return swapped


@contextlib.contextmanager
def _undecorated(root: nn.Module, *, owns_modules: bool) -> Iterator[None]:
    """``root``'s ``forward`` without transformers' decorators while tracing.

    transformers 4.5x wraps ``forward`` (``check_model_inputs``: output capture,
    ``use_cache`` and ``return_dict`` from the config) in a ``(self, *args, **kwargs)``
    wrapper; torch.fx traces the wrapper's own signature, whose ``**kwargs`` it passes
    as None, and ViTModel failed with ``'NoneType' object has no attribute 'get'``.
    The function it wraps (``__wrapped__``) is the model. torch.fx traces
    ``type(root).forward``: the flow's own copy gets a class of its own for the trace,
    so another thread running a model of that class keeps the decorated ``forward``
    (``output_hidden_states=True`` answered None while a ViT was being traced). A model
    the flow could not copy has its class patched, under the tracing lock.
    """
    cls: type = type(root)
    forward = cls.__dict__.get("forward")
    inner = getattr(forward, "__wrapped__", None)
    if inner is None or not getattr(forward, "__module__", "").startswith("transformers."):
        yield
        return
    if owns_modules:
        names = {"forward": inner, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        root.__class__ = type(cls.__name__, (cls,), names)
        try:
            yield
        finally:
            root.__class__ = cls
        return
    cls.forward = inner  # type: ignore[attr-defined]  # restored below
    try:
        yield
    finally:
        cls.forward = forward  # type: ignore[attr-defined]


@contextlib.contextmanager
def _tracing_fixes() -> Iterator[None]:
    """transformers' code made traceable while tracing; the tracer holds ``TRACING_LOCK``.

    - ``masking_utils._vmap_for_bhqkv`` (4.53+): :func:`broadcast_mask_function`;
    - the tracer's meta rule for ``torch.where`` (which adds its three arguments, so a
      number among them, as in ``eager_mask``'s ``torch.where(mask, 0.0, finfo.min)``,
      left every later node of GPT-2's eager attention without a shape): torch's own
      ``torch.where`` on meta tensors.
    """
    with contextlib.ExitStack() as stack:
        masking = sys.modules.get("transformers.masking_utils")
        if masking is not None and hasattr(masking, "_vmap_for_bhqkv"):
            stack.enter_context(
                _replaced(vars(masking), "_vmap_for_bhqkv", broadcast_mask_function)
            )
        hf_fx = sys.modules.get("transformers.utils.fx")
        overrides = getattr(hf_fx, "_MANUAL_META_OVERRIDES", None)
        if isinstance(overrides, dict) and torch.where in overrides:
            stack.enter_context(_replaced(overrides, torch.where, _where_on_meta))
        yield


@contextlib.contextmanager
def _replaced(mapping: dict[Any, Any], key: Any, value: Any) -> Iterator[None]:
    previous = mapping[key]
    mapping[key] = value
    try:
        yield
    finally:
        mapping[key] = previous


def _where_on_meta(condition: Any, *values: Any) -> Any:
    """``torch.where`` on meta tensors, numbers kept as they are (transformers' rule added them)."""
    return torch.where(condition.to("meta"), *(_on_meta(value) for value in values))


def _on_meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def broadcast_mask_function(
    mask_function: Callable[..., Any], bh_indices: bool = True
) -> Callable[..., Any]:
    """``mask_function`` over whole index ranges by broadcasting: ``_vmap_for_bhqkv``'s result.

    transformers' ``masking_utils._vmap_for_bhqkv(f)(batch, head, q, kv)`` is the mask
    ``m[b, h, i, j] = f(batch[b], head[h], q[i], kv[j])`` (with ``bh_indices=False``, a
    ``q x kv`` mask, batch and head None). Every mask function of ``masking_utils``
    (causal, sliding window, chunked, padding, packed sequences and their ``and_masks`` /
    ``or_masks``) is elementwise in its indices, so called once on indices shaped to
    broadcast it gives the same mask, with ops torch.fx records.

    Raises:
        UntraceableModelError: the mask function does not broadcast (a model's own mask
            function with Python control flow on an index, for instance).

    Example:
        >>> import torch
        >>> causal = lambda b, h, q, kv: kv <= q
        >>> mask = broadcast_mask_function(causal)(
        ...     torch.arange(2), torch.arange(1), torch.arange(3), torch.arange(3))
        >>> mask.shape, mask[0, 0].int().tolist()
        (torch.Size([2, 1, 3, 3]), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    """

    def mask(batch: Any, head: Any, q: Any, kv: Any) -> Any:
        indices: tuple[Any, ...]
        shape: tuple[Any, ...]
        if bh_indices:
            indices = (batch[:, None, None, None], head[None, :, None, None])
            shape = (batch.shape[0], head.shape[0], q.shape[0], kv.shape[0])
            indices += (q[None, None, :, None], kv[None, None, None, :])
        else:  # transformers' mask for torch < 2.6: q x kv, expanded to the batch by its caller
            indices, shape = (batch, head, q[:, None], kv[None, :]), (q.shape[0], kv.shape[0])
        try:
            return mask_function(*indices).expand(*shape)
        except Exception as error:
            name = getattr(mask_function, "__qualname__", repr(mask_function))
            msg = (
                f"cannot trace the model's attention mask: transformers builds it with "
                f"torch.vmap over the mask function {name}, which torch.fx cannot trace, and "
                f"that function does not broadcast over index tensors, as fxquant computes "
                f"it instead: {type(error).__name__}: {error}; pass the 4D attention mask "
                f"(batch x 1 x query x key) as an input, which transformers uses as it is"
            )
            raise UntraceableModelError(msg) from error

    return mask


def _defaults(
    signature: inspect.Signature, dummy: Mapping[str, Any], given: Mapping[str, Any]
) -> dict[str, Any]:
    """The concrete value of each parameter neither traced nor given: its default.

    ``**kwargs`` (GPT-2, T5, most models since transformers 4.5x) is given as empty
    (``{"kwargs": {}}``): transformers' tracer then gives its ``**kwargs`` placeholder an
    empty mapping as metadata, so ``**kwargs`` passed on (GPT-2's ``block(..., **kwargs)``)
    unpacks to nothing (it failed with ``argument after ** must be a mapping, not
    HFProxy``), and removes the placeholder from the graph. ``use_cache`` is
    False: a traced model returns no key/value cache (a ``DynamicCache`` object is no tensor).
    """
    found: dict[str, Any] = {}
    for name, parameter in signature.parameters.items():
        if name in dummy or name in given:
            continue
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            found[name] = {}
            continue
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if parameter.default is inspect.Parameter.empty:
            msg = (
                f"{name!r} of forward{signature} has no default and no example input; "
                f"pass it in example_inputs or concrete_args={{{name!r}: value}}"
            )
            raise ConfigError(msg)
        found[name] = False if name == "use_cache" else parameter.default
    return found


def _for_transformers(root: nn.Module) -> types.ModuleType | None:
    """This module for a transformers model when transformers.utils.fx is there, else None."""
    # A transformers model means its base class's module is imported. Reading
    # `transformers.PreTrainedModel` instead would import it, and a broken optional dependency
    # of transformers would then fail the trace of every model, transformers' or not.
    modeling = sys.modules.get("transformers.modeling_utils")
    if modeling is None or not isinstance(root, modeling.PreTrainedModel):
        return None
    # without transformers.utils.fx (5.x): torch.fx's tracer, as for any model
    return sys.modules[__name__] if available() else None


MODEL_TRACERS.append(_for_transformers)  # flow/trace.py asks; it does not import this package
