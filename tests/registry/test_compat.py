"""Requires-Dist checks against the installed fxquant, before any import."""

from __future__ import annotations

import pytest
from fxquant.registry.compat import fxquant_requirement, normalize_dist_name, version_satisfies
from hypothesis import given
from hypothesis import strategies as st

packaging_specifiers = pytest.importorskip("packaging.specifiers")
packaging_version = pytest.importorskip("packaging.version")


@pytest.mark.parametrize(
    ("requires", "expected"),
    [
        (None, None),
        (["torch>=2.4"], None),
        (["FXQuant >=0.1, <0.2"], ">=0.1, <0.2"),
        (["fxquant (>=0.1)"], ">=0.1"),
        (["fxquant[test]>=0.1; python_version >= '3.10'"], ">=0.1"),
        (["fxquant<0.1; extra == 'dev'", "fxquant>=0.1"], ">=0.1"),
        (["fxquant"], ""),
    ],
)
def test_the_fxquant_requirement_is_found_in_requires_dist(
    requires: list[str] | None, expected: str | None
) -> None:
    assert fxquant_requirement(requires) == expected


def test_distribution_names_compare_in_their_normal_form() -> None:
    assert normalize_dist_name("FXQuant__X86.extra") == "fxquant-x86-extra"


release = st.lists(st.integers(0, 12), min_size=1, max_size=3).map(
    lambda parts: ".".join(map(str, parts))
)
clause = st.tuples(st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "~="]), release)


@given(version=release, clauses=st.lists(clause, min_size=1, max_size=3))
def test_version_satisfies_agrees_with_packaging_on_release_versions(
    version: str, clauses: list[tuple[str, str]]
) -> None:
    clauses = [(op, v if op != "~=" or "." in v else v + ".0") for op, v in clauses]
    specifier = ",".join(op + v for op, v in clauses)
    expected = packaging_specifiers.SpecifierSet(specifier).contains(
        packaging_version.Version(version)
    )
    assert version_satisfies(version, specifier) == expected


@pytest.mark.parametrize(
    ("specifier", "expected"),
    [("==0.1.*", True), ("==0.2.*", False), ("!=0.1.*", False), ("", True), (">=banana", True)],
)
def test_wildcards_empty_and_unparsable_specifiers(specifier: str, expected: bool) -> None:
    assert version_satisfies("0.1.0", specifier) == expected
