"""Does an installed backend keep the plugin contract? What ``fxquant check NAME`` runs.

Built on the test kit (:mod:`fxquant.tools.testing`): its single-op cases, its quantize
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
    deployment_protocol     (backends that deploy) convert_fx's model deployed, called,
                            explained, saved and loaded back (:mod:`.deployment`)
    fresh_process_warnings  a new interpreter quantizes and runs a model without a warning

:func:`check_backend` runs every group (the command); :func:`conformance_checks`
gives them to a backend's own test suite, one test per group.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from fxquant.lowering import LoweringRule
from fxquant.registry import default_registry
from fxquant.tools import testing
from fxquant.tools.conformance.cases import DEPLOYED_CASES, VARIANT_CASES
from fxquant.tools.conformance.configs import (
    default_mapping_rows,
    pattern_problems,
    well_formed_rows,
)
from fxquant.tools.conformance.deployment import protocol_rows
from fxquant.tools.conformance.kernels import (
    deployed_rows,
    fresh_process_rows,
    kernel_rows,
    rule_text,
)
from fxquant.tools.conformance.results import CheckResult, CheckStatus, Group, render_results
from fxquant.tools.describe import pattern_text
from fxquant.tools.progress import progress

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
    if assembled.deployment is not None:
        found.append(Group("deployment_protocol", protocol_rows))
    if assembled.deployment is not None and not assembled.lowering_rules:
        found += [
            Group(f"deployed[{name}]", functools.partial(deployed_rows, case_name=name))
            for name in DEPLOYED_CASES
        ]
    else:
        run = functools.partial(kernel_rows, shapes=shapes, seed=seed)
        found += [
            Group(f"kernels[{case}]", functools.partial(run, case=case))
            for case in ((*testing.LOWERING_CASES, *VARIANT_CASES) if cases is None else cases)
        ]
    return [*found, Group("fresh_process_warnings", fresh_process_rows)] if fresh_process else found


def _run(group: Group, backend: str) -> list[CheckResult]:
    try:
        return group.run(backend)
    except Exception as error:  # a crash is a failed check, reported in its row
        words = f"{type(error).__name__}: {error}".splitlines()[0]
        return [CheckResult("*", str(group), CheckStatus.FAIL, words)]


def _coverage_rows(backend: str, rows: Sequence[CheckResult]) -> list[CheckResult]:
    """A skip row per lowering rule no case reached.

    Rules that share a name and are all unreached (a family such as 112 spellings of
    one attention kernel) get one row, so the table stays readable.
    """
    reached = {rule for row in rows for rule in row.rules}
    families: dict[str, list[LoweringRule]] = {}
    for rule in default_registry().assembled(backend).lowering_rules:
        families.setdefault(rule.name, []).append(rule)
    found = []
    for name, family in families.items():
        missed = [rule for rule in family if rule_text(rule) not in reached]
        if len(missed) > 1 and len(missed) == len(family):
            first = pattern_text(missed[0].key)
            words = (
                f"no case of fxquant.tools.testing reaches any of its {len(missed)} patterns "
                f"(the first: {first}): test them in the plugin's suite"
            )
            found.append(
                CheckResult(f"{name} ({len(missed)} patterns)", "kernel", CheckStatus.SKIP, words)
            )
            continue
        found += [
            CheckResult(rule_text(rule), "kernel", CheckStatus.SKIP, _UNREACHED) for rule in missed
        ]
    return found


_UNREACHED = "no case of fxquant.tools.testing reaches this rule: test it in the plugin's suite"


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
        cases: the single-op cases (default: ``fxquant.tools.testing.LOWERING_CASES`` and
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
