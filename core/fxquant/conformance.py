"""Does an installed backend keep the plugin contract? What ``fxquant check NAME`` runs.

Built on the test kit (:mod:`fxquant.testing`): its single-op cases, its quantize
helpers and its checks. Each group of checks returns rows (pattern, check,
result, reason):

    well_formed             every pattern config: a valid pattern, dtypes fxquant
                            quantizes to, fusion and reference modules given in pairs
    default_mapping         every entry of the default mapping (and of the QAT one)
    default_qat_mapping     is accepted by the dtype configs of the patterns it reaches
    kernels[case]           one single-op case of the kit on random shapes: each lowering
                            rule's kernel within the rule's declared tolerance of the
                            reference pattern; the lowered model survives a state_dict
                            round trip and copy.deepcopy; nothing warns of a deprecation
    deployed[case]          (backends that deploy, no kernels) a few cases in the runtime
    fresh_process_warnings  a new interpreter quantizes and runs a model without a warning

:func:`check_backend` runs every group (the command); :func:`conformance_checks`
gives them to a backend's own test suite, one test per group.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import operator
import random
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxquant import testing
from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.config.pattern import is_match_all
from fxquant.dtypes import canonical_dtype
from fxquant.enums import StrEnum, member
from fxquant.errors import FxquantError, MissingDefaultQConfigError
from fxquant.flow.dtype_check import QConfigProbe, select_dtype_config
from fxquant.flow.match import PatternIndex, match_graph
from fxquant.flow.report import Reason
from fxquant.lowering import LoweringRule
from fxquant.progress import progress
from fxquant.registry import default_registry, get_default_qconfig_mapping
from fxquant.registry.describe import class_str, pattern_text

__all__ = [
    "DEPLOYED_CASES",
    "VARIANT_CASES",
    "CheckResult",
    "CheckStatus",
    "Group",
    "check_backend",
    "conformance_checks",
    "default_mapping_rows",
    "groups",
    "kernel_rows",
    "pattern_problems",
    "render_results",
    "well_formed_rows",
]


def _img(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s, s)]


def _img2(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s, s), (b, c, s, s)]


def _seq(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s)]


def _vol(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, 2, s, s)]


def _fn(fn: Callable[..., torch.Tensor]) -> Callable[[int, int], nn.Module]:
    return lambda i, o: testing.Function(fn)


def _binary(op: Callable[..., torch.Tensor], relu: bool = False) -> Callable[[int, int], nn.Module]:
    return lambda i, o: testing.Binary(op, relu=relu)


VARIANT_CASES: tuple[testing.Case, ...] = (
    testing.Case("operator_add", _binary(operator.add), _img2),
    testing.Case("operator_add_relu", _binary(operator.add, relu=True), _img2),
    testing.Case("operator_mul", _binary(operator.mul), _img2),
    testing.Case("matmul", _binary(torch.matmul), _img2),
    testing.Case("stack", _fn(lambda x: torch.stack([x, x], 1)), _img),
    testing.Case("conv1d_relu", lambda i, o: nn.Sequential(nn.Conv1d(i, o, 3), nn.ReLU()), _seq),
    testing.Case("conv3d_relu", lambda i, o: nn.Sequential(nn.Conv3d(i, o, 1), nn.ReLU()), _vol),
    testing.Case("conv_transpose1d", lambda i, o: nn.ConvTranspose1d(i, o, 2, stride=2), _seq),
    testing.Case("max_pool1d", lambda i, o: nn.MaxPool1d(2), _seq),
    testing.Case("avg_pool1d", lambda i, o: nn.AvgPool1d(2), _seq),
    testing.Case("max_pool3d", lambda i, o: nn.MaxPool3d((1, 2, 2)), _vol),
    testing.Case("f_max_pool2d", _fn(lambda x: F.max_pool2d(x, 2)), _img),
    testing.Case("f_avg_pool2d", _fn(lambda x: F.avg_pool2d(x, 2)), _img),
    testing.Case("f_relu", _fn(F.relu), _img),
    testing.Case("f_hardtanh", _fn(F.hardtanh), _img),
    testing.Case("f_hardswish", _fn(F.hardswish), _img),
    testing.Case("f_leaky_relu", _fn(lambda x: F.leaky_relu(x, 0.2)), _img),
    testing.Case("f_elu", _fn(F.elu), _img),
    testing.Case("clamp", _fn(lambda x: torch.clamp(x, -1.0, 1.0)), _img),
    testing.Case("torch_tanh", _fn(torch.tanh), _img),
    testing.Case("sigmoid_module", lambda i, o: nn.Sigmoid(), _img),
    testing.Case("torch_mean", _fn(lambda x: torch.mean(x, (2, 3))), _img),
    testing.Case("method_relu", _fn(lambda x: x.relu()), _img),
    testing.Case("method_sigmoid", _fn(lambda x: x.sigmoid()), _img),
    testing.Case("method_flatten", _fn(lambda x: x.flatten(1)), _img),
    testing.Case("method_view", _fn(lambda x: x.view(x.shape[0], -1)), _img),
    testing.Case("permute", _fn(lambda x: x.permute(0, 2, 3, 1)), _img),
    testing.Case("transpose", _fn(lambda x: torch.transpose(x, 2, 3)), _img),
    testing.Case("unsqueeze", _fn(lambda x: x.unsqueeze(1)), _img),
    testing.Case("contiguous", _fn(lambda x: x.contiguous()), _img),
    testing.Case("pixel_shuffle", lambda i, o: nn.PixelShuffle(1), _img),
    testing.Case("flatten_module", lambda i, o: nn.Flatten(), _img),
    testing.Case("instance_norm1d", lambda i, o: nn.InstanceNorm1d(i), _seq),
    testing.Case("prelu", lambda i, o: nn.PReLU(), _img),
)
"""Single-op cases beyond the kit's: the spellings of the same ops (``operator.add``,
``F.relu``, ``x.relu()``...) and the other ranks, so more of each backend's rules are
reached. ``fxquant check`` runs them after :data:`fxquant.testing.LOWERING_CASES`."""

DEPLOYED_CASES = ("conv2d", "linear", "add")
"""The cases a deployed backend runs (exporting and deploying takes seconds a case)."""

_PACKED = tuple(
    d for d in (getattr(torch, "quint4x2", None), getattr(torch, "quint2x4", None)) if d
)
_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32})
_ACTIVATION_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32}) | _FLOATS
_WEIGHT_DTYPES = frozenset({torch.uint8, torch.int8, torch.int32, *_PACKED}) | _FLOATS
_DEPRECATION = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


class CheckStatus(StrEnum):
    """The result of one check: its members are their strings (``"pass"``...)."""

    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One row of ``fxquant check``: what was checked, on what, and how it went.

    Attributes:
        pattern: the pattern (or mapping entry, or lowered patterns) checked.
        check: the check's name (``well_formed``, ``kernel[conv2d]``...).
        result: pass, fail or skip (a string is accepted and checked).
        reason: why it failed or was skipped, or what passed (a figure).
        rules: names of the lowering rules the check exercised.

    Example:
        >>> CheckResult("Linear", "well_formed", "pass").result
        <CheckStatus.PASS: 'pass'>
    """

    pattern: str
    check: str
    result: CheckStatus
    reason: str = ""
    rules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", member(CheckStatus, self.result, "result"))


