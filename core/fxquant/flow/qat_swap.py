"""QAT: swap each module that has a qconfig for the QAT module its pattern config names."""

from __future__ import annotations

from collections.abc import Mapping

from torch import fx, nn

from fxquant.config.qconfig import QConfig
from fxquant.flow.context import FlowContext
from fxquant.flow.state import update_info

__all__ = ["swap_qat_modules"]


def swap_qat_modules(
    gm: fx.GraphModule,
    modules: dict[str, nn.Module],
    qconfigs: Mapping[fx.Node, QConfig | None],
    ctx: FlowContext,
) -> None:
    """QAT: swap each module that has a qconfig for the QAT module its pattern config names.

    Example:
        >>> from fxquant.config.backend import BackendConfig
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
        >>> swap_qat_modules(gm, dict(gm.named_modules()), {}, FlowContext(BackendConfig("b")))
        >>> type(gm.get_submodule("0")).__name__
        'Linear'
    """
    table = {
        c.normalized_pattern: c.qat_module
        for c in ctx.backend_config.configs
        if c.qat_module is not None and isinstance(c.normalized_pattern, type)
    }
    for node in gm.graph.nodes:
        qconfig = qconfigs.get(node)
        if node.op != "call_module" or qconfig is None:
            continue
        target = str(node.target)
        qat_cls = table.get(type(modules[target]))
        if qat_cls is None:
            continue
        module = modules[target]
        setattr(module, "qconfig", qconfig)  # noqa: B010  # from_float reads it (torch.ao's protocol)
        swapped = qat_cls.from_float(module)  # type: ignore[attr-defined]  # QAT classes have it
        parent, _, name = target.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, name, swapped)
        modules[target] = swapped
        update_info(node, module_type=type(swapped))
