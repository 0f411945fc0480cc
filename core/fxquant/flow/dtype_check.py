"""Does a backend's DTypeConfig accept a QConfig? ``ok`` or a Reason naming the failed bound.

The QConfig's observers are built once (:class:`QConfigProbe`) and read:
dtype (quint8 == uint8), ``is_dynamic``, ``quant_min``/``quant_max``, ``eps``
(the smallest scale the observer can produce), its qscheme and fixed qparams. A
BackendPatternConfig accepts the QConfig if any of its DTypeConfigs does;
otherwise the reason of the closest DTypeConfig (same dtypes, a constraint
failed) is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.config.qconfig import QConfig
from fxquant.dtypes import canonical_dtype, dtype_name, is_quantized_dtype, qscheme_name
from fxquant.errors import ConfigError
from fxquant.flow.report import Reason, ReasonCode

__all__ = [
    "ObserverFacts",
    "QConfigProbe",
    "cast_output",
    "float_output",
    "float_side",
    "observable",
    "select_dtype_config",
]

_FLOAT = torch.float32
_REDUCED = (torch.bfloat16, torch.float16)


@dataclass(frozen=True, slots=True)
class ObserverFacts:
    """What the dtype check needs to know about one observer or fake-quantize module.

    Example:
        >>> from fxquant.observer import MinMaxObserver
        >>> ObserverFacts.of(MinMaxObserver(quant_min=0, quant_max=127)).quant_max
        127
    """

    dtype: torch.dtype
    is_dynamic: bool
    quant_min: int | None
    quant_max: int | None
    eps: float | None
    fixed: tuple[float, int] | None
    qscheme: str | None = None
    """The observer's qscheme name (``"per_channel_symmetric"``...), when it has one."""

    @classmethod
    def of(cls, module: Any) -> ObserverFacts:
        """Read the facts from a built observer or fake-quantize module."""
        observer = getattr(module, "activation_post_process", module)
        dtype = getattr(module, "dtype", None) or getattr(observer, "dtype", None) or _FLOAT
        eps = getattr(observer, "eps", None)
        fixed = None
        if "FixedQParams" in type(module).__name__ or "FixedQParams" in type(observer).__name__:
            fixed = (float(observer.scale), int(observer.zero_point))
        return cls(
            dtype=canonical_dtype(dtype),
            is_dynamic=bool(getattr(module, "is_dynamic", False)),
            quant_min=getattr(observer, "quant_min", None),
            quant_max=getattr(observer, "quant_max", None),
            eps=None if eps is None else float(eps),
            fixed=fixed,
            qscheme=_qscheme(getattr(observer, "qscheme", None)),
        )


def _qscheme(value: object) -> str | None:
    try:
        return None if value is None else qscheme_name(value)
    except ConfigError:
        return None  # an observer of the user's with a qscheme of its own: nothing to check


@dataclass(frozen=True, slots=True)
class QConfigProbe:
    """Facts about a QConfig's activation and weight observers (built once per QConfig).

    Example:
        >>> from fxquant.config.defaults import default_qconfig
        >>> QConfigProbe.of(default_qconfig).activation.dtype
        torch.uint8
    """

    activation: ObserverFacts
    weight: ObserverFacts
    requested_output: torch.dtype | None = None
    """``QConfig.output_dtype``: a float output the qconfig asks of an int8-in kernel."""

    @classmethod
    def of(cls, qconfig: QConfig) -> QConfigProbe:
        """Build the observers once and read their facts."""
        activation, weight = qconfig.activation(), qconfig.weight()
        return cls(ObserverFacts.of(activation), ObserverFacts.of(weight), qconfig.output_dtype)

    @property
    def output_dtype(self) -> torch.dtype:
        """Dynamic quantization leaves the output in float; ``QConfig.output_dtype`` names it."""
        if self.requested_output is not None:
            return self.requested_output
        return _FLOAT if self.activation.is_dynamic else self.activation.dtype

    @property
    def bias_dtype(self) -> torch.dtype:
        """float16 for static fp16 configs, float otherwise (torch.ao's rule)."""
        half = torch.float16
        static_half = self.activation.dtype == half and self.weight.dtype == half
        return half if static_half and not self.activation.is_dynamic else _FLOAT


