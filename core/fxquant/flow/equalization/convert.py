"""Convert's part of input-weight equalization: scale weights, fold or insert ``s``.

Run by convert on its copy of the prepared model, before observers become
quantize/dequantize steps; ``fxquant.flow.equalization.prepare`` says where ``s`` goes::

    prepared:   norm -> obs_1 -> eq_obs -> q        (q reads x)
    converted:  norm (weight, bias * s) -> obs_1 (range of x * s) -> q (weight / s)
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # the usual alias
from torch import nn
from torch.fx import Node

from fxquant.flow.convert_copy import ModelCopy
from fxquant.flow.convert_modules import observer_node
from fxquant.flow.equalization.observers import (
    AUTO,
    InputEqualizationObserver,
    WeightEqualizationObserver,
    choose_alpha,
    equalization_scale,
)
from fxquant.flow.equalization.prepare import (
    EqualizedPair,
    is_linear,
    param_paths,
    reads_shared_weight,
)
from fxquant.flow.names import unique_name

__all__ = ["apply_equalization"]

_RELUS = (torch.relu, F.relu, "relu")


@dataclass(frozen=True, slots=True)
class _Copy(ModelCopy):
    """Convert's copy, with the edits equalization makes in it."""

    def set(self, path: str, value: Any) -> None:
        """Put ``value`` at ``path``: a new tensor or module, the prepared model keeps its own."""
        owner, _, name = path.rpartition(".")
        target = self.root.get_submodule(owner) if owner else self.root
        if isinstance(getattr(target, name, None), nn.Parameter):
            value = nn.Parameter(value, requires_grad=False)
        setattr(target, name, value)

    def own_observer(self, target: str) -> nn.Module:
        """A copy of observer ``target`` put at its path."""
        observer = copy.deepcopy(self.modules[target])
        self.set(target, observer)
        self.modules[target] = observer
        return observer

    def scaled_params(self, node: Node) -> tuple[str | None, str | None]:
        """Paths of a Linear (or LayerNorm) node's weight and bias (``param_paths``), about to
        be scaled: the observers of a functional's weight and bias forget calibration's range
        (convert observes the scaled values again)."""
        if node.op != "call_module":
            for value in (*node.args[1:3], node.kwargs.get("weight"), node.kwargs.get("bias")):
                observer = observer_node(value, self.modules)
                if observer is not None:
                    fresh = self.own_observer(str(observer.target))
                    reset = getattr(fresh, "reset_min_max_vals", None)
                    if callable(reset):
                        reset()
        return param_paths(node, self.modules)

    def scale_columns(self, path: str, scale: torch.Tensor) -> None:
        # times the reciprocal (not a division): torch.ao's rounding, so both quantize alike
        self.set(path, operator.attrgetter(path)(self.root).detach() * torch.reciprocal(scale))

    def scale_rows(self, path: str | None, scale: torch.Tensor) -> None:
        if path is None:
            return
        value = operator.attrgetter(path)(self.root).detach()
        self.set(path, value * scale.reshape((-1,) + (1,) * (value.dim() - 1)))

    def rescale_observer(self, target: str, ranges: tuple[torch.Tensor, ...]) -> None:
        """Give observer ``target`` the range of the scaled input (on its own copy); one
        without a range (fixed qparams) keeps its qparams."""
        observer = self.own_observer(target)
        low, high = ranges
        old_min, old_max = getattr(observer, "min_val", None), getattr(observer, "max_val", None)
        if isinstance(old_min, torch.Tensor) and isinstance(old_max, torch.Tensor):
            observer.min_val = low.reshape(old_min.shape).to(old_min.dtype)
            observer.max_val = high.reshape(old_max.shape).to(old_max.dtype)


def _single_user(node: object, user: Node) -> bool:
    return isinstance(node, Node) and list(node.users) == [user]


