"""Input-weight equalization in the graph: observers at prepare, scales applied at convert.

Prepare puts one :class:`InputEqualizationObserver` between a Linear's input
observer and the Linears that read it (several when they share the input, as
query/key/value do; they then share one scale)::

    x -> obs_0 -> fc            becomes      x -> obs_0 -> eq_obs -> fc

Convert (``fxquant.flow.equalization.convert``, on its copy; the prepared model is
untouched) computes the scale ``s``
(``fxquant.flow.equalization.observers``), divides the weight columns by ``s`` and
multiplies the input by ``s`` where that costs nothing at inference:

- into the preceding LayerNorm's weight and bias,
- into the rows (and bias) of the preceding Linear, through a ReLU if any,
- else as a ``mul`` node before the input observer (torch.ao's form); when that
  observer also feeds other nodes, the ``mul`` gets an observer of its own.

The input observers are rescaled from the per-channel ranges, so the reference
model quantizes the values it now computes.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # the usual alias
from torch import fx, nn
from torch.fx import Node

from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow.convert_modules import is_observer, observer_node
from fxquant.flow.equalization.observers import (
    EqualizationQConfig,
    InputEqualizationObserver,
)
from fxquant.flow.names import attribute_value, unique_name
from fxquant.flow.qconfig_assign import assign_qconfigs

__all__ = [
    "EQUALIZATION_KEY",
    "EqualizedPair",
    "insert_observers",
    "is_linear",
    "param_paths",
    "reads_shared_weight",
]

EQUALIZATION_KEY = "fxquant.equalization"
"""``gm.meta`` key of the equalized pairs (read by ``fxquant.explain``)."""


@dataclass(frozen=True, slots=True)
class EqualizedPair:
    """One input and the Linears equalized against it, as ``explain`` lists them.

    Example:
        >>> EqualizedPair("ln", ("q", "k"), 0.5, "folded into ln").line()
        'ln -> q, k (alpha 0.5): folded into ln'
    """

    input: str
    linears: tuple[str, ...]
    alpha: float | str
    """The strength used (``"auto"`` after prepare, or when ``"auto"`` chose no scaling)."""
    applied: str
    """``observing`` after prepare; after convert where ``s`` went (``folded into ln``,
    ``folded into rows of fc1``, ``mul node mul_1``), or why nothing was done."""
    scale: torch.Tensor | None = None
    """The input's per-channel multiplier ``s`` (after convert)."""
    scaled_nodes: tuple[str, ...] = ()
    """Nodes whose output is now ``s`` times the float model's (where ``s`` was folded)."""

    def line(self) -> str:
        """One line for the report."""
        alpha = self.alpha if isinstance(self.alpha, str) else f"{self.alpha:g}"
        return f"{self.input} -> {', '.join(self.linears)} (alpha {alpha}): {self.applied}"


def _leading_module(node: Node, modules: Mapping[str, nn.Module]) -> nn.Module | None:
    """The module a call runs, or the first of a fused sequence (LinearReLU, ConvReLU2d)."""
    module = modules.get(str(node.target)) if node.op == "call_module" else None
    return module[0] if isinstance(module, nn.Sequential) and len(module) else module


def is_linear(node: Node, modules: Mapping[str, nn.Module]) -> bool:
    """A Linear module call (fused or not) or an ``F.linear`` call."""
    functional = node.op == "call_function" and node.target is F.linear
    return functional or isinstance(_leading_module(node, modules), nn.Linear)


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NO_CONV = "not equalized: fxquant equalizes Linear and F.linear inputs, not convolutions"


def _is_conv(node: Node, modules: Mapping[str, nn.Module]) -> bool:
    functional = node.op == "call_function" and node.target in (F.conv1d, F.conv2d, F.conv3d)
    return functional or isinstance(_leading_module(node, modules), _CONVS)


_SHARED = (
    "not equalized: its weight is read by {} calls (a shared or tied weight), and each call's"
    " scale would rescale it"
)
_COMPUTED = "not equalized: its weight is computed in forward, not a parameter to scale"


def param_paths(node: Node, modules: Mapping[str, nn.Module]) -> tuple[str | None, str | None]:
    """Attribute paths (from the root) of a Linear (or LayerNorm) node's weight and bias: None
    for a bias it has not, or for an ``F.linear`` argument computed in ``forward`` (no
    parameter to scale).

    ``nn.MultiheadAttention`` splits its packed in-projection weight in ``forward`` when query
    and key differ (``nn.Transformer``'s decoder): that weight has no parameter to scale.

    Example:
        >>> gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2, bias=False)))
        >>> param_paths(list(gm.graph.nodes)[1], dict(gm.named_modules()))
        ('0.weight', None)
    """
    module = _leading_module(node, modules)
    if module is not None:
        prefix = str(node.target) if module is modules[str(node.target)] else f"{node.target}.0"
        return f"{prefix}.weight", None if module.bias is None else f"{prefix}.bias"
    paths: list[str | None] = []
    for index, name in ((1, "weight"), (2, "bias")):
        value = node.args[index] if len(node.args) > index else node.kwargs.get(name)
        observer = observer_node(value, modules)
        value = value if observer is None else observer.args[0]
        attribute = value if isinstance(value, Node) and value.op == "get_attr" else None
        paths.append(None if attribute is None else str(attribute.target))
    return paths[0], paths[1]