def observable(dtype: object) -> bool:
    """Whether a value (or weight) of ``dtype`` gets an observer: an integer dtype, or a
    reduced float (static float16, bfloat16), which a placeholder observes and convert rounds.

    Example:
        >>> observable(torch.quint8), observable(torch.bfloat16), observable(torch.float32)
        (True, True, False)
    """
    return isinstance(dtype, torch.dtype) and (is_quantized_dtype(dtype) or dtype in _REDUCED)


def float_output(config: DTypeConfig | None) -> bool:
    """Whether ``config`` is a static int8-in, float-out kernel: quantized input,
    float output, not dynamic. Its pattern's output gets no observer.

    Example:
        >>> float_output(DTypeConfig(torch.uint8, torch.float, torch.int8, torch.float))
        True
        >>> float_output(DTypeConfig(torch.uint8, torch.uint8, torch.int8, torch.float))
        False
    """
    return _static_output(config) == _FLOAT


def cast_output(config: DTypeConfig | None) -> torch.dtype | None:
    """The reduced float dtype (bfloat16, float16) of a static int8-in kernel's output, or None.

    Such a kernel (``DTypeConfig(uint8, bfloat16, int8, float)``: an int8 GEMM writing
    bfloat16) has its output rounded to that dtype in the reference model.

    Example:
        >>> cast_output(DTypeConfig(torch.uint8, torch.bfloat16, torch.int8, torch.float))
        torch.bfloat16
        >>> cast_output(DTypeConfig(torch.uint8, torch.float, torch.int8, torch.float)) is None
        True
    """
    out = _static_output(config)
    return out if out in _REDUCED else None


def _static_output(config: DTypeConfig | None) -> torch.dtype | None:
    """The output dtype of a static kernel taking quantized inputs, else None."""
    if config is None or config.is_dynamic or config.output_dtype is None:
        return None
    if config.input_dtype is None or not is_quantized_dtype(config.input_dtype):
        return None
    return canonical_dtype(config.output_dtype)


def float_side(config: DTypeConfig | None) -> torch.dtype | None:
    """The reduced float dtype a node runs its float side in, or None (float32 or integers).

    bfloat16 for an int8-in, bfloat16-out kernel (:func:`cast_output`) and for a float op
    in bfloat16 (``DTypeConfig(input_dtype=torch.bfloat16, output_dtype=torch.bfloat16)``).

    Example:
        >>> float_side(DTypeConfig(torch.bfloat16, torch.bfloat16))
        torch.bfloat16
        >>> float_side(DTypeConfig(torch.uint8, torch.uint8)) is None
        True
    """
    cast = cast_output(config)
    if cast is not None or config is None or config.input_dtype is None:
        return cast
    side = canonical_dtype(config.input_dtype)
    return side if side in _REDUCED and not config.is_dynamic else None


def _check_dtypes(config: DTypeConfig, probe: QConfigProbe, label: str) -> Reason | None:
    act = probe.activation
    if bool(config.is_dynamic) != act.is_dynamic:
        kind = "dynamic" if config.is_dynamic else "static"
        fix = (  # a backend's default mapping is static; its recurrent modules are dynamic only
            "docs/guide/torch-modules.md shows one for recurrent modules"
            if config.is_dynamic
            else "the backend's default mapping has one"
        )
        return Reason(
            ReasonCode.IS_DYNAMIC,
            f"{label}: qconfig activation is_dynamic={act.is_dynamic} but the backend wants "
            f"{kind} quantization; set a {kind} qconfig for it ({fix})",
            field="is_dynamic",
            bound=config.is_dynamic,
        )
    # an int8-in, float-out config takes a static qconfig: its output is not observed,
    # unless the qconfig asks for another float output (QConfig.output_dtype)
    output = (probe.requested_output or _FLOAT) if float_output(config) else probe.output_dtype
    weight = config.weight_dtype
    if weight is not None and canonical_dtype(weight) == _FLOAT:
        weight = None  # a float weight needs no observer, so any weight observer will do
    checks = (  # (what, the qconfig's dtype, the config's)
        ("activation", act.dtype, config.input_dtype),
        ("output", output, config.output_dtype),
        ("weight", probe.weight.dtype, weight),
        ("bias", probe.bias_dtype, config.bias_dtype),
    )
    for what, got, wanted in checks:
        if wanted is not None and canonical_dtype(wanted) != got:  # None: any dtype will do
            return Reason(
                ReasonCode.DTYPE_MISMATCH,
                f"{label}: qconfig {what} dtype {dtype_name(got)} is not the backend's "
                f"{dtype_name(wanted)}",
                field=f"{what}_dtype",
                bound=wanted,
            )
    return None


