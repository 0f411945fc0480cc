"""Attributes of the root the flow reads, adds and drops: the value a ``get_attr`` node
reads; fresh names for observers, scales, aliases and kernels; the submodules no node reads
any more once fusion or lowering erased their calls."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from torch import fx, nn

__all__ = ["attribute_value", "drop_unread_modules", "unique_name"]


def attribute_value(root: nn.Module, value: object) -> Any:
    """The module attribute a ``get_attr`` node reads, or ``value`` itself for anything else.

    Example:
        >>> attribute_value(fx.symbolic_trace(nn.Identity()), 0.5)
        0.5
    """
    if not isinstance(value, fx.Node) or value.op != "get_attr":
        return value
    return operator.attrgetter(str(value.target))(root)


def unique_name(root: nn.Module, base: str, *, first: int | None = None) -> str:
    """``base``, or ``base_N`` with the first N that ``root`` has no attribute of.

    With ``first``, the name is always numbered and the search starts at ``base_<first>``:
    a caller adding a numbered series (``activation_post_process_0``, ``_1``...) passes how
    many it added, so each name costs one lookup, not one per name before it.

    Example:
        >>> root = nn.Linear(1, 1)
        >>> unique_name(root, "weight"), unique_name(root, "scale", first=0)
        ('weight_1', 'scale_0')
    """
    index = 0 if first is None else first
    name = base if first is None else f"{base}_{index}"
    while hasattr(root, name):
        index += 1
        name = f"{base}_{index}"
    return name


def drop_unread_modules(gm: fx.GraphModule, targets: Iterable[str]) -> None:
    """Delete each submodule of ``targets`` that no ``call_module`` or ``get_attr`` node of
    ``gm`` reads, at its path or below it (the containers of a read module stay).

    The caller passes the modules it stopped calling: the others the graph module holds (a
    preserved attribute, a container) are none of its business.

    Example:
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.ReLU()))
        >>> gm.add_submodule("spare", nn.ReLU())
        True
        >>> drop_unread_modules(gm, ["0", "spare"]); [name for name, _ in gm.named_children()]
        ['0']
    """
    read = {str(n.target) for n in gm.graph.nodes if n.op in ("call_module", "get_attr")}
    kept = {path.rsplit(".", i)[0] for path in read for i in range(path.count(".") + 1)}
    for target in dict.fromkeys(targets):
        if target not in kept:
            gm.delete_submodule(target)  # False (nothing to do) when a parent went first
