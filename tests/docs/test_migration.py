"""The migration guide's promises: its import table resolves, and its worked example
changes only imports and gives torch.ao's numbers."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from pathlib import Path

import pytest
import torch

from tests import oracle

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
TEXT = PAGE.read_text()
ROW = re.compile(r"^\| `([\w.]+)` \| `([\w.]+)` \|", re.M)
ROWS = ROW.findall(TEXT)
AO_BLOCK, FXQUANT_BLOCK = re.findall(r"^```python\n(.*?)^```", TEXT, re.M | re.S)[:2]


def resolve(dotted: str) -> object:
    """The object a dotted name denotes: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def body(code: str) -> list[str]:
    """The lines of a script that are not imports or comments (import blocks span lines)."""
    lines, in_import = [], False
    for line in code.splitlines():
        if in_import:
            in_import = not line.startswith(")")
            continue
        if line.startswith(("import ", "from ")):
            in_import = line.endswith("(")
            continue
        if not line.startswith("#"):
            lines.append(line)
    return lines


def run(code: str) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "migration_example"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace


def test_the_table_has_a_row_for_each_name_the_example_imports() -> None:
    assert len(ROWS) >= 40
    imported = set(re.findall(r"^from (torch\.ao[\w.]*) import", AO_BLOCK, re.M))
    table = {ao.rsplit(".", 1)[0] for ao, _ in ROWS}
    assert imported <= table


@pytest.mark.parametrize(("ao", "fxquant"), ROWS, ids=[ao for ao, _ in ROWS])
def test_every_name_of_the_table_exists_in_fxquant_and_in_torch_ao(ao: str, fxquant: str) -> None:
    assert resolve(fxquant) is not None
    if importlib.util.find_spec("torch.ao.quantization") is not None:
        oracle.load()
        with oracle.quiet():
            assert resolve(ao) is not None


def test_the_example_changes_only_the_imports() -> None:
    assert body(AO_BLOCK) == body(FXQUANT_BLOCK)
    assert "torch.ao" not in FXQUANT_BLOCK


def test_the_example_gives_torch_aos_numbers_within_one_step() -> None:
    ours = run(FXQUANT_BLOCK)
    oracle.load()  # skips where torch.ao is gone
    with oracle.quiet():
        theirs = run(AO_BLOCK)
        expected = theirs["converted"](ours["x"])  # type: ignore[operator]
    oracle.release()
    got = ours["converted"](ours["x"])  # type: ignore[operator]
    # the same observers saw the same data: one step of the conv-relu output, after sigmoid
    step = ours["prepared"].activation_post_process_2.calculate_qparams()[0].item()  # type: ignore[attr-defined]
    torch.testing.assert_close(got, expected, rtol=0, atol=step / 4 + 1e-6)