def _check_constraints(
    constraints: DTypeWithConstraints, facts: ObserverFacts, what: str, label: str
) -> Reason | None:
    bounds = (  # (the observer's argument, its value, the constraint's field, the code)
        ("quant_min", facts.quant_min, "quant_min_lower_bound", ReasonCode.QUANT_RANGE),
        ("quant_max", facts.quant_max, "quant_max_upper_bound", ReasonCode.QUANT_RANGE),
        ("eps", facts.eps, "scale_min_lower_bound", ReasonCode.SCALE_MIN),
    )
    # every bound the observer breaks, so that one fix satisfies them all: a user who mends
    # quant_min and then meets eps has been sent round twice
    broken = []
    for arg, got, field, code in bounds:
        bound, upper = getattr(constraints, field), field.endswith("_upper_bound")
        if bound is not None and (got is None or (got > bound if upper else got < bound)):
            broken.append((arg, got, field, code, bound, "exceeds" if upper else "is below"))
    fixed = _check_fixed(constraints, facts, what, label)
    if not broken:
        return fixed
    told = "; ".join(
        f"{arg} {got} {rel} the backend bound {bound}" for arg, got, *_, bound, rel in broken
    )
    given: dict[str, object] = {arg: bound for arg, *_, bound, _ in broken}
    if {"quant_min", "quant_max"} & given.keys():  # observers take the two together
        given = {"quant_min": facts.quant_min, "quant_max": facts.quant_max, **given}
    fix = ", ".join(f"{arg}={value}" for arg, value in given.items())
    words = (
        f"{label}: qconfig {what} {told}; give the {what} observer {fix} "
        f"(its class's `.with_args({fix}, ...)`)"
    )
    if fixed is not None:  # a zero point or fixed qparams the backend needs too
        words += f"; and {fixed.words.removeprefix(f'{label}: ')}"
    _, _, field, code, bound, _ = broken[0]
    return Reason(code, words, field=field, bound=bound)


def _symmetric_zero_point(facts: ObserverFacts) -> int | None:
    """The zero point a symmetric observer gives: 0 for signed dtypes, mid-range for unsigned."""
    if facts.qscheme is None or not facts.qscheme.endswith("_symmetric"):
        return None
    if facts.dtype == torch.uint8 and facts.quant_min is not None and facts.quant_max is not None:
        return (facts.quant_min + facts.quant_max + 1) // 2
    return 0


def _check_fixed(
    constraints: DTypeWithConstraints, facts: ObserverFacts, what: str, label: str
) -> Reason | None:
    scale, zero_point = constraints.scale_exact_match, constraints.zero_point_exact_match
    if scale is None and zero_point is not None:
        # zero_point_exact_match alone: the observer must be symmetric around that zero point
        got = facts.fixed[1] if facts.fixed is not None else _symmetric_zero_point(facts)
        if got == zero_point:
            return None
        found = f"zero point {got}" if got is not None else f"qscheme {facts.qscheme}"
        words = (
            f"{label}: the backend needs {what} zero point {zero_point} (symmetric "
            f"quantization) but the qconfig {what} observer has {found}; use a *_symmetric qscheme"
        )
        return Reason(
            ReasonCode.ZERO_POINT, words, field="zero_point_exact_match", bound=zero_point
        )
    if scale is None or zero_point is None or facts.fixed == (float(scale), int(zero_point)):
        return None
    words = (
        f"{label}: the backend needs fixed qparams (scale {scale}, zero_point {zero_point}) "
        f"but the qconfig {what} observer is not a FixedQParamsObserver/FakeQuantize"
    )
    if facts.fixed is not None:
        words = (
            f"{label}: qconfig {what} fixed qparams {facts.fixed} differ from the backend's "
            f"(scale {scale}, zero_point {zero_point})"
        )
    return Reason(ReasonCode.FIXED_QPARAMS, words, field="scale_exact_match", bound=scale)


