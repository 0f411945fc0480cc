"""A backend as plain data: what ``fxquant show`` prints and ``--json`` dumps.

``describe(assembled)`` turns an assembled backend into a JSON-able dict: a
summary in the shape of the seed README's table (quantization scheme, data
types, reference / fused / QAT module mappings) and one row per pattern
config (pattern, observation type, dtypes with constraints, modules, lowering
kernel, who configured it and whom it overrode).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Any

from fxquant.config.pattern import complex_to_simple, pattern_str
from fxquant.dtypes import dtype_name, qscheme_name
from fxquant.errors import FxquantError
from fxquant.registry.assembly import AssembledBackend, Origin, default_qconfig_mapping

__all__ = ["class_str", "describe", "dtype_config_str", "pattern_text"]

_SHORT_MODULES = ("fxquant.nn.", "torch.nn.modules.", "torch.nn.")


def class_str(cls: object) -> str:
    """A module class as tables show it: ``Linear``, ``qat.Linear``, ``my_pkg.MyConv``.

    Example:
        >>> import torch
        >>> class_str(torch.nn.Linear)
        'Linear'
    """
    if cls is None:
        return ""
    if not isinstance(cls, type):
        return getattr(cls, "__name__", repr(cls))
    module = cls.__module__
    if module.startswith("torch.nn.modules."):
        return cls.__qualname__
    for prefix in _SHORT_MODULES:
        if module.startswith(prefix):
            return f"{module[len(prefix) :]}.{cls.__qualname__}"
    return f"{module}.{cls.__qualname__}"


def pattern_text(key: Hashable) -> str:
    """A normalized pattern as tables show it: the simple form when it has one.

    Classes are named with their package (``qat.Linear``), as :func:`class_str` does.

    Example:
        >>> import torch
        >>> pattern_text((torch.nn.ReLU, torch.nn.Conv2d))
        '(Conv2d, ReLU)'
    """

    def render(part: object) -> str:
        if isinstance(part, tuple):
            return "(" + ", ".join(render(p) for p in part) + ")"
        return class_str(part) if isinstance(part, type) else pattern_str(part)

    simple = complex_to_simple(key)
    return render(key if simple is None else simple)


def _short_dtype(dtype: Any) -> str:

    return dtype_name(dtype).removeprefix("torch.")


def _number(value: float) -> str:
    mantissa, exponent = math.frexp(value)
    return f"2**{exponent - 1}" if mantissa == 0.5 and exponent < -3 else f"{value:g}"


def _dtype_str(constrained: Any) -> str:
    if constrained is None or constrained.dtype is None:
        return ""
    text = _short_dtype(constrained.dtype)
    limits = []
    low, high = constrained.quant_min_lower_bound, constrained.quant_max_upper_bound
    if low is not None or high is not None:
        limits.append(f"q {'' if low is None else low}..{'' if high is None else high}")
    if constrained.scale_min_lower_bound is not None:
        limits.append(f"scale>={_number(constrained.scale_min_lower_bound)}")
    if constrained.scale_exact_match is not None:
        limits.append(f"scale={_number(constrained.scale_exact_match)}")
    if constrained.zero_point_exact_match is not None:
        limits.append(f"zp={constrained.zero_point_exact_match}")
    return f"{text} ({', '.join(limits)})" if limits else text


def dtype_config_str(config: Any) -> str:
    """One DTypeConfig in a line: ``in quint8 (q 0..255), out quint8, w qint8, b float32``.

    Example:
        >>> import torch
        >>> from fxquant.config.backend import DTypeConfig
        >>> dtype_config_str(DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float))
        'in quint8, out quint8, w qint8, b float32'
    """
    parts = [
        ("in", _dtype_str(config.input_dtype_with_constraints)),
        ("out", _dtype_str(config.output_dtype_with_constraints)),
        ("w", _dtype_str(config.weight_dtype_with_constraints)),
        ("b", _short_dtype(config.bias_dtype) if config.bias_dtype is not None else ""),
    ]
    text = ", ".join(f"{label} {value}" for label, value in parts if value)
    return f"{text}, dynamic" if config.is_dynamic else text


def _origin_dict(origin: Origin | None) -> dict[str, Any]:
    if origin is None:
        return {"source": "", "overrides": [], "override_reason": ""}
    return {
        "source": origin.source,
        "overrides": list(origin.overrides),
        "override_reason": origin.reason,
    }


def _reference_forms(key: Hashable, configs: dict[Hashable, Any], depth: int = 0) -> list[Hashable]:
    """What a pattern is in the reference model: itself, its fused module, its reference module.

    ``(Linear, ReLU)`` is ``intrinsic.LinearReLU`` once fused; ``Linear`` is
    ``reference.Linear`` once converted; ``qat.Linear`` is ``Linear`` (then
    ``reference.Linear``). Lowering rules are keyed by these forms.
    """
    from torch import nn

    forms = [key]
    config = configs.get(key)
    if config is None or depth > 3:
        return forms
    fused, reference = config.fused_module, config.reference_quantized_module
    if isinstance(fused, type) and fused != key:
        forms += _reference_forms(fused, configs, depth + 1)
    elif isinstance(key, type) and not issubclass(key, nn.Sequential):
        if callable(getattr(key, "to_float", None)):  # a QAT module: its float module's forms
            floats = [k for k, c in configs.items() if c.qat_module is key and k != key]
            forms += [f for k in floats for f in _reference_forms(k, configs, depth + 1)]
        if isinstance(reference, type):
            forms.append(reference)
    return forms


def _kernel_of(key: Hashable, backend: AssembledBackend) -> str:
    kernels = {rule.key: rule.name for rule in backend.lowering_rules if rule.quantized}
    configs = backend.config.configs_by_pattern
    return next((kernels[f] for f in _reference_forms(key, configs) if f in kernels), "")


def _pattern_row(key: Hashable, config: Any, backend: AssembledBackend) -> dict[str, Any]:
    return {
        "pattern": pattern_text(key),
        "observation_type": config.observation_type.name,
        "dtype_configs": [dtype_config_str(d) for d in config.dtype_configs],
        "root_module": class_str(config.root_module),
        "fused_module": class_str(config.fused_module),
        "qat_module": class_str(config.qat_module),
        "reference_quantized_module": class_str(config.reference_quantized_module),
        "lowering_kernel": _kernel_of(key, backend),
        **_origin_dict(backend.pattern_origins.get(key)),
    }


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def _qschemes(backend: AssembledBackend) -> str:

    try:
        mapping = default_qconfig_mapping(backend, is_qat=False)
    except FxquantError:
        return "not declared (no default qconfig mapping)"
    qconfigs = [mapping.global_qconfig, *mapping.object_type_qconfigs.values()]
    found: dict[str, list[str]] = {"activation": [], "weight": []}
    for qconfig in filter(None, qconfigs):
        for role in found:
            scheme = getattr(getattr(qconfig, role)(), "qscheme", None)
            if scheme is not None:
                found[role].append(qscheme_name(scheme).replace("_", " "))
    return "; ".join(f"{role}: {' or '.join(_unique(s))}" for role, s in found.items() if s)


def _data_types(configs: list[Any]) -> str:
    activation, weight = [], []
    constrained = False
    for dtype_config in (d for c in configs for d in c.dtype_configs):
        for io in (
            dtype_config.input_dtype_with_constraints,
            dtype_config.output_dtype_with_constraints,
        ):
            activation.append(_dtype_str(io).split(" (")[0])
            constrained |= "(" in _dtype_str(io)
        weight.append(_dtype_str(dtype_config.weight_dtype_with_constraints).split(" (")[0])
    note = " (with qmin/qmax or scale restrictions)" if constrained else ""
    text = f"activation: {', '.join(_unique(activation)) or '-'}{note}"
    return f"{text}; weight: {', '.join(_unique(weight)) or '-'}"


def _summary(backend: AssembledBackend, rows: list[dict[str, Any]]) -> dict[str, Any]:
    configs = backend.config.configs
    single = [r for r in rows if not r["pattern"].startswith("(")]
    return {
        "quantization_scheme": _qschemes(backend),
        "data_type": _data_types(configs),
        "reference_module_mapping": _unique(
            f"{r['root_module']} -> {r['reference_quantized_module']}"
            for r in rows
            if r["root_module"] and r["reference_quantized_module"]
        ),
        "fused_module_mapping": _unique(
            f"{r['pattern']} -> {r['fused_module']}" for r in rows if r["fused_module"]
        ),
        "qat_module_mapping": _unique(
            f"{r['pattern']} -> {r['qat_module']}" for r in single if r["qat_module"]
        ),
    }


def describe(backend: AssembledBackend) -> dict[str, Any]:
    """The backend as a JSON-able dict: name, plugins, summary, patterns, kernels.

    Example:
        >>> from fxquant.registry import default_registry
        >>> describe(default_registry().assembled("reference"))["name"]
        'reference'
    """
    by_pattern = backend.config.configs_by_pattern
    rows = [_pattern_row(key, config, backend) for key, config in by_pattern.items()]
    kernels = [
        {
            "pattern": pattern_text(rule.key),
            "name": rule.name,
            **_origin_dict(backend.kernel_origins.get(rule.key)),
        }
        for rule in backend.lowering_rules
    ]
    return {
        "name": backend.name,
        "plugins": [
            {
                "distribution": p.distribution,
                "version": p.version,
                "entry_point": p.entry_point,
                "source": p.source,
            }
            for p in backend.plugins
        ],
        "summary": _summary(backend, rows),
        "patterns": rows,
        "lowering_kernels": kernels,
        # what runs converted models outside PyTorch eager (fxquant_deployment), or None
        "deployment": None if backend.deployment is None else backend.deployment.name,
    }