@dataclass(frozen=True)
class Group:
    """A named group of checks: ``run(backend)`` returns its rows.

    Example:
        >>> group = Group("nothing", lambda backend: [])
        >>> group.run("reference"), str(group)
        ([], 'nothing')
    """

    name: str
    run: Callable[[str], list[CheckResult]]

    def __str__(self) -> str:
        return self.name


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


def _random_sizes(backend: str, case: testing.Case, shapes: int, seed: int) -> list[testing.Sizes]:
    generator = random.Random(f"{backend}/{case.name}/{seed}")  # the same shapes every run
    sizes = [tuple(generator.randint(low, high) for low, high in testing.SIZE_BOUNDS)]
    while len(sizes) < shapes:
        sizes.append(tuple(generator.randint(low, high) for low, high in testing.SIZE_BOUNDS))
    return sizes  # type: ignore[return-value]  # four entries, as Sizes says


def _generic(case: testing.Case) -> testing.Case:
    # fxquant's generic int8 mapping quantizes the ops a backend's default keeps float
    # (x86 keeps add float for transformers): the kernels for them get checked too
    return dataclasses.replace(
        case, mapping=lambda backend: get_default_qconfig_mapping("reference")
    )


def _lowered_nodes(model: fx.GraphModule) -> set[str]:
    return {
        node for node, status in testing.lowering_statuses(model).items() if status == "lowered"
    }