def _weight(root: nn.Module, node: Node, modules: Mapping[str, nn.Module]) -> Any:
    """A Linear node's weight tensor, or None for an ``F.linear`` whose weight is computed."""
    path = param_paths(node, modules)[0]
    return None if path is None else operator.attrgetter(path)(root)


def reads_shared_weight(
    root: nn.Module, graph: fx.Graph, modules: Mapping[str, nn.Module], node: Node
) -> bool:
    """Whether a parameter ``node`` reads is read by another call too: scaling it for this
    call (a weight's rows, a LayerNorm's affine) would change the other one.

    Example:
        >>> gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
        >>> reads_shared_weight(gm, gm.graph, dict(gm.named_modules()), list(gm.graph.nodes)[1])
        False
    """
    if node.op == "call_module":
        module = modules.get(str(node.target))
        tensors = list(module.parameters()) if module is not None else []
    else:
        tensors = [_weight(root, node, modules)]
    uses = _uses(root, graph, modules)
    return any(uses.get(id(t), 0) > 1 for t in tensors if t is not None)


def _uses(root: nn.Module, graph: fx.Graph, modules: Mapping[str, nn.Module]) -> dict[int, int]:
    """How many graph calls read each parameter tensor (by ``id``): a shared module (ALBERT's
    layers, run once per layer) or a tied weight is read by more than one."""
    uses: dict[int, int] = {}
    for node in graph.nodes:
        tensors: list[Any] = []
        if node.op == "call_module":
            module = modules.get(str(node.target))
            if module is not None and not is_observer(module):
                tensors = list(module.parameters())
        elif node.op == "get_attr":
            value = attribute_value(root, node)
            readers = sum(
                len(u.users) if observer_node(u, modules) is not None else 1 for u in node.users
            )
            tensors = [value] * readers if isinstance(value, torch.Tensor) else []
        for tensor in tensors:
            uses[id(tensor)] = uses.get(id(tensor), 0) + 1
    return uses


def insert_observers(gm: fx.GraphModule, mapping: QConfigMapping) -> tuple[EqualizedPair, ...]:
    """Put an input equalization observer before every Linear ``mapping`` equalizes.

    Only Linears whose input is quantized (read through an observer) are
    equalized; the others are listed with the reason.

    Example:
        >>> # see tests/numerics/test_equalization.py
    """
    modules = dict(gm.named_modules())
    qconfigs = assign_qconfigs(gm, modules, mapping).qconfigs
    groups: dict[Node, list[Node]] = {}
    pairs: list[EqualizedPair] = []
    uses = _uses(gm, gm.graph, modules)
    for node in gm.graph.nodes:
        if not isinstance(qconfigs.get(node), EqualizationQConfig):
            continue
        if not _is_conv(node, modules) and not is_linear(node, modules):
            continue
        observer = observer_node(node.args[0] if node.args else None, modules)
        reason = _not_equalized(gm, node, modules, uses, observer)
        if reason is not None:
            pairs.append(EqualizedPair(str(node.args[0]), (node.name,), 0.5, reason))
        elif observer is not None:  # always, when there is no reason
            groups.setdefault(observer, []).append(node)
    for observer, linears in groups.items():
        pairs.append(_insert(gm, observer, linears, qconfigs))
    if groups:
        gm.graph.lint()
    return tuple(pairs)


def _not_equalized(
    gm: fx.GraphModule,
    node: Node,
    modules: Mapping[str, nn.Module],
    uses: Mapping[int, int],
    observer: Node | None,
) -> str | None:
    """Why the Linear (or convolution) ``node`` is not equalized, or None."""
    if _is_conv(node, modules):  # torch.ao equalizes convolutions too; fxquant not yet
        return _NO_CONV
    weight = _weight(gm, node, modules)
    if weight is None:
        return _COMPUTED
    if uses.get(id(weight), 0) > 1:
        return _SHARED.format(uses[id(weight)])
    return "not equalized: input not quantized" if observer is None else None


def _insert(
    gm: fx.GraphModule, observer: Node, linears: list[Node], qconfigs: Mapping[Node, Any]
) -> EqualizedPair:
    first: EqualizationQConfig = qconfigs[linears[0]]
    module = first.input_activation()
    if not isinstance(module, InputEqualizationObserver):
        msg = (
            f"the _equalization_config entry for {linears[0].name!r} builds "
            f"{type(module).__name__}; input_activation must build an InputEqualizationObserver"
        )
        raise TypeError(msg)
    module.weight_observers = nn.ModuleDict(
        {n.name: qconfigs[n].weight() for n in linears}  # one per Linear, run at convert
    )
    name = unique_name(gm, f"{linears[0].name}_equalization_process")
    gm.add_submodule(name, module)
    with gm.graph.inserting_after(observer):
        eq_node = gm.graph.call_module(name, (observer,))
    for linear in linears:
        linear.replace_input_with(observer, eq_node)
    source = observer.args[0]
    return EqualizedPair(str(source), tuple(n.name for n in linears), module.alpha, "observing")
