"""The tracer: torch.fx's, with fxquant's leaf rules and a record per node (#21: its own module,
so the transformers tracer, ``flow.hf_trace``, builds on it without importing ``flow.trace``,
which picks it).

The tracer keeps as single ``call_module`` nodes torch's own modules, fxquant's fused/QAT/
reference modules, and the non-traceable, standalone and custom modules the config names;
each node it creates gets a :class:`~fxquant.flow.state.NodeInfo` (owning module path and
type, the user's source line, its call-order keys).
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import torch
from torch import fx, nn

from fxquant.flow.inplace import InPlaceProxy
from fxquant.flow.state import META_KEY, NodeInfo

__all__ = ["QuantizationTracer", "is_internal", "mark_internal"]

# frames from these folders are never "the user's code"
_INTERNAL_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


_INTERNAL: dict[str, bool] = {}  # filename -> internal? (tracing asks once per frame)


def mark_internal(filename: str) -> None:
    """Count ``filename`` as a tracer's code, never the user's (a tracer from a library).

    Example:
        >>> mark_internal("<tracer>"); is_internal("<tracer>")
        True
    """
    _INTERNAL[filename] = True


def is_internal(filename: str) -> bool:
    """Whether code in ``filename`` is fxquant's or torch's, never the user's source line.

    Example:
        >>> is_internal(torch.__file__), is_internal("/home/me/model.py")
        (True, False)
    """
    internal = _INTERNAL.get(filename)
    if internal is None:
        internal = filename.startswith(_INTERNAL_DIRS) or filename.startswith("<")
        _INTERNAL[filename] = internal
    return internal


def _user_frame(frame: types.FrameType | None) -> str | None:
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_internal(filename):
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

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """Configured names/classes and fxquant's own modules are leaves, then torch's rule."""
        from fxquant.nn import is_leaf_module  # lazy: nn imports its submodules on demand
        from fxquant.torch_ao_names import is_torch_ao_module_class

        if module_qualified_name in self.leaf_names or isinstance(m, self.leaf_classes):
            return True
        if is_leaf_module(m) or is_torch_ao_module_class(type(m)):
            return True  # fused torch.ao modules are Sequentials, which torch.fx would enter
        return bool(super().is_leaf_module(m, module_qualified_name))

    def proxy(self, node: fx.Node) -> fx.Proxy:
        """torch.fx's proxy, recording ``y += 1`` as in place (``fxquant.flow.inplace``, #18).

        A tracer further down the MRO with a proxy of its own (transformers' ``HFProxy``
        answers ``dim()`` and ``shape`` from metadata) keeps it: replacing it breaks tracing.
        """
        proxy = super().proxy(node)
        return InPlaceProxy(node, self) if type(proxy) is fx.Proxy else proxy

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