def _rules_used(
    reference: fx.GraphModule, rules: Sequence[LoweringRule], lowered: set[str]
) -> list[LoweringRule]:
    """The rules whose matches in the reference model cover the lowered nodes."""
    index: PatternIndex[LoweringRule] = PatternIndex.build((rule.key, rule) for rule in rules)
    matches = match_graph(reference, index, modules=dict(reference.named_modules()))
    used = {id(m.payload): m.payload for node, m in matches.items() if node.name in lowered}
    return list(used.values())


@dataclass(frozen=True, slots=True)
class _Trial:
    """One quantized case: the models, the inputs, the rules that lowered it."""

    lowered: fx.GraphModule
    reference: fx.GraphModule
    inputs: list[torch.Tensor]
    rules: list[LoweringRule]


def _trial(backend: str, case: testing.Case, sizes: testing.Sizes, seed: int) -> _Trial:
    rules = default_registry().assembled(backend).lowering_rules
    lowered, reference, inputs = testing.quantize_case(backend, case, sizes, seed=seed)
    return _Trial(
        lowered, reference, inputs, _rules_used(reference, rules, _lowered_nodes(lowered))
    )


def _trials(
    backend: str, case: testing.Case, shapes: int, seed: int
) -> tuple[testing.Case, list[_Trial]]:
    """The case quantized at ``shapes`` random sizes, with the mapping that lowers it."""
    sizes = _random_sizes(backend, case, shapes, seed)
    first = _trial(backend, case, sizes[0], seed)
    if not first.rules and default_registry().assembled(backend).lowering_rules:
        generic = _trial(backend, _generic(case), sizes[0], seed)
        if generic.rules:
            case, first = _generic(case), generic
    return case, [first, *(_trial(backend, case, s, seed) for s in sizes[1:])]


def _rule_text(rule: LoweringRule) -> str:
    return f"{pattern_text(rule.key)} ({rule.name})"


def _off_by(case: testing.Case, trial: _Trial) -> tuple[float, float, float]:
    """(difference, bound, output step) of the lowered model against the reference."""
    with torch.no_grad():
        expected = trial.reference(*trial.inputs)
        difference = float((trial.lowered(*trial.inputs) - expected).abs().max())
    step = testing.output_scale(trial.reference)
    declared = max(rule.tolerance for rule in trial.rules)
    # the kit's bound for one step (or float rounding for a float output), times the rules'
    return difference, testing.tolerance(case, expected, step) * declared, step


def _numerics_row(case: testing.Case, trials: list[_Trial], name: str) -> CheckResult:
    pattern = ", ".join(_rule_text(r) for r in trials[0].rules) or f"{case.name} (not lowered)"
    rules = tuple(_rule_text(r) for r in trials[0].rules)
    if not rules:
        statuses = sorted({s.value for s in testing.lowering_statuses(trials[0].lowered).values()})
        words = f"the backend lowers no node of this case (statuses: {', '.join(statuses)})"
        return CheckResult(pattern, name, CheckStatus.SKIP, words)
    declared = max(rule.tolerance for rule in trials[0].rules)
    worst = 0.0
    for trial in trials:
        difference, bound, step = _off_by(case, trial)
        off = difference / step if step else difference
        unit = "output steps" if step else "(float output)"
        if difference > bound:
            sizes = tuple(trial.inputs[0].shape)
            words = f"{off:.3g} {unit} off the reference at input {sizes}; declared {declared:g}"
            return CheckResult(pattern, name, CheckStatus.FAIL, words, rules)
        worst = max(worst, off)
    unit = "steps" if testing.output_scale(trials[0].reference) else "(float output)"
    words = f"within {worst:.3g} {unit} on {len(trials)} shapes; declared {declared:g}"
    return CheckResult(pattern, name, CheckStatus.PASS, words, rules)


def _state_dict_problem(model: fx.GraphModule, inputs: list[torch.Tensor]) -> str | None:
    with torch.no_grad():
        expected = model(*inputs)
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        other = copy.deepcopy(model)
        weights = [v for k, v in other.state_dict().items() if k.endswith("weight")]
        for value in weights:
            value.zero_()
        if weights:
            # a kernel that packs its weights on first use packs the zeros now (zero weights
            # may also be refused: only what the reload gives back matters)
            with contextlib.suppress(Exception):
                other(*inputs)
        buffer.seek(0)
        try:
            state = torch.load(buffer, weights_only=True)
        except Exception as error:  # whatever torch.load raises goes in the row
            return f"torch.load(weights_only=True) refuses the state_dict: {error}".splitlines()[0]
        other.load_state_dict(state)
        if not torch.equal(other(*inputs), expected):
            return "after load_state_dict the outputs differ: a kernel keeps state outside it"
    return None


