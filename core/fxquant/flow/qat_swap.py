"""QAT: the module swaps, and the patterns the swapped QAT modules match.

A BackendPatternConfig whose pattern is a module class and which names a
``qat_module`` (seed 004: ``.set_qat_module(nnqat.Linear)``) makes prepare_qat_fx
swap that class for the QAT class. The prepared graph then holds the QAT
class, which a backend written for PTQ does not list. The config already says
everything needed to quantize it, so every observation pattern that names a
swapped class is derived with the QAT class in its place::

    Linear       qat_module=qat.Linear       ->  qat.Linear       (same dtypes, observers, ...)
    ConvReLU2d   qat_module=qat.ConvReLU2d   ->  qat.ConvReLU2d
    (ReLU, Linear)                           ->  (ReLU, qat.Linear)

A pattern the backend configures itself (torch.ao's own configs list the QAT
classes) is never derived. A QAT module that still matches nothing is reported
with the QAT class and the config that would match it (:func:`missing_qat_config`).

A module whose qconfig no pattern naming its class accepts (an embedding under a global
QAT qconfig with uint8 activations) is not swapped: it stays float, and prepare reports
it skipped with the dtype reason, as post-training quantization does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import fx, nn

from fxquant.config.backend import BackendConfig, BackendPatternConfig
from fxquant.config.qconfig import QConfig
from fxquant.flow.context import FlowContext
from fxquant.flow.dtype_check import QConfigProbe, select_dtype_config
from fxquant.flow.report import Reason
from fxquant.flow.state import update_info

__all__ = [
    "float_class_of",
    "missing_qat_config",
    "qat_classes",
    "qat_pattern_configs",
    "swap_qat_modules",
]


def qat_classes(backend_config: BackendConfig) -> dict[Any, type]:
    """Module class -> the QAT class prepare_qat_fx swaps it for, from the backend's configs.

    Example:
        >>> import fxquant, torch
        >>> qat_classes(fxquant.get_backend_config("reference"))[torch.nn.Linear].__module__
        'fxquant.nn.qat'
    """
    return {
        c.normalized_pattern: c.qat_module
        for c in backend_config.configs
        if c.qat_module is not None and isinstance(c.normalized_pattern, type)
    }


def _substitute(pattern: Any, table: Mapping[Any, type]) -> Any:
    if isinstance(pattern, tuple):
        return tuple(_substitute(p, table) for p in pattern)
    return table.get(pattern, pattern) if isinstance(pattern, type) else pattern


def qat_pattern_configs(backend_config: BackendConfig) -> list[BackendPatternConfig]:
    """The observation configs with each swapped class replaced by its QAT class.

    Only patterns the backend does not configure itself; fusion configs are left
    out (fusion runs before the swap).

    Example:
        >>> import fxquant, torch
        >>> from fxquant.nn import qat
        >>> linear = fxquant.BackendPatternConfig(torch.nn.Linear).set_qat_module(qat.Linear)
        >>> backend = fxquant.BackendConfig("b").set_backend_pattern_config(linear)
        >>> [c.pattern for c in qat_pattern_configs(backend)] == [qat.Linear]
        True
    """
    table = qat_classes(backend_config)
    known = backend_config.configs_by_pattern
    derived: dict[Any, BackendPatternConfig] = {}
    for config in backend_config.configs:
        if config.fuser_method is not None:
            continue
        pattern = _substitute(config.normalized_pattern, table)
        if pattern == config.normalized_pattern or pattern in known or pattern in derived:
            continue
        data = config.to_dict()
        data.pop("qat_module", None)  # the QAT module is already in place
        if config.pattern is not None:
            data["pattern"] = _substitute(config.pattern, table)
        else:
            data["pattern_complex_format"] = pattern
        derived[pattern] = BackendPatternConfig.from_dict(data)
    return list(derived.values())


def float_class_of(cls: type) -> type | None:
    """The float class a QAT class replaces (its ``_FLOAT_MODULE``), or None.

    Example:
        >>> from fxquant.nn import qat
        >>> float_class_of(qat.Linear), float_class_of(nn.Linear)
        (<class 'torch.nn.modules.linear.Linear'>, None)
    """
    found = getattr(cls, "_FLOAT_MODULE", None)
    return found if isinstance(found, type) else None


def _label(cls: type) -> str:
    name = f"{cls.__module__}.{cls.__qualname__}"
    return f"torch.nn.{cls.__name__}" if getattr(nn, cls.__name__, None) is cls else name


def missing_qat_config(cls: type, backend_config: BackendConfig) -> str | None:
    """Why no pattern matches the QAT class ``cls``, naming the config that would; or None.

    Example:
        >>> from fxquant.nn import qat
        >>> print(missing_qat_config(qat.Linear, BackendConfig("b")))
        fxquant.nn.qat.Linear is the QAT module of torch.nn.Linear; backend 'b' has no \
