"""Checks of a backend's configs: pattern configs well formed, default mappings accepted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.config.pattern import is_match_all
from fxquant.dtypes import canonical_dtype
from fxquant.errors import FxquantError, MissingDefaultQConfigError
from fxquant.flow.dtype_check import QConfigProbe, select_dtype_config
from fxquant.flow.report import Reason
from fxquant.registry import default_registry, get_default_qconfig_mapping
from fxquant.tools.conformance.results import CheckResult, CheckStatus
from fxquant.tools.describe import class_str, pattern_text

__all__ = ["default_mapping_rows", "pattern_problems", "well_formed_rows"]

_PACKED = tuple(
    d for d in (getattr(torch, "quint4x2", None), getattr(torch, "quint2x4", None)) if d
)
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32})
_ACTIVATION_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32}) | _FLOATS
_WEIGHT_DTYPES = frozenset({torch.uint8, torch.int8, torch.int32, *_PACKED}) | _FLOATS


def _pattern_ops(pattern: object) -> list[object]:
    if isinstance(pattern, tuple):
        return [op for part in pattern for op in _pattern_ops(part)]
    return [] if is_match_all(pattern) else [pattern]


def _dtype_problems(config: DTypeConfig) -> list[str]:
    roles = (
        ("input", config.input_dtype_with_constraints.dtype, _ACTIVATION_DTYPES),
        ("output", config.output_dtype_with_constraints.dtype, _ACTIVATION_DTYPES),
        ("weight", config.weight_dtype_with_constraints.dtype, _WEIGHT_DTYPES),
        ("bias", config.bias_dtype, _FLOATS),
    )
    problems = []
    for role, dtype, allowed in roles:
        if dtype is not None and dtype not in allowed and canonical_dtype(dtype) not in allowed:
            choices = ", ".join(sorted(str(d).removeprefix("torch.") for d in allowed))
            problems.append(f"{role} dtype {dtype} is not one fxquant handles ({choices})")
    return problems


def pattern_problems(config: BackendPatternConfig) -> list[str]:
    """What is wrong with one pattern config (empty when it is well formed).

    Example:
        >>> int64 = DTypeConfig(input_dtype=torch.int64, output_dtype=torch.int64)
        >>> pattern_problems(BackendPatternConfig(torch.nn.ReLU).add_dtype_config(int64))[0]
        'input dtype torch.int64 is not one fxquant handles (bfloat16, float16, ...)'
    """
    try:
        ops = _pattern_ops(config.normalized_pattern)
    except FxquantError as error:
        return [str(error)]
    problems = [p for dtype_config in config.dtype_configs for p in _dtype_problems(dtype_config)]
    if not config.dtype_configs and config.fuser_method is None:
        problems.append("no dtype configs and no fuser method: nothing quantizes or fuses it")
    if len(ops) > 1 and config.fused_module is not None and config.fuser_method is None:
        # (a fuser without fused_module is fine: conv-transpose + bn folds into the conv)
        problems.append("fused_module without fuser_method: fusion cannot build it")
    if config.reference_quantized_module is not None and config.root_module is None:
        problems.append("reference_quantized_module without root_module: convert cannot swap")
    for role in ("qat_module", "reference_quantized_module"):
        module = getattr(config, role)
        if module is not None and not callable(getattr(module, "from_float", None)):
            problems.append(f"{role} {class_str(module)} has no from_float")
    return problems


def well_formed_rows(backend: str) -> list[CheckResult]:
    """One row per pattern config of ``backend``: is it well formed?

    Example:
        >>> {row.result.value for row in well_formed_rows("reference")}
        {'pass'}
    """
    rows = []
    for config in default_registry().assembled(backend).config.configs:
        problems = pattern_problems(config)
        try:
            name = pattern_text(config.normalized_pattern)
        except FxquantError:
            name = repr(config.pattern)
        result = CheckStatus.FAIL if problems else CheckStatus.PASS
        rows.append(CheckResult(name, "well_formed", result, "; ".join(problems)))
    return rows


def _entries(mapping: Any) -> list[tuple[str, object, Any]]:
    """(what the entry is, its object type or None, its qconfig) of every non-None entry."""
    found: list[tuple[str, object, Any]] = [("global", None, mapping.global_qconfig)]
    found += [(_op_name(op), op, q) for op, q in mapping.object_type_qconfigs.items()]
    found += [(f"module {name!r}", None, q) for name, q in mapping.module_name_qconfigs.items()]
    regexes = mapping.module_name_regex_qconfigs.items()
    found += [(f"module regex {name!r}", None, q) for name, q in regexes]
    return [(what, op, qconfig) for what, op, qconfig in found if qconfig is not None]


def _op_name(op: object) -> str:
    return class_str(op) if isinstance(op, type) else pattern_text(op)


def _entry_row(
    what: str, op: object, qconfig: Any, configs: Sequence[BackendPatternConfig], check: str
) -> CheckResult:
    reached = [
        c
        for c in configs
        if c.dtype_configs and (op is None or op in _pattern_ops(c.normalized_pattern))
    ]
    if not reached:
        return CheckResult(what, check, CheckStatus.SKIP, "no pattern of the backend has this op")
    probe = QConfigProbe.of(qconfig)
    answers = [select_dtype_config(c, probe, what) for c in reached]
    accepted = sum(isinstance(a, DTypeConfig) for a in answers)
    if accepted:
        return CheckResult(what, check, CheckStatus.PASS, f"accepted by {accepted}/{len(reached)}")
    reason = next(a for a in answers if isinstance(a, Reason))
    words = f"rejected by all {len(reached)} patterns with it: {reason.code}: {reason.words}"
    return CheckResult(what, check, CheckStatus.FAIL, words)


def default_mapping_rows(backend: str, *, is_qat: bool = False) -> list[CheckResult]:
    """One row per entry of the default mapping: do the backend's dtype configs accept it?

    An entry for an op must be accepted by one of the patterns containing the
    op; the global entry and module entries by one pattern of the backend.

    Example:
        >>> [row.result.value for row in default_mapping_rows("reference")][:1]
        ['pass']
    """
    check = "default_qat_mapping" if is_qat else "default_mapping"
    try:
        mapping = get_default_qconfig_mapping(backend, is_qat=is_qat)
    except MissingDefaultQConfigError as error:
        return [CheckResult("*", check, CheckStatus.FAIL, str(error))]
    configs = default_registry().assembled(backend).config.configs
    return [_entry_row(what, op, q, configs, check) for what, op, q in _entries(mapping)]
