"""Shared helpers for the pattern tests: torch.ao -> fxquant translation and a qconfig checker."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.config.qconfig import QConfig
from fxquant.dtypes import dtypes_match, is_float_dtype


def by_pattern(configs: Iterable[BackendPatternConfig]) -> dict[Any, BackendPatternConfig]:
    """Configs keyed by normalized pattern; a duplicate pattern is a test failure."""
    keyed: dict[Any, BackendPatternConfig] = {}
    for config in configs:
        key = config.normalized_pattern
        assert key not in keyed, f"pattern {key!r} configured twice"
        keyed[key] = config
    return keyed


def constraints_of(ao_or_fx: Any) -> DTypeWithConstraints:
    """fxquant's DTypeWithConstraints from torch.ao's or fxquant's."""
    return DTypeWithConstraints.coerce(ao_or_fx, "constraints")


def dtype_config_covers(ours: DTypeConfig, theirs: Any) -> bool:
    """True when ``ours`` has the dtypes, constraints and dynamism of torch.ao's ``theirs``."""
    sides = ("input", "output", "weight")
    for side in sides:
        mine = getattr(ours, f"{side}_dtype_with_constraints")
        other = constraints_of(getattr(theirs, f"{side}_dtype_with_constraints"))
        if mine != other:
            return False
    return dtypes_match(ours.bias_dtype, theirs.bias_dtype) and bool(ours.is_dynamic) == bool(
        theirs.is_dynamic
    )


# ---------------------------------------------------------------- qconfig checker


def _observer_accepted(observer: Any, constraints: DTypeWithConstraints) -> str | None:
    """Why ``observer`` violates ``constraints``, or None when it satisfies them."""
    if constraints.dtype is None:
        return None
    if not dtypes_match(observer.dtype, constraints.dtype):
        return f"dtype {observer.dtype} != {constraints.dtype}"
    if is_float_dtype(constraints.dtype):
        return None
    low, high = constraints.quant_min_lower_bound, constraints.quant_max_upper_bound
    if low is not None and observer.quant_min < low:
        return f"quant_min {observer.quant_min} < {low}"
    if high is not None and observer.quant_max > high:
        return f"quant_max {observer.quant_max} > {high}"
    if constraints.scale_min_lower_bound is not None:
        eps = float(observer.eps)
        if eps < constraints.scale_min_lower_bound:
            return f"eps {eps} < {constraints.scale_min_lower_bound}"
    if constraints.scale_exact_match is not None:
        if not hasattr(observer, "scale") or not hasattr(observer, "zero_point"):
            return "no fixed qparams where the backend demands them"
        scale, zero_point = float(observer.scale), int(observer.zero_point)
        if (scale, zero_point) != (
            constraints.scale_exact_match,
            constraints.zero_point_exact_match,
        ):
            return f"fixed qparams {(scale, zero_point)} != backend's"
    return None


def rejection(qconfig: QConfig, dtype_config: DTypeConfig) -> str | None:
    """Why ``dtype_config`` rejects ``qconfig`` (static patterns), or None when it accepts it."""
    activation, weight = qconfig.activation(), qconfig.weight()
    checks = (
        ("input", activation, dtype_config.input_dtype_with_constraints),
        ("output", activation, dtype_config.output_dtype_with_constraints),
        ("weight", weight, dtype_config.weight_dtype_with_constraints),
    )
    for side, observer, constraints in checks:
        if side == "weight" and constraints.dtype is None:
            continue  # the pattern has no weight to check
        reason = _observer_accepted(observer, constraints)
        if reason is not None:
            return f"{side}: {reason}"
    return None


def accepted_by_any(qconfig: QConfig, config: BackendPatternConfig) -> list[str]:
    """Empty when some dtype config of ``config`` accepts ``qconfig``, else every reason."""
    reasons = []
    for dtype_config in config.dtype_configs:
        reason = rejection(qconfig, dtype_config)
        if reason is None:
            return []
        reasons.append(reason)
    return reasons