def _producer(source: object, observer: Node, modules: Mapping[str, nn.Module]) -> Node | None:
    """Where ``s`` can be folded: a LayerNorm (its weight and bias), a Linear (its rows),
    through a ReLU if any; None: a ``mul`` node multiplies the input instead."""
    if not _single_user(source, observer) or not isinstance(source, Node):
        return None
    module = modules.get(str(source.target)) if source.op == "call_module" else None
    if isinstance(module, nn.LayerNorm) and module.elementwise_affine and module.bias is not None:
        return source
    if is_linear(source, modules):
        return source
    is_relu = isinstance(module, nn.ReLU) or (
        source.op in ("call_function", "call_method") and source.target in _RELUS
    )
    if not is_relu or not source.args or not _single_user(source.args[0], source):
        return None
    before = source.args[0]
    observed = observer_node(before, modules)
    linear = observed.args[0] if observed is not None else before
    if not isinstance(linear, Node) or not is_linear(linear, modules):
        return None
    if observed is not None and not _single_user(linear, observed):
        return None
    return linear


def _nodes_between(start: Node, end: Node) -> list[Node]:
    """The single-user path from ``start`` (exclusive) to ``end`` (inclusive)."""
    found, node = [], start
    while node is not end:
        node = next(iter(node.users))
        found.append(node)
    return found


def apply_equalization(model: ModelCopy) -> tuple[EqualizedPair, ...]:
    """Convert's step: scale weights, fold or insert the input scale, drop the observers.

    Example:
        >>> # see tests/numerics/test_equalization.py
    """
    work = _Copy(model.root, model.graph, model.modules)
    pairs = []
    for node in list(work.graph.nodes):
        module = work.modules.get(str(node.target)) if node.op == "call_module" else None
        if isinstance(module, InputEqualizationObserver):
            pairs.append(_apply(work, node))
    return tuple(pairs)


def _apply(work: _Copy, eq_node: Node) -> EqualizedPair:
    eq: InputEqualizationObserver = work.modules[str(eq_node.target)]  # type: ignore[assignment]
    observer = eq_node.args[0]
    assert isinstance(observer, Node)  # insert_observers put it there
    linears = list(eq_node.users)
    names, source = tuple(n.name for n in linears), str(observer.args[0])
    eq_node.replace_all_uses_with(observer)
    work.graph.erase_node(eq_node)
    if not torch.all(torch.isfinite(eq.min_val)):
        return EqualizedPair(source, names, eq.alpha, "not equalized: no data observed")
    paths = [str(work.scaled_params(n)[0]) for n in linears]  # prepare checked each
    matrices = [operator.attrgetter(path)(work.root) for path in paths]
    stored = getattr(eq, "weight_observers", {})
    weights = [
        copy.deepcopy(stored[n]) if n in stored else WeightEqualizationObserver() for n in names
    ]
    for weight_observer, matrix in zip(weights, matrices, strict=True):
        weight_observer(matrix.detach())
    alpha = _strength(eq, work.modules[str(observer.target)], matrices, weights[0])
    if alpha is None:
        return EqualizedPair(source, names, AUTO, "not equalized: less noise estimated unscaled")
    scale = equalization_scale(eq, weights, alpha)
    for path in paths:
        work.scale_columns(path, scale)
    ranges = (torch.min(eq.min_val * scale), torch.max(eq.max_val * scale))
    # plan first, then one edit
    producer, exclusive = _fold_plan(work, observer, linears)
    if producer is not None:
        applied, scaled = _fold_into(work, (producer, observer), scale, ranges)
    else:
        applied, scaled = _multiply_input(work, (observer, linears), (scale, ranges), exclusive)
    return EqualizedPair(source, names, alpha, applied, scale.detach().clone(), scaled)