def _copy_rows(trial: _Trial, pattern: str, case: str) -> list[CheckResult]:
    rows = []
    problem = _state_dict_problem(trial.lowered, trial.inputs)
    result = CheckStatus.FAIL if problem else CheckStatus.PASS
    rows.append(CheckResult(pattern, f"state_dict[{case}]", result, problem or ""))
    with torch.no_grad():
        same = torch.equal(
            copy.deepcopy(trial.lowered)(*trial.inputs), trial.lowered(*trial.inputs)
        )
    words = "" if same else "the deep copy's outputs differ from the model's"
    result = CheckStatus.PASS if same else CheckStatus.FAIL
    rows.append(CheckResult(pattern, f"deepcopy[{case}]", result, words))
    return rows


def _warnings_row(
    caught: Iterable[warnings.WarningMessage], pattern: str, case: str
) -> CheckResult:
    found = [
        w
        for w in caught
        if issubclass(w.category, _DEPRECATION) or "deprecat" in str(w.message).lower()
    ]
    if not found:
        return CheckResult(pattern, f"warnings[{case}]", CheckStatus.PASS)
    first = found[0]
    words = f"{first.category.__name__}: {first.message} ({first.filename}:{first.lineno})"
    return CheckResult(pattern, f"warnings[{case}]", CheckStatus.FAIL, words.splitlines()[0])


