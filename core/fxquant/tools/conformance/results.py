"""The rows ``fxquant check`` prints: a result, a named group of checks, the table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fxquant.enums import StrEnum, member
from fxquant.tools.tables import markdown_table

__all__ = ["CheckResult", "CheckStatus", "Group", "render_results"]


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


def render_results(
    rows: Sequence[CheckResult], title: str = "", counted: Sequence[CheckResult] | None = None
) -> str:
    """The rows as a Markdown table, then one line counting ``counted`` (default: the rows;
    ``fxquant check --failures`` shows the failed rows and counts every check).

    Example:
        >>> print(render_results([CheckResult("Linear", "well_formed", "pass")], "mine"))
        | pattern | check       | result | reason |
        | ------- | ----------- | ------ | ------ |
        | Linear  | well_formed | pass   |        |
        mine: 1 checks: 1 pass, 0 fail, 0 skip
    """
    table = markdown_table(
        ["pattern", "check", "result", "reason"],
        [[r.pattern, r.check, r.result.value, r.reason] for r in rows],
    )
    everything = rows if counted is None else counted
    counts = {status: sum(r.result == status for r in everything) for status in CheckStatus}
    summary = ", ".join(f"{n} {status.value}" for status, n in counts.items())
    return f"{table}\n{title + ': ' if title else ''}{len(everything)} checks: {summary}"
