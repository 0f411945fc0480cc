"""Checks of a backend's kernels on the kit's single-op cases at random shapes.

Each case is quantized, converted and compared with its reference model: the
kernel within its rule's declared tolerance, the lowered model through a
``state_dict`` round trip and ``copy.deepcopy``, and no deprecation warning on
the way. Deployed backends (no kernels) run a few cases in their runtime.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import random
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import fx

from fxquant.flow.match import PatternIndex, match_graph
from fxquant.lowering import LoweringRule
from fxquant.registry import default_registry, get_default_qconfig_mapping
from fxquant.tools import testing
from fxquant.tools.conformance.results import CheckResult, CheckStatus
from fxquant.tools.describe import pattern_text

__all__ = ["deployed_rows", "fresh_process_rows", "kernel_rows", "rule_text"]

_DEPRECATION = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


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


def rule_text(rule: LoweringRule) -> str:
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
    pattern = ", ".join(rule_text(r) for r in trials[0].rules) or f"{case.name} (not lowered)"
    rules = tuple(rule_text(r) for r in trials[0].rules)
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


def deployed_rows(backend: str, case_name: str) -> list[CheckResult]:
    case = next(c for c in testing.LOWERING_CASES if c.name == case_name)
    check = f"deployed[{case_name}]"
    try:
        difference = testing.check_deployed(backend, case, (2, 4, 6, 8))
    except AssertionError as error:
        return [CheckResult(case_name, check, CheckStatus.FAIL, str(error).splitlines()[0])]
    return [CheckResult(case_name, check, CheckStatus.PASS, f"within one step ({difference:.3g})")]


def fresh_process_rows(backend: str) -> list[CheckResult]:
    check = "fresh_process_warnings"
    try:
        testing.check_no_warning_in_fresh_process(backend)
    except AssertionError as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        return [CheckResult("Conv2d, ReLU", check, CheckStatus.FAIL, lines[-1])]
    return [CheckResult("Conv2d, ReLU", check, CheckStatus.PASS)]
