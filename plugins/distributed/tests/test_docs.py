"""docs/distributed.md documents every public name of fxquant_distributed, and its figures."""

from __future__ import annotations

from pathlib import Path

import fxquant_distributed

DOC = (Path(__file__).resolve().parents[3] / "docs" / "distributed.md").read_text()


def test_every_public_name_of_fxquant_distributed_is_documented() -> None:
    missing = [name for name in fxquant_distributed.__all__ if f"`{name}" not in DOC]
    assert missing == []


def test_the_measured_figures_are_in_and_say_how_they_were_made() -> None:
    assert "bench/bench_distributed.py" in DOC
    assert "| min/max | sharded |" in DOC
    assert "MEASURED" not in DOC
