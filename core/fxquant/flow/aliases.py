"""Reads of a called module's tensors go through the root, so that replacing the module keeps them.

Fusion, BatchNorm folding, QAT swaps and convert replace the modules the graph calls.
A ``get_attr`` that reads a tensor of such a module (``F.linear(h, self.fc.weight)``
after ``self.fc(x)``, ``self.conv.weight.sum()``, a tied embedding read as a weight)
then read the replacement's attribute: a fused LinearReLU has no ``weight`` (prepare
failed in ``graph.lint``), a conv with a BatchNorm folded in has the folded weight
(1.6 dB from the float model, no warning), a lowered Linear holds int8 (convert failed).
Each such read is pointed, before any step runs, at an alias on the root that is the
same tensor object (a parameter stays that parameter: QAT trains one weight)::

    fc = self.fc(x); w = self.fc.weight; F.linear(fc, w)       (get_attr 'fc.weight')
    fc = self.fc(x); w = self.fc_weight; F.linear(fc, w)       (self.fc_weight is self.fc.weight)
"""

from __future__ import annotations

import torch
from torch import fx, nn

from fxquant.flow.names import attribute_value, unique_name

__all__ = ["alias_module_attributes"]


def alias_module_attributes(gm: fx.GraphModule) -> None:
    """Point each ``get_attr`` of a tensor of a called module at a root alias of that tensor.

    Example:
        >>> class Tied(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc = nn.Linear(2, 2)
        ...     def forward(self, x):
        ...         return torch.nn.functional.linear(self.fc(x), self.fc.weight)
        >>> gm = fx.symbolic_trace(Tied())
        >>> alias_module_attributes(gm)
        >>> [str(n.target) for n in gm.graph.nodes if n.op == "get_attr"]
        ['fc_weight']
        >>> gm.fc_weight is gm.fc.weight
        True
    """
    called = {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}
    aliases: dict[str, str] = {}
    for node in gm.graph.nodes:
        owner = str(node.target).rpartition(".")[0]
        if node.op != "get_attr" or owner not in called:
            continue
        value = attribute_value(gm, node)
        if not isinstance(value, torch.Tensor):
            continue
        if node.target not in aliases:
            alias = unique_name(gm, str(node.target).replace(".", "_"))
            if isinstance(value, nn.Parameter):
                gm.register_parameter(alias, value)
            else:
                gm.register_buffer(alias, value)
            aliases[str(node.target)] = alias
        node.target = aliases[str(node.target)]
    if aliases:
        gm.recompile()