def _strength(
    eq: InputEqualizationObserver,
    input_observer: nn.Module,
    matrices: list[torch.Tensor],
    weight_observer: WeightEqualizationObserver,
) -> float | None:
    """The observer's alpha, or with ``"auto"`` the one :func:`choose_alpha` picks for how
    this input and these weights are quantized (``None``: better left unscaled)."""
    if eq.alpha != AUTO:
        return float(eq.alpha)
    return choose_alpha(
        eq,
        matrices,
        symmetric_input="symmetric" in str(getattr(input_observer, "qscheme", "")),
        per_channel_weight="per_channel" in str(weight_observer.qscheme),
    )


def _fold_plan(work: _Copy, observer: Node, linears: list[Node]) -> tuple[Node | None, bool]:
    """Where the input scale goes (pure): ``(producer, exclusive)``; a producer takes it in its
    parameters, None multiplies the observed input (also when the producer's parameters are
    read by another call: ALBERT runs one layer twice, or when the observer is shared beyond
    the path from the producer)."""
    graph, modules = work.graph, work.modules
    sharers = [n for n in graph.nodes if n.op == "call_module" and n.target == observer.target]
    exclusive = set(observer.users) == set(linears) and sharers == [observer]
    producer = None
    if set(observer.users) == set(linears):
        producer = _producer(observer.args[0], observer, modules)
    if producer is not None and reads_shared_weight(work.root, graph, modules, producer):
        producer = None
    if producer is not None and not set(sharers) <= set(_nodes_between(producer, observer)):
        producer = None
    return producer, exclusive


def _fold_into(
    work: _Copy, ends: tuple[Node, Node], scale: torch.Tensor, ranges: tuple[torch.Tensor, ...]
) -> tuple[str, tuple[str, ...]]:
    """``s`` into a LayerNorm's weight and bias, or into a Linear's rows; the observers from
    there to the input's observer get the scaled range."""
    producer, observer = ends
    for path in work.scaled_params(producer):  # its weight, and its bias if any
        work.scale_rows(path, scale)
    rows = not isinstance(work.modules.get(str(producer.target)), nn.LayerNorm)
    if rows:
        # an observer before a ReLU: its negative values become 0 anyway, so the ReLU output's
        # range (widened to hold 0) quantizes what matters exactly
        low, high = ranges
        ranges = (torch.clamp(low, max=0.0), torch.clamp(high, min=0.0))
    chain = [producer, *_nodes_between(producer, observer)]
    observers = [n for n in chain if observer_node(n, work.modules) is not None]
    for between in observers:
        work.rescale_observer(str(between.target), ranges)
    where = f"rows of {producer.name}" if rows else producer.name
    return f"folded into {where}", tuple(n.name for n in chain if n not in observers)


def _multiply_input(
    work: _Copy,
    site: tuple[Node, list[Node]],
    scaling: tuple[torch.Tensor, tuple[torch.Tensor, ...]],
    exclusive: bool,
) -> tuple[str, tuple[str, ...]]:
    (observer, linears), (scale, ranges), graph = site, scaling, work.graph
    source = observer.args[0]
    name = unique_name(work.root, f"{observer.name}_equalization_scale")
    work.root.register_buffer(name, scale.detach().clone())
    if exclusive and isinstance(source, Node):
        with graph.inserting_before(observer):
            mul = graph.call_function(torch.mul, (source, graph.get_attr(name)))
        observer.replace_input_with(source, mul)
        work.rescale_observer(str(observer.target), ranges)
        return f"mul node {mul.name}", ()
    target = unique_name(work.root, f"{observer.target}_equalized")
    work.modules[target] = work.modules[str(observer.target)]  # its own copy, rescaled below
    with graph.inserting_before(observer.next):  # right after the observer, in this order
        constant = graph.get_attr(name)
        # from the float value: not quantized twice
        mul = graph.call_function(torch.mul, (source, constant))
        own = graph.call_module(target, (mul,))
    for linear in linears:
        linear.replace_input_with(observer, own)
    work.rescale_observer(target, ranges)
    return f"mul node {mul.name} (its input also feeds other nodes)", ()