def kernel_rows(
    backend: str, case: testing.Case, *, shapes: int = 3, seed: int = 0
) -> list[CheckResult]:
    """Rows of one case: kernel numerics, state_dict, deepcopy and deprecation warnings.

    The case is quantized with the backend's default mapping (or, when that
    lowers nothing, fxquant's generic int8 mapping), converted and compared
    with the reference model at ``shapes`` random sizes.

    Example:
        >>> case = next(c for c in testing.LOWERING_CASES if c.name == "relu")
        >>> [row.result.value for row in kernel_rows("reference", case, shapes=1)]
        ['skip', 'pass', 'pass', 'pass']
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        used, trials = _trials(backend, case, shapes, seed)
        numerics = _numerics_row(used, trials, f"kernel[{case.name}]")
        rows = [numerics, *_copy_rows(trials[0], numerics.pattern, case.name)]
    return [*rows, _warnings_row(caught, numerics.pattern, case.name)]


def _deployed_rows(backend: str, case_name: str) -> list[CheckResult]:
    case = next(c for c in testing.LOWERING_CASES if c.name == case_name)
    check = f"deployed[{case_name}]"
    try:
        difference = testing.check_deployed(backend, case, (2, 4, 6, 8))
    except AssertionError as error:
        return [CheckResult(case_name, check, CheckStatus.FAIL, str(error).splitlines()[0])]
    return [CheckResult(case_name, check, CheckStatus.PASS, f"within one step ({difference:.3g})")]


def _fresh_process_rows(backend: str) -> list[CheckResult]:
    check = "fresh_process_warnings"
    try:
        testing.check_no_warning_in_fresh_process(backend)
    except AssertionError as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        return [CheckResult("Conv2d, ReLU", check, CheckStatus.FAIL, lines[-1])]
    return [CheckResult("Conv2d, ReLU", check, CheckStatus.PASS)]


def groups(
    backend: str,
    *,
    shapes: int = 3,
    seed: int = 0,
    cases: Sequence[testing.Case] | None = None,
    fresh_process: bool = True,
) -> list[Group]:
    """The groups of checks for ``backend`` (a deployed backend gets deployed cases).

    ``fresh_process=False`` leaves out the check in a new interpreter (which
    cannot see a plugin given to ``register_plugin`` in this one).

    Raises:
        UnknownBackendError: no installed plugin serves ``backend``.

    Example:
        >>> [str(g) for g in groups("reference", cases=[])]
        ['well_formed', 'default_mapping', 'default_qat_mapping', 'fresh_process_warnings']
    """
    assembled = default_registry().assembled(backend)
    found = [
        Group("well_formed", well_formed_rows),
        Group("default_mapping", default_mapping_rows),
        Group("default_qat_mapping", functools.partial(default_mapping_rows, is_qat=True)),
    ]
    if assembled.deployment is not None and not assembled.lowering_rules:
        found += [
            Group(f"deployed[{name}]", functools.partial(_deployed_rows, case_name=name))
            for name in DEPLOYED_CASES
        ]
    else:
        run = functools.partial(kernel_rows, shapes=shapes, seed=seed)
        found += [
            Group(f"kernels[{case}]", functools.partial(run, case=case))
            for case in ((*testing.LOWERING_CASES, *VARIANT_CASES) if cases is None else cases)
        ]
    return (
        [*found, Group("fresh_process_warnings", _fresh_process_rows)] if fresh_process else found
    )


def _run(group: Group, backend: str) -> list[CheckResult]:
    try:
        return group.run(backend)
    except Exception as error:  # a crash is a failed check, reported in its row
        words = f"{type(error).__name__}: {error}".splitlines()[0]
        return [CheckResult("*", str(group), CheckStatus.FAIL, words)]


def _coverage_rows(backend: str, rows: Sequence[CheckResult]) -> list[CheckResult]:
    reached = {rule for row in rows for rule in row.rules}
    return [
        CheckResult(
            _rule_text(rule),
            "kernel",
            CheckStatus.SKIP,
            "no case of fxquant.testing reaches this rule: test it in the plugin's suite",
        )
        for rule in default_registry().assembled(backend).lowering_rules
        if _rule_text(rule) not in reached
    ]


def check_backend(
    backend: str,
    *,
    shapes: int = 3,
    seed: int = 0,
    cases: Sequence[testing.Case] | None = None,
    fresh_process: bool = True,
    show_progress: bool | None = None,
) -> list[CheckResult]:
    """Run every group of checks on ``backend``; rows for lowering rules no case reached.

    Args:
        backend: an installed backend's name.
        shapes: random sizes per case.
        seed: the seed of the sizes, weights and inputs.
        cases: the single-op cases (default: ``fxquant.testing.LOWERING_CASES`` and
            :data:`VARIANT_CASES`).
        fresh_process: also check in a new interpreter (see :func:`groups`).
        show_progress: a progress bar on stderr (default: when stderr is a terminal).

    Raises:
        UnknownBackendError: no installed plugin serves ``backend``.

    Example:
        >>> rows = check_backend("reference", cases=[], show_progress=False)
        >>> sorted({row.result.value for row in rows})
        ['pass']
    """
    found: list[CheckResult] = []
    chosen = groups(backend, shapes=shapes, seed=seed, cases=cases, fresh_process=fresh_process)
    for group in progress(chosen, description=f"fxquant check {backend}", enabled=show_progress):
        found += _run(group, backend)
    return found + _coverage_rows(backend, found)


def render_results(rows: Sequence[CheckResult], title: str = "") -> str:
    """The rows as a Markdown table, then one line counting them.

    Example:
        >>> print(render_results([CheckResult("Linear", "well_formed", "pass")], "mine"))
        | pattern | check       | result | reason |
        | ------- | ----------- | ------ | ------ |
        | Linear  | well_formed | pass   |        |
        mine: 1 checks: 1 pass, 0 fail, 0 skip
    """
    from fxquant.cli import markdown_table

    table = markdown_table(
        ["pattern", "check", "result", "reason"],
        [[r.pattern, r.check, r.result.value, r.reason] for r in rows],
    )
    counts = {status: sum(r.result == status for r in rows) for status in CheckStatus}
    summary = ", ".join(f"{n} {status.value}" for status, n in counts.items())
    return f"{table}\n{title + ': ' if title else ''}{len(rows)} checks: {summary}"


def _assert_passes(group: Group, backend: str) -> None:
    failed = [row for row in _run(group, backend) if row.result == CheckStatus.FAIL]
    if failed:
        msg = f"{backend}: {len(failed)} failed\n{render_results(failed, backend)}"
        raise AssertionError(msg)


def conformance_checks(
    backend: str,
    *,
    shapes: int = 3,
    seed: int = 0,
    cases: Sequence[testing.Case] | None = None,
    fresh_process: bool = True,
) -> list[testing.NamedCheck]:
    """The groups of :func:`check_backend` as checks for a backend's own test suite.

    Each raises :class:`AssertionError` with the table of its failed rows::

        @pytest.mark.parametrize("check", conformance_checks("mine"), ids=str)
        def test_backend_conforms(check):
            check("mine")

    Example:
        >>> [str(c) for c in conformance_checks("reference", cases=[])][:1]
        ['well_formed']
    """
    return [
        testing.NamedCheck(str(group), functools.partial(_assert_passes, group))
        for group in groups(
            backend, shapes=shapes, seed=seed, cases=cases, fresh_process=fresh_process
        )
    ]
