"""``fxquant check`` catches each planted fault, and a backend without faults passes."""

from __future__ import annotations

from collections.abc import Iterator

import fxquant
import fxquant.registry
import pytest
from fxquant.lowering import LoweringRule
from fxquant.tools import testing
from fxquant.tools.conformance import CheckResult, check_backend, conformance_checks
from torch import nn

from tests.conformance import planted

CASES = [c for c in testing.LOWERING_CASES if c.name in ("linear", "conv2d", "relu")]


@pytest.fixture(scope="module", autouse=True)
def registered() -> Iterator[None]:
    for backend in planted.BACKENDS:
        fxquant.register_plugin(planted, backend=backend)
    yield
    fxquant.unregister_plugin(planted)


def failures(backend: str) -> set[tuple[str, str]]:
    # fresh_process is False: a new interpreter cannot see a plugin registered in this one
    rows = check_backend(backend, cases=CASES, shapes=2, fresh_process=False)
    return {(row.pattern, row.check) for row in rows if row.result == "fail"}


def test_a_backend_without_faults_passes_every_check() -> None:
    rows = check_backend("clean", cases=CASES, shapes=2, fresh_process=False)
    assert {row.result.value for row in rows} == {"pass", "skip"}
    kernel = next(row for row in rows if row.check == "kernel[linear]")
    assert (kernel.result, kernel.pattern) == ("pass", "reference.Linear (qlinear)")


def test_each_planted_fault_fails_its_named_check_and_nothing_else() -> None:
    assert failures("faulty") == {
        ("Hardswish", "well_formed"),  # the int64 dtype
        ("Conv2d", "default_mapping"),  # quant_max 255 against the config's 127
        ("Conv2d", "default_qat_mapping"),
        ("reference.Linear (qlinear)", "kernel[linear]"),  # two steps off
        ("reference.Linear (qlinear)", "warnings[linear]"),  # DeprecationWarning
    }


def test_the_failures_say_why() -> None:
    rows = check_backend("faulty", cases=CASES[:1], shapes=1, fresh_process=False)
    reasons = {row.check: row.reason for row in rows if row.result == "fail"}
    assert "input dtype torch.int64 is not one fxquant handles" in reasons["well_formed"]
    assert "quant_range" in reasons["default_mapping"]
    assert reasons["kernel[linear]"].startswith("2 output steps off the reference")
    assert reasons["warnings[linear]"].startswith("DeprecationWarning: QLinear is deprecated")


def test_a_kernel_passes_within_the_tolerance_its_rule_declares() -> None:
    rows = check_backend("tolerant", cases=CASES[:1], shapes=2, fresh_process=False)
    kernel = next(row for row in rows if row.check == "kernel[linear]")
    assert kernel.result == "pass"
    assert kernel.reason == "within 2 steps on 2 shapes; declared 3"


def test_the_test_suite_entry_point_raises_with_the_failed_rows() -> None:
    checks = conformance_checks("faulty", cases=CASES[:1], shapes=1, fresh_process=False)
    by_name = {str(check): check for check in checks}
    assert list(by_name) == [
        "well_formed",
        "default_mapping",
        "default_qat_mapping",
        "kernels[linear]",
    ]
    with pytest.raises(
        AssertionError, match=r"(?s)faulty: 1 failed\n.*\| Conv2d  \| default_mapping \| fail"
    ):
        by_name["default_mapping"]("faulty")
    by_name["default_mapping"]("clean")  # the same check on the clean backend passes


def test_rows_check_their_result() -> None:
    with pytest.raises(ValueError, match="result 'ok' is not one of pass, fail, skip"):
        CheckResult("Linear", "well_formed", "ok")  # type: ignore[arg-type]


class _Family:
    """A backend whose rules include a family (two patterns, one name) no case reaches."""

    @fxquant.registry.hookimpl
    def fxquant_pattern_configs(self, backend: str) -> list[object] | None:
        return planted.fxquant_pattern_configs("clean") if backend == "family" else None

    @fxquant.registry.hookimpl
    def fxquant_default_qconfig_mapping(self, backend: str, is_qat: bool) -> object | None:
        return (
            planted.fxquant_default_qconfig_mapping("clean", is_qat)
            if backend == "family"
            else None
        )

    @fxquant.registry.hookimpl
    def fxquant_lowering_kernels(self, backend: str) -> list[LoweringRule] | None:
        if backend != "family":
            return None
        never = lambda match: None  # noqa: E731  # no case reaches these rules
        return [
            LoweringRule(nn.ReLU6, build=never, name="spelled", quantized=False),
            LoweringRule(nn.Hardtanh, build=never, name="spelled", quantized=False),
            LoweringRule(nn.ELU, build=never, name="lone", quantized=False),
        ]


def test_a_family_of_unreached_rules_is_one_skip_row_and_a_lone_rule_its_own() -> None:
    plugin = _Family()
    fxquant.register_plugin(plugin, backend="family")
    try:
        rows = check_backend("family", cases=[], fresh_process=False)
    finally:
        fxquant.unregister_plugin(plugin)
    skipped = {row.pattern: row.reason for row in rows if row.check == "kernel"}
    assert list(skipped) == ["spelled (2 patterns)", "ELU (lone)"]
    assert skipped["spelled (2 patterns)"].startswith(
        "no case of fxquant.tools.testing reaches any of its 2 patterns (the first: ReLU6)"
    )
