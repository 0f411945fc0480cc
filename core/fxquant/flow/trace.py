"""Capture: symbolic tracing that honours ``PrepareCustomConfig``.

    model (nn.Module) --QuantizationTracer--> GraphModule (new containers, same leaves)
    model (GraphModule) --------------------> its graph as it is (``flow.adopt``)

The tracer keeps as single ``call_module`` nodes: torch's own modules,
fxquant's fused/QAT/reference modules, and the non-traceable, standalone and
custom modules the config names. ``concrete_args`` (prepare's keyword) fixes
arguments of ``forward`` to values, as in ``torch.fx.symbolic_trace``. A
transformers model is traced by transformers' own tracer with these leaf rules
(``fxquant_transformers``, an optional part that registers itself in :data:`MODEL_TRACERS`):
its code asks tensors for their rank and dtype, which that tracer answers from meta tensors.
Each node gets a :class:`NodeInfo` (owning module path and type, the user's source line, its
call-order keys). The user's model is never modified: the GraphModule gets its own container
modules, and every step that changes a leaf module works on a copy of it. A model that cannot
be traced raises :class:`UntraceableModelError` naming the module and the source line.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import os
import sys
import threading
import traceback
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from fxquant.errors import ConfigError, FxquantError, UntraceableModelError
from fxquant.flow.adopt import adopt
from fxquant.flow.context import FlowContext
from fxquant.flow.inplace import InPlaceProxy
from fxquant.flow.mode_flag import MODE, MODE_ATTRIBUTE, carries_mode, mode_flags
from fxquant.flow.qconfig_assign import number_calls
from fxquant.flow.state import META_KEY, NodeInfo, update_info
from fxquant.flow.transformer import (
    leaf_rewrite,
    root_concrete_args,
    split_projections,
    traceable_root,
)
from fxquant.flow.user_model import own_copy
from fxquant.moved import tracer_hint
from fxquant.nn import is_leaf_module
from fxquant.torch_ao_names import is_torch_ao_module_class

__all__ = [
    "TRACING_LOCK",
    "QuantizationTracer",
    "UntraceableModelError",
    "drop_string_annotations",
    "trace",
]

# torch.fx tracing patches torch.nn.Module.__call__/__getattr__ process-wide, one patch at a
# time: two traces at once would each undo the other's. Every flow call that traces holds this
# lock; other threads' eager calls go through the patch too, and QuantizationTracer hands
# those back to torch untouched (a thread calibrating or converting while another traced got
# "module is not installed as a submodule").
TRACING_LOCK = threading.RLock()

# frames from these folders are never "the user's code"
_INTERNAL_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


_INTERNAL: dict[str, bool] = {}  # filename -> internal? (tracing asks once per frame)


def mark_internal(filename: str) -> None:
    """Count ``filename`` as a tracer's code, never the user's (a tracer from a library).

    Example:
        >>> mark_internal("<tracer>"); _is_internal("<tracer>")
        True
    """
    _INTERNAL[filename] = True


def _is_internal(filename: str) -> bool:
    if filename not in _INTERNAL:  # "<string>", "<eval_with_key>": code made at run time
        _INTERNAL[filename] = filename.startswith((*_INTERNAL_DIRS, "<"))
    return _INTERNAL[filename]


# the frame tracing runs in: the user code above it is the flow's caller (the prepare_fx
# line), not the model's; a model whose forward is all torch's (nn.Sequential) has no line
_TRACE_CODE = fx.Tracer.trace.__code__


def _user_frame(frame: types.FrameType | None) -> str | None:
    while frame is not None and frame.f_code is not _TRACE_CODE:
        filename = frame.f_code.co_filename
        if not _is_internal(filename):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class QuantizationTracer(fx.Tracer):
    """An FX tracer whose leaves are torch's and fxquant's modules plus configured ones.

    Args:
        leaf_names: qualified names of submodules to keep as single calls.
        leaf_classes: module classes to keep as single calls.

    Example:
        >>> tracer = QuantizationTracer(leaf_names={"body"}, leaf_classes=())
        >>> graph = tracer.trace(nn.Sequential(nn.Linear(2, 2)))
        >>> [n.op for n in graph.nodes]
        ['placeholder', 'call_module', 'output']
    """

    def __init__(
        self, leaf_names: set[str] | None = None, leaf_classes: tuple[type, ...] = ()
    ) -> None:
        # defaults: torch.fx re-creates the tracer class without arguments on unpickling
        super().__init__()
        self.leaf_names = leaf_names or set()
        self.leaf_classes = leaf_classes
        self.owns_modules = False
        """The root is the flow's own copy: rewrites may give its modules children."""
        self.thread = threading.get_ident()
        """The thread that traces: the only one whose module calls become nodes."""

    def foreign(self) -> bool:
        """Whether the running thread is another thread than the tracing one.

        torch.fx's patch of ``nn.Module.__call__``/``__getattr__`` is process-wide while
        it traces: another thread's eager call must run as if nothing was patched.
        """
        return threading.get_ident() != self.thread

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """Configured names/classes and fxquant's own modules are leaves, then torch's rule."""
        if module_qualified_name in self.leaf_names or isinstance(m, self.leaf_classes):
            return True
        if is_leaf_module(m) or is_torch_ao_module_class(type(m)):
            return True  # fused torch.ao modules are Sequentials, which torch.fx would enter
        if leaf_rewrite(m) is not None:
            return False  # torch's transformer modules: traced through
        return bool(super().is_leaf_module(m, module_qualified_name))

    def call_module(  # torch.fx's signature
        self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """torch.fx's rule, tracing a rewritten module's plain-op forward."""
        if self.foreign():
            return forward(*args, **kwargs)
        rewrite = leaf_rewrite(m)
        if rewrite is not None and not self.is_leaf_module(m, path := self.path_of_module(m)):
            if self.owns_modules:  # MultiheadAttention's projections as Linear children
                for name, child in split_projections(m):
                    if self.submodule_paths is not None:
                        self.submodule_paths[child] = f"{path}.{name}" if path else name
            forward = functools.partial(rewrite, m)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        """torch.fx's rule (a parameter of the root becomes a ``get_attr`` proxy) in the
        tracing thread only: another thread reading a shared parameter gets the tensor."""
        if self.foreign():
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        """torch.fx's proxy, recording ``y += 1`` as in place (``fxquant.flow.inplace``).

        A tracer further down the MRO with a proxy of its own (transformers' ``HFProxy``
        answers ``dim()`` and ``shape`` from metadata) keeps it: replacing it breaks tracing.
        """
        proxy = super().proxy(node)
        return InPlaceProxy(node, self) if type(proxy) is fx.Proxy else proxy

    def create_proxy(  # torch.fx's signature
        self, kind: str, target: Any, args: Any, kwargs: Any, *rest: Any, **options: Any
    ) -> fx.Proxy:
        """torch.fx's proxy; a module's ``training`` flag given to the call
        (``fxquant.flow.mode_flag``) becomes the graph module's ``training``."""
        if not self.foreign() and carries_mode(args, kwargs):
            args, kwargs = fx.node.map_aggregate((args, kwargs), self._mode_or_value)
        return super().create_proxy(kind, target, args, kwargs, *rest, **options)

    def _mode_or_value(self, value: Any) -> Any:
        return self._mode_proxy() if value is MODE else value

    def _mode_proxy(self) -> fx.Proxy:
        """One ``get_attr training`` node per graph, made where it is first read."""
        cached: fx.Proxy | None = getattr(self, "_mode", None)
        if cached is None or cached.node.graph is not self.graph:
            cached = super().create_proxy("get_attr", MODE_ATTRIBUTE, (), {})
            # transformers' proxy: its meta runs take a plain bool (the class's method: a
            # proxy answers any attribute it is asked for with a new node)
            install = getattr(type(cached), "install_metadata", None)
            if install is not None:
                install(cached, False)
            self._mode = cached
        return cached

    def create_node(  # torch.fx's signature
        self,
        kind: str,
        target: Any,
        args: Any,
        kwargs: Any,
        name: str | None = None,
        type_expr: Any | None = None,
    ) -> fx.Node:
        """torch.fx's node, plus its NodeInfo (owning module, user's source line)."""
        node = super().create_node(kind, target, args, kwargs, name, type_expr)
        if kind == "call_module":
            path, owner = str(target), type(self.root.get_submodule(str(target)))
        else:
            path, owner = self.scope.module_path, self.scope.module_type
        source = _user_frame(sys._getframe(1)) if kind.startswith("call") else None
        node.meta[META_KEY] = NodeInfo(module_path=path, module_type=owner, source=source)
        return node


def _leaves(ctx: FlowContext) -> tuple[set[str], tuple[type, ...]]:
    config = ctx.prepare_custom_config
    names = set(config.non_traceable_module_names) | set(config.standalone_module_names)
    classes = [*config.non_traceable_module_classes, *config.standalone_module_classes]
    classes += [cls for mapping in config.float_to_observed_mapping.values() for cls in mapping]
    return names, tuple(classes)


def trace(model: nn.Module, ctx: FlowContext) -> fx.GraphModule:
    """Trace ``model`` into a new GraphModule; ``model`` itself is left untouched.

    A GraphModule is taken as it is (see ``fxquant.flow.adopt``), not traced
    again. For QAT the whole model is copied first (QAT modules share parameters
    with the modules they replace, and training must not change the user's model).

    Raises:
        UntraceableModelError: naming the module path, the source line and how to
            mark the module non-traceable.
        ConfigError: ``concrete_args`` names no parameter of ``forward``, or the
            model is a GraphModule already.

    Example:
        >>> from fxquant.config.backend import BackendConfig
        >>> from fxquant.registry.resolution import ResolvedBackend
        >>> ctx = FlowContext(ResolvedBackend(BackendConfig("b")))
        >>> gm = trace(nn.Sequential(nn.Linear(2, 2)), ctx)
        >>> gm.meta["fxquant"] if "fxquant" in gm.meta else "no state yet"
        'no state yet'
    """
    if not isinstance(model, nn.Module):
        msg = f"model must be a torch.nn.Module, got {model!r} of type {type(model).__name__}"
        raise TypeError(msg)
    model = _compiled_module(model) or model  # torch.compile(model): its module
    if isinstance(model, fx.GraphModule):
        fresh = not any(META_KEY in n.meta for n in model.graph.nodes)
        gm = adopt(model, ctx, _is_internal)
        if drop_string_annotations(gm.graph):
            gm.recompile()
    else:
        fresh, gm = True, _trace_module(model, ctx)
    if fresh:  # a GraphModule from fuse_fx keeps the keys numbered before its fusion
        for node, keys in number_calls(gm.graph, dict(gm.named_modules())).items():
            update_info(node, call_orders=keys)
    return _keep_attributes(model, gm, ctx)


def _trace_module(model: nn.Module, ctx: FlowContext) -> fx.GraphModule:
    # PTQ: parameters shared, buffers and modules the flow's own
    root = copy.deepcopy(model) if ctx.is_qat else own_copy(model)
    if root is not model:  # our copy: torch.compile'd submodules become their modules
        _drop_compile_wrappers(root)
    concrete = _check_concrete_args(root, ctx)
    tracer = QuantizationTracer(*_leaves(ctx))
    tracer.owns_modules = root is not model  # own_copy returns the model it cannot copy
    # a training-mode copy: its traced modules' self.training follows the graph module's mode
    owned_training = tracer.owns_modules and root.training
    flags = mode_flags(root, tracer.is_leaf_module) if owned_training else contextlib.nullcontext()
    try:
        with flags:
            traced_by, graph = _run_tracer(root, tracer, ctx, concrete)
    except FxquantError:
        raise
    except Exception as error:  # any failure inside user code while tracing
        raise _untraceable(root, error) from error
    drop_string_annotations(graph)
    gm = fx.GraphModule(traced_by.root, graph, type(model).__name__)
    gm.train(model.training)
    return gm


def _run_tracer(
    root: nn.Module, tracer: QuantizationTracer, ctx: FlowContext, concrete: dict[str, Any] | None
) -> tuple[fx.Tracer, fx.Graph]:
    """The tracer that fits ``root`` (transformers' for a transformers model), run on it."""
    # the registered tracer for root (transformers' for a transformers model), or None
    hf_trace = next((found for find in MODEL_TRACERS if (found := find(root)) is not None), None)
    if hf_trace is not None:
        leaves = (tracer.leaf_names, tracer.leaf_classes)
        traced: tuple[fx.Tracer, fx.Graph] = hf_trace.trace_transformers_model(
            root, ctx, leaves, owns_modules=tracer.owns_modules
        )
        return traced
    if not tracer.is_leaf_module(root, ""):  # a torch transformer module as the root
        concrete = root_concrete_args(root, len(ctx.example_inputs), concrete)
        if tracer.owns_modules:
            split_projections(root)
        root = traceable_root(root)
    return tracer, tracer.trace(root, concrete)


def _compiled_module(module: nn.Module) -> nn.Module | None:
    """The module a ``torch.compile`` wrapper (dynamo's OptimizedModule) runs, else None.

    fx cannot trace the wrapper (it failed as "missing the required forward function");
    the wrapper computes what its module does, so prepare quantizes that module (compile
    the converted model again if you want it compiled)."""
    inner = getattr(module, "_orig_mod", None)
    compiled = type(module).__name__ == "OptimizedModule"
    return inner if compiled and isinstance(inner, nn.Module) else None


def _drop_compile_wrappers(root: nn.Module) -> None:
    for path, module in list(root.named_modules()):
        inner = _compiled_module(module)
        if inner is not None and path:
            root.set_submodule(path, inner)


def _check_concrete_args(root: nn.Module, ctx: FlowContext) -> dict[str, Any] | None:
    if ctx.concrete_args is None:
        return None
    parameters = inspect.signature(root.forward).parameters
    unknown = [name for name in ctx.concrete_args if name not in parameters]
    if unknown:
        msg = (
            f"concrete_args names {', '.join(map(repr, unknown))}, not parameters of "
            f"{type(root).__name__}.forward; its parameters: {', '.join(parameters)}"
        )
        raise ConfigError(msg)
    return dict(ctx.concrete_args)


# tracers of other libraries' models, each (model) -> a module with trace_transformers_model or
# None: an optional part registers itself here (fxquant-transformers' package, which
# `import fxquant` imports when installed: fxquant.moved.TRACERS), so the flow imports no
# optional part
MODEL_TRACERS: list[Callable[[nn.Module], types.ModuleType | None]] = []


def drop_string_annotations(graph: fx.Graph) -> bool:
    """Clear node types that are strings, so the generated code pickles; whether any was.

    Example:
        >>> g = fx.Graph(); g.placeholder("x", type_expr="torch.Tensor").type
        'torch.Tensor'
        >>> drop_string_annotations(g), [n.type for n in g.nodes]
        (True, [None])
    """
    # `x: torch.Tensor` under `from __future__ import annotations` is the string
    # "torch.Tensor"; fx writes it into the code as a global that torch.save cannot pickle
    annotated = [node for node in graph.nodes if isinstance(node.type, str)]
    for node in annotated:
        node.type = None
    return bool(annotated)


def _keep_attributes(model: nn.Module, gm: fx.GraphModule, ctx: FlowContext) -> fx.GraphModule:
    names = dict.fromkeys(
        (*ctx.preserved_attributes, *ctx.prepare_custom_config.preserved_attributes)
    )
    for name in names:
        if hasattr(model, name):
            setattr(gm, name, getattr(model, name))
    return gm


def _untraceable(root: nn.Module, error: Exception) -> UntraceableModelError:
    paths = {id(m): name for name, m in root.named_modules()}
    module_path, module_cls, source = None, None, None
    for frame, line in traceback.walk_tb(error.__traceback__):  # innermost frame wins
        if not _is_internal(frame.f_code.co_filename):
            source = f"{frame.f_code.co_filename}:{line}"
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module) and id(owner) in paths:
                module_path, module_cls = paths[id(owner)], type(owner).__name__
    where = "the root module" if not module_path else f"module {module_path!r} ({module_cls})"
    fix = (
        f"PrepareCustomConfig().set_non_traceable_module_names([{module_path!r}])"
        if module_path
        else "PrepareCustomConfig().set_non_traceable_module_names([...]) on the failing part"
    )
    msg = (
        f"cannot trace the model: {where} failed at {source or 'an unknown line'}: "
        f"{type(error).__name__}: {error}; symbolic tracing cannot follow data-dependent "
        f"control flow; keep that module as one call with {fix} "
        f"(or set_non_traceable_module_classes([{module_cls or 'TheClass'}]))"
        f"{tracer_hint(type(root))}"
    )
    return UntraceableModelError(msg)
