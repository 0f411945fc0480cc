"""Tracing a transformers model with transformers' own tracer and fxquant's leaf rules.

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
from collections.abc import Iterator, Mapping
from typing import Any

from torch import fx, nn

from fxquant.errors import ConfigError
from fxquant.flow.context import FlowContext
from fxquant.flow.trace import MODEL_TRACERS, QuantizationTracer, mark_internal

__all__ = ["available", "trace_transformers_model", "tracer_class"]


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
        {"__module__": __name__, "__doc__": tracer_class.__doc__},
    )
    return cls


def __getattr__(name: str) -> Any:
    if name == "HFQuantizationTracer":
        return tracer_class()
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def trace_transformers_model(
    root: nn.Module, ctx: FlowContext, leaves: tuple[set[str], tuple[type, ...]]
) -> tuple[fx.Tracer, fx.Graph]:
    """Trace ``root`` with ``HFQuantizationTracer``; returns the tracer and its graph.

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
    dummy = {name: value for name, value in bound.items() if name not in concrete}
    concrete.update(_defaults(signature, dummy, concrete))
    tracer: Any = tracer_class()(*leaves)  # HFTracer.trace takes dummy_inputs
    with _undecorated(type(root)):
        graph: fx.Graph = tracer.trace(
            root,
            concrete_args=concrete,
            dummy_inputs=dummy,
            complete_concrete_args_with_inputs_not_in_dummy_inputs=False,
        )
    return tracer, graph


@contextlib.contextmanager
def _undecorated(cls: type) -> Iterator[None]:
    """``cls.forward`` without transformers' decorators while tracing.

    transformers 4.5x wraps ``forward`` (``check_model_inputs``: output capture,
    ``use_cache`` and ``return_dict`` from the config) in a ``(self, *args, **kwargs)``
    wrapper; torch.fx traces the wrapper's own signature, whose ``**kwargs`` it passes
    as None, and ViTModel failed with ``'NoneType' object has no attribute 'get'``.
    The function it wraps (``__wrapped__``) is the model.
    """
    forward = cls.__dict__.get("forward")
    inner = getattr(forward, "__wrapped__", None)
    if inner is None or not getattr(forward, "__module__", "").startswith("transformers."):
        yield
        return
    cls.forward = inner  # type: ignore[attr-defined]  # restored below
    try:
        yield
    finally:
        cls.forward = forward  # type: ignore[attr-defined]


def _defaults(
    signature: inspect.Signature, dummy: Mapping[str, Any], given: Mapping[str, Any]
) -> dict[str, Any]:
    """The concrete value of each parameter neither traced nor given: its default.

    ``**kwargs`` (GPT-2, T5, most models since transformers 4.5x) stays out: it has no
    default, and an empty one is what a call without it passes. ``use_cache`` is False:
    a traced model returns no key/value cache (a ``DynamicCache`` object is no tensor).
    """
    found: dict[str, Any] = {}
    for name, parameter in signature.parameters.items():
        if name in dummy or name in given or parameter.kind in _VARIADIC:
            continue
        if parameter.default is inspect.Parameter.empty:
            msg = (
                f"{name!r} of forward{signature} has no default and no example input; "
                f"pass it in example_inputs or concrete_args={{{name!r}: value}}"
            )
            raise ConfigError(msg)
        found[name] = False if name == "use_cache" else parameter.default
    return found


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _for_transformers(root: nn.Module) -> types.ModuleType | None:
    """This module for a transformers model when transformers.utils.fx is there, else None."""
    transformers = sys.modules.get("transformers")  # a transformers model means it is imported
    if transformers is None or not isinstance(root, transformers.PreTrainedModel):
        return None
    # without transformers.utils.fx (5.x): torch.fx's tracer, as for any model
    return sys.modules[__name__] if available() else None


MODEL_TRACERS.append(_for_transformers)  # flow/trace.py asks; it does not import this module (#21)