def check_dtype_config(config: DTypeConfig, probe: QConfigProbe, label: str) -> Reason | None:
    """None if ``config`` accepts the probed QConfig, else the first failure.

    Example:
        >>> from fxquant.config.defaults import default_qconfig
        >>> config = DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)
        >>> check_dtype_config(config, QConfigProbe.of(default_qconfig), "linear") is None
        True
    """
    reason = _check_dtypes(config, probe, label)
    if reason is not None:
        return reason
    act, out = config.input_dtype_with_constraints, config.output_dtype_with_constraints
    checks = (
        (act, probe.activation, "activation", not probe.activation.is_dynamic),
        (out, probe.activation, "activation", out != act),  # the same bounds checked once
        (config.weight_dtype_with_constraints, probe.weight, "weight", True),
    )
    for constraints, facts, what, applies in checks:
        if applies and is_quantized_dtype(constraints.dtype):
            reason = _check_constraints(constraints, facts, what, label)
            if reason is not None:
                return reason
    return None


def select_dtype_config(
    pattern_config: BackendPatternConfig, probe: QConfigProbe, label: str
) -> DTypeConfig | Reason:
    """The first DTypeConfig that accepts the QConfig, or the reason none does.

    A constraint failure (dtypes right, a bound wrong) is more useful than a dtype
    mismatch, so it wins when no config accepts.

    Example:
        >>> from fxquant.config.defaults import default_qconfig
        >>> config = BackendPatternConfig(torch.nn.ReLU)
        >>> select_dtype_config(config, QConfigProbe.of(default_qconfig), "relu").code
        <ReasonCode.DTYPE_MISMATCH: 'dtype_mismatch'>
    """
    best: Reason | None = None
    for config in pattern_config.dtype_configs:
        reason = check_dtype_config(config, probe, label)
        if reason is None:
            return config
        if best is None or (
            best.code in (ReasonCode.DTYPE_MISMATCH, ReasonCode.IS_DYNAMIC)
            and reason.code not in ("dtype_mismatch", "is_dynamic")
        ):
            best = reason
    if best is None:
        return Reason(
            ReasonCode.DTYPE_MISMATCH,
            f"{label}: the backend lists no dtype configs for this pattern",
            field="dtype_configs",
            bound=[],
        )
    return _float_only(pattern_config, probe, label) or best


def _float_only(
    pattern_config: BackendPatternConfig, probe: QConfigProbe, label: str
) -> Reason | None:
    """The reason for an integer qconfig on a pattern the backend runs only on float inputs
    (a bfloat16-only op, a weight-only embedding), or None: "not the backend's bfloat16"
    read as a bfloat16 problem to a user of an int8 mapping, who can act on this instead."""
    act = probe.activation
    inputs = {canonical_dtype(c.input_dtype) for c in pattern_config.dtype_configs if c.input_dtype}
    if act.is_dynamic or not is_quantized_dtype(act.dtype) or not inputs:
        return None
    if any(is_quantized_dtype(dtype) for dtype in inputs):
        return None
    names = " or ".join(sorted(dtype_name(dtype) for dtype in inputs))
    if inputs <= set(_REDUCED):
        words = (
            f"{label}: the backend runs this op only in {names}, with no kernel for the "
            f"qconfig's {act.dtype} activations, so it stays float32; give it a "
            f"{names} qconfig to run it in {names}, or qconfig None to keep it float32 "
            "without this entry"
        )
    else:
        words = (
            f"{label}: the backend takes this op's activations in {names} only (it quantizes "
            f"at most its weights), not the qconfig's {act.dtype}, so it stays "
            "float32; give it a weight-only qconfig (float_qparams_weight_only_qconfig for an "
            "embedding), or qconfig None to keep it float32 without this entry"
        )
    return Reason(ReasonCode.DTYPE_MISMATCH, words, field="input_dtype", bound=names)
