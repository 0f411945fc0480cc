"""In-place tensor ops become out-of-place ones right after capture.

A captured graph says what reads what, but an in-place op (``y.mul_(0.5)``,
``torch.relu_(y)``, ``F.relu(y, inplace=True)``, ``nn.ReLU(inplace=True)``,
``operator.setitem``) changes a value that other nodes read *by identity*: the
later ``self.b(y)`` reads ``y``'s node, not the ``mul_``. Every step after
capture breaks that hidden edge: an observer passes ``y`` through, a quantize
step makes a copy that the ``mul_`` then changes for nobody, a lowered kernel
reads the integers made before it. The converted model silently dropped the
op (0.36 off on a model whose outputs span 0.58).

So the flow makes the edge explicit before anything else looks at the graph:

* the op becomes its out-of-place form (``mul_`` -> ``mul``, ``torch.relu_`` ->
  ``torch.relu``, ``operator.iadd`` -> ``operator.add``, ``inplace=True`` ->
  ``False``; methods without one, such as ``fill_``, ``zero_`` or ``copy_``, run
  on a clone of their input: :func:`on_copy`), and
* every node after it that read the mutated value reads the op's result instead.

An in-place *module* (``nn.ReLU(inplace=True)``) keeps running in place on its
input, but nothing reads that input afterwards: its later readers read the
module's output. The prepared and converted models therefore never change
their inputs (the float model's ``x.mul_(2)`` changed the caller's tensor).

Refused with :class:`UntraceableModelError` (a clear error, never a silent
drop): an in-place op on a *view* whose base (or another view of it) is read
afterwards (``y.view(-1).mul_(2)`` then ``y``; reading the changed view itself
or the op's result is fine), and an in-place op on a module's parameter or
buffer (``self.buf.add_(1)`` in ``forward``), whose change would outlive the
call. An eval-mode dropout (``nn.Dropout(inplace=True)`` after EfficientNet's
``flatten``, ``F.dropout(..., training=False, inplace=True)``) is the identity:
no in-place op at all.

Example:
    >>> import torch
    >>> class M(torch.nn.Module):
    ...     def forward(self, x):
    ...         y = torch.relu(x)
    ...         y.mul_(0.5)
    ...         return y + 1
    >>> gm = torch.fx.symbolic_trace(M())
    >>> functionalize(gm)
    1
    >>> [n.target for n in gm.graph.nodes if n.op == "call_method"]
    ['mul']
    >>> float(gm(torch.tensor([2.0])))
    2.0
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxquant.errors import UntraceableModelError
from fxquant.flow.state import node_info

__all__ = ["InPlaceProxy", "functionalize", "on_copy", "setitem_copy"]

# Python's augmented assignments (operator.iadd for ``y += 1``), each to its plain operator
_OPERATORS: dict[Callable[..., Any], Callable[..., Any]] = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.imatmul: operator.matmul,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
    operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}

# methods ending in "_" that change no tensor values (or only autograd state)
_NOT_MUTATING = frozenset(
    {"requires_grad_", "retain_grad_", "share_memory_", "record_stream_", "detach_"}
)

# ops whose result may share memory with their first argument: a view of it
_VIEW_METHODS = frozenset(
    {
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "transpose",
        "transpose_",
        "permute",
        "t",
        "T",
        "mT",
        "narrow",
        "select",
        "expand",
        "expand_as",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "chunk",
        "split",
        "unbind",
        "tensor_split",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "diagonal",
        "as_strided",
        "unfold",
        "detach",
        "contiguous",
        "real",
        "imag",
        "__getitem__",
        "split_with_sizes",
        "to",
        "type_as",
        "view_as_real",
        "view_as_complex",
        "squeeze_",
        "unsqueeze_",
        "align_as",
    }
)
# the torch functions of the same names (torch.reshape, torch.chunk...), and ``x[i]``
_VIEW_FUNCTIONS: frozenset[Any] = frozenset(
    {operator.getitem} | {getattr(torch, name) for name in _VIEW_METHODS if hasattr(torch, name)}
)
_VIEW_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten, nn.Dropout)

# the dropouts: in eval mode (or training=False) each returns its input, changing nothing
_DROPOUT_FUNCTIONS: frozenset[Any] = frozenset(
    {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout}
)


def _dropout_trains(node: fx.Node) -> bool:
    """The ``training`` argument of an ``F.dropout``-like call (the third; its default
    differs: True for ``F.dropout``, False for ``F.alpha_dropout``)."""
    default = inspect.signature(node.target).parameters["training"].default  # type: ignore[arg-type]  # a dropout function
    given = node.args[2] if len(node.args) > 2 else default
    return node.kwargs.get("training", given) is not False


class InPlaceProxy(fx.Proxy):
    """A proxy that records ``y += 1`` as ``operator.iadd`` (torch.fx's records ``add``)
    and ``y[i] = v`` as ``operator.setitem`` (torch.fx's refuses it).

    torch.fx's Proxy has no ``__iadd__``, so Python falls back to ``__add__`` and
    rebinds the name: ``z = y; z += 1`` then leaves ``y`` unchanged in the graph
    while eager PyTorch changed it. Recording the in-place operator lets
    :func:`functionalize` rewire ``y``'s later readers.

    Example:
        >>> class M(torch.nn.Module):
        ...     def forward(self, x):
        ...         y = x * 1
        ...         z = y
        ...         z += 1
        ...         return y
        >>> from fxquant.flow.trace import QuantizationTracer
        >>> graph = QuantizationTracer().trace(M())
        >>> [n.target.__name__ for n in graph.nodes if n.op == "call_function"]
        ['mul', 'iadd']
    """

    def __setitem__(self, index: Any, value: Any) -> None:
        # torch.fx's Proxy refuses item assignment; recorded, functionalize makes it a copy
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})


def _in_place(op: Callable[[Any, Any], Any]) -> Callable[[fx.Proxy, Any], fx.Proxy]:
    def method(self: fx.Proxy, other: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {})

    method.__name__ = f"__{op.__name__}__"
    return method


for _op in _OPERATORS:
    setattr(InPlaceProxy, f"__{_op.__name__}__", _in_place(_op))


def on_copy(method: str, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``tensor.<method>(*args, **kwargs)`` run on a clone: an in-place method, functional.

    Example:
        >>> x = torch.ones(2)
        >>> on_copy("fill_", x, 3.0), x
        (tensor([3., 3.]), tensor([1., 1.]))
    """
    result: torch.Tensor = getattr(tensor.clone(), method)(*args, **kwargs)
    return result


def setitem_copy(tensor: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """``tensor[index] = value`` on a clone of ``tensor``; returns the clone.

    Example:
        >>> x = torch.zeros(2)
        >>> setitem_copy(x, 0, 5.0), x
        (tensor([5., 0.]), tensor([0., 0.]))
    """
    out = tensor.clone()
    out[index] = value
    return out


_REWRITES: dict[Any, Callable[..., Any]] = {**_OPERATORS, operator.setitem: setitem_copy}


def _out_of_place_function(target: Any) -> Callable[..., Any] | None:
    """``F.hardtanh`` for ``F.hardtanh_``, ``torch.relu`` for ``torch.relu_``...; else None."""
    name = getattr(target, "__name__", "")
    if not isinstance(name, str) or not name.endswith("_") or name.startswith("_"):
        return None
    for owner in (torch.nn.functional, torch):
        plain = getattr(owner, name[:-1], None)
        if getattr(owner, name, None) is target and callable(plain):
            return plain  # type: ignore[no-any-return]
    return None


def _inplace_param(target: Callable[..., Any]) -> int | None:
    """Position of an ``inplace`` parameter of a Python function (F.relu...), if any."""
    try:
        parameters = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None
    return parameters.index("inplace") if "inplace" in parameters else None


def _is_view(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return isinstance(modules.get(str(node.target)), _VIEW_MODULES)
    views = {"call_method": _VIEW_METHODS, "call_function": _VIEW_FUNCTIONS}.get(node.op, ())
    return node.target in views


def _views(node: fx.Node, modules: dict[str, nn.Module]) -> list[fx.Node]:
    """``node`` and each node it is a view of, in turn: the last is the node whose memory
    ``node`` may share (its base; ``node`` itself unless it is a view of another)."""
    chain = [node]
    while _is_view(node, modules) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
        chain.append(node)
    return chain


def _refuse(node: fx.Node, why: str) -> UntraceableModelError:
    source = node_info(node).source
    where = f" at {source}" if source else ""
    msg = (
        f"in-place op {node.name!r} ({node.target}){where} {why}; fxquant cannot keep that "
        "change in a quantized model, where every value is a new tensor. Write it out of "
        "place (y = y.mul(0.5) instead of y.mul_(0.5)), or keep that code in a non-traceable "
        "module (PrepareCustomConfig().set_non_traceable_module_names)"
    )
    return UntraceableModelError(msg)


def functionalize(gm: fx.GraphModule) -> int:
    """Make every in-place op of ``gm`` out of place and rewire its later readers.

    Returns the number of ops rewritten; recompiles ``gm`` when there was any.

    Raises:
        UntraceableModelError: an in-place op on module state, or on a view whose
            base is read afterwards (see the module doc).

    Example:
        >>> functionalize(fx.symbolic_trace(nn.Linear(2, 2)))
        0
    """
    modules = dict(gm.named_modules())
    position = {node: i for i, node in enumerate(gm.graph.nodes)}
    changed = 0
    for node in list(gm.graph.nodes):
        mutated = node.args[0] if node.args else None
        form = _out_of_place(node, modules)
        if form is None or not isinstance(mutated, fx.Node):
            continue
        _check(node, mutated, modules, position)
        node.op, node.target, node.args, node.kwargs = form
        changed += 1
        for user in list(mutated.users):
            if user is not node and position[user] > position[node]:
                user.replace_input_with(mutated, node)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed


_Form = tuple[str, Any, tuple[Any, ...], dict[str, Any]]


def _out_of_place(node: fx.Node, modules: dict[str, nn.Module]) -> _Form | None:
    """``node``'s out-of-place form ``(op, target, args, kwargs)``, or None when it is no
    in-place op. A call_module keeps its form (see the module doc); an eval-mode dropout,
    ``inplace=True`` or not, is the identity and changes nothing."""
    op, target, args, kwargs = node.op, node.target, node.args, dict(node.kwargs)
    if op == "call_method":
        name = str(target)
        if not name.endswith("_") or name.startswith("_") or name in _NOT_MUTATING:
            return None
        if callable(getattr(torch.Tensor, name[:-1], None)) and not name.endswith("__"):
            return op, name[:-1], args, kwargs
        # fill_, zero_, copy_, normal_...: no out-of-place method of that name
        return "call_function", on_copy, (name, *args), kwargs
    if op == "call_module":
        module = modules.get(str(target))
        # torch's dropout modules (Dropout, Dropout1d-3d, AlphaDropout...) share one base
        if isinstance(module, nn.modules.dropout._DropoutNd) and not module.training:
            return None
        return (op, target, args, kwargs) if getattr(module, "inplace", False) is True else None
    if op != "call_function" or (target in _DROPOUT_FUNCTIONS and not _dropout_trains(node)):
        return None
    plain = _REWRITES.get(target) or _out_of_place_function(target)
    if plain is not None:
        return op, plain, args, kwargs
    position = _inplace_param(target) if callable(target) else None
    if position is None:
        return None
    given = args[position] if len(args) > position else False
    if kwargs.get("inplace", given) is not True:
        return None
    return op, target, args[:position], {**kwargs, "inplace": False}


def _check(
    node: fx.Node, mutated: fx.Node, modules: dict[str, nn.Module], position: dict[fx.Node, int]
) -> None:
    base = _views(mutated, modules)[-1]
    if base.op == "get_attr":
        raise _refuse(node, f"changes the module's tensor {base.target!r} inside forward")
    if base is mutated:
        return
    # a view: the change reaches the base and every other view of it. A later read of
    # one of those, other than through the op's own result or the view it changed (whose
    # later readers are rewired to the result), would see the change in eager PyTorch only
    for alias in position:
        chain = _views(alias, modules)
        if alias in (node, mutated) or chain[-1] is not base:
            continue
        if position[alias] > position[node]:
            if node not in chain and mutated not in chain:  # not a view of the op or its input
                raise _refuse(node, f"changes a view of {base.name!r}, which is read afterwards")
        elif any(position[user] > position[node] for user in alias.users if user is not node):
            raise _refuse(node, f"changes a view of {base.name!r}, which is read again afterwards")