BackendPatternConfig(fxquant.nn.qat.Linear), nor one for torch.nn.Linear that declares \
set_qat_module(fxquant.nn.qat.Linear) (fxquant derives the first from the second)
    """
    original = float_class_of(cls)
    if original is None:
        return None
    qat, float_ = _label(cls), _label(original)
    has_float = any(c.normalized_pattern is original for c in backend_config.configs)
    missing = (
        f"and its config for {float_} declares no set_qat_module({qat})"
        if has_float
        else f"nor one for {float_} that declares set_qat_module({qat})"
    )
    return (
        f"{qat} is the QAT module of {float_}; backend {backend_config.name!r} has no "
        f"BackendPatternConfig({qat}), {missing} (fxquant derives the first from the second)"
    )


def _mentions(pattern: Any, cls: type) -> bool:
    if isinstance(pattern, tuple):
        return any(_mentions(p, cls) for p in pattern)
    return pattern is cls


def _accepted(cls: type, qconfig: QConfig, backend_config: BackendConfig) -> bool:
    """Whether a pattern of the backend that names ``cls`` takes ``qconfig``'s dtypes."""
    probe = QConfigProbe.of(qconfig)
    return any(
        not isinstance(select_dtype_config(config, probe, cls.__name__), Reason)
        for config in backend_config.configs
        if config.fuser_method is None and _mentions(config.normalized_pattern, cls)
    )


def swap_qat_modules(
    gm: fx.GraphModule,
    modules: dict[str, nn.Module],
    qconfigs: Mapping[fx.Node, QConfig | None],
    ctx: FlowContext,
) -> None:
    """QAT: swap each module that has a qconfig for the QAT module its pattern config names.

    Only where a pattern naming the module's class accepts the qconfig (module docstring).

    Example:
        >>> from fxquant.registry.resolution import ResolvedBackend
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
        >>> ctx = FlowContext(ResolvedBackend(BackendConfig("b")))
        >>> swap_qat_modules(gm, dict(gm.named_modules()), {}, ctx)
        >>> type(gm.get_submodule("0")).__name__
        'Linear'
    """
    table = qat_classes(ctx.backend_config)
    for node in gm.graph.nodes:
        qconfig = qconfigs.get(node)
        if node.op != "call_module" or qconfig is None:
            continue
        target = str(node.target)
        qat_cls = table.get(type(modules[target]))
        if qat_cls is None or not _accepted(type(modules[target]), qconfig, ctx.backend_config):
            continue
        module = modules[target]
        # from_float reads it (torch.ao's protocol); torch.ao's fused QAT classes read it on
        # the fused module's parts too (eager mode propagates it), so every part gets it
        for part in module.modules():
            setattr(part, "qconfig", qconfig)  # noqa: B010  # an attribute nn.Module lacks
        swapped = qat_cls.from_float(module)  # type: ignore[attr-defined]  # QAT classes have it
        gm.set_submodule(target, swapped)
        modules[target] = swapped
        update_info(node, module_type=type(swapped))
