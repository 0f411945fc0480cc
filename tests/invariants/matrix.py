"""The whole invariant matrix (issue 30): every zoo model x installed backend x user move,
with x86's compiled deployment on the default move; a table for docs/guide/matrix.md.

    OMP_NUM_THREADS=1 python -m tests.invariants.matrix [--models resnet,bert]
        [--backends x86,tensorrt] [--moves default,strict] [--no-compiled]
        [--out docs/guide/matrix.md] [--render]

``nox -s matrix`` runs it. Each cell's outcome is appended to bench/results/matrix.jsonl as
it ends: a killed run started again goes on with the cells not in the file (``--fresh``
reruns them), and one process per backend can share the file. Then the page is rendered
from every row in the file (``--render`` alone renders it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "matrix.jsonl"
PAGE = ROOT / "docs" / "guide" / "matrix.md"
BACKENDS = ("x86", "onednn", "fbgemm", "qnnpack", "executorch", "tensorrt")

_HEAD = """# The invariant matrix

Every zoo model (`tests/zoo`) on every installed backend under eight user moves, each
checked on every output form the backend has (`convert_fx`, `convert_to_reference_fx`,
its deployment; x86's compiled deployment on the default move), against the invariants
of issue 30 (`tests/invariants/checks.py`):

- **untouched**: the caller's model, example inputs and call inputs are never modified;
- **agrees**: the lowered and deployed models agree with their reference model within one
  quantization step per quantized node, or the report names the node and why;
- **custom_cost**: a customization (a module set to None, a type given per-tensor weights)
  costs each node it does not name at most 1 dB of local SQNR;
- **refused**: nothing float runs is refused;
- **explain**: a node explain calls lowered runs in no float op, a node it calls reference
  in no kernel;
- **threads**: three threads quantizing at once give the serial result bit for bit;
- **strict**: `strict=True` raises exactly when the default run skips, naming each node;
- **state_dict**: the prepared state_dict loaded into a model calibrated on other data
  converts to the same outputs; **native**: no `backend_config` lowers to the host's
  backend, as a torch.ao script expects.

The moves: `default`, `module_none` (the last Linear or Conv set to None), `object_type`
(Linear, else Conv2d, with per-tensor weights), `no_backend_config`, `strict`, `qat`
(`prepare_qat_fx`, two SGD steps, convert), `state_dict`, `threads`. `nox -s tests` runs a
seeded slice of 24 cells (`tests/invariants/test_matrix.py`); `nox -s matrix` runs all of
them and writes this page:

```bash
nox -s matrix
OMP_NUM_THREADS=1 python -m tests.invariants.matrix --models resnet,bert --backends x86
```
"""


def _run(cells: list[Any], done: set[str]) -> list[dict[str, Any]]:
    """The cells not yet in the results file, each appended to it as it ends (a killed run
    goes on where it stopped), with its time printed."""
    from tests.invariants.checks import check

    rows: list[dict[str, Any]] = []
    for cell in cells:
        if cell.id in done:
            continue
        outcome = check(cell)
        row = {
            "cell": cell.id,
            "model": cell.model,
            "backend": cell.backend,
            "move": cell.move,
            "ok": outcome.ok,
            "broken": outcome.broken,
            "forms": outcome.forms,
            "seconds": round(outcome.seconds, 1),
            "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        }
        print(
            f"{outcome.seconds:6.1f} s {cell.id}: " + ("ok" if outcome.ok else "FAIL"), flush=True
        )
        with RESULTS.open("a") as file:  # one write per row: processes may share the file
            file.write(json.dumps(row) + "\n")
        rows.append(row)
    return rows


def load(path: Path | None = None) -> list[dict[str, Any]]:
    """The rows of the results file, the last row of each cell (a rerun replaces a row)."""
    path = path or RESULTS
    if not path.exists():
        return []
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["cell"]] = row
    return list(rows.values())


def _known(row: dict[str, Any]) -> str:
    """The finding :func:`known_break` notes for the row's cell today (not when it ran)."""
    from tests.invariants.cells import Cell, known_break

    compiled = row["cell"].endswith("-compiled")
    return known_break(Cell(row["model"], row["backend"], row["move"], compiled)) or ""


def _mark(row: dict[str, Any]) -> str:
    if row["ok"]:
        return "ok"
    names = sorted({name for name, _ in row["broken"]})
    known = "noted" if _known(row) else ""
    return ", ".join(names) + (f" ({known})" if known else "")


def _coverage(rows: list[dict[str, Any]]) -> str:
    """How much of the whole matrix the rows are: models, backends, moves."""
    from tests.invariants.cells import MOVES
    from tests.zoo.runner import ZOO

    backends = sorted({r["backend"] for r in rows})
    whole = len(ZOO) * len(BACKENDS) * len(MOVES)
    models = len({r["model"] for r in rows})
    return (
        f"The whole matrix is {whole} cells ({len(ZOO)} models x {len(BACKENDS)} backends x "
        f"{len(MOVES)} moves); this run covers {models} models on {', '.join(backends)}."
    )


def render(rows: list[dict[str, Any]]) -> str:
    """The page: the counts, a model x backend grid of moves, and every failing cell."""
    from tests.invariants.cells import MOVES

    passed = sum(r["ok"] for r in rows)
    known = sum(1 for r in rows if not r["ok"] and _known(r))
    invariants = Counter(name for r in rows for name in {n for n, _ in r["broken"]})
    lines = [_HEAD, "## The last run", ""]
    lines.append(_coverage(rows) + " ")
    lines.append(
        f"{len(rows)} cells, {passed} pass; {known} of the {len(rows) - passed} failing carry "
        "a finding noted in tests/invariants/cells.py (FINDINGS). Broken invariants (cells): "
        + (", ".join(f"{k} {v}" for k, v in invariants.most_common()) or "none")
        + "."
    )
    lines += ["", "| model | backend | " + " | ".join(MOVES) + " |"]
    lines.append("| --- | --- |" + " --- |" * len(MOVES))
    grid: dict[tuple[str, str], dict[str, str]] = {}
    for r in rows:
        grid.setdefault((r["model"], r["backend"]), {})[r["move"]] = _mark(r)
    for (model, backend), marks in grid.items():
        lines.append(
            f"| {model} | {backend} | " + " | ".join(marks.get(m, "") for m in MOVES) + " |"
        )
    lines += ["", "## Failing cells", ""]
    for r in rows:
        for name, words in r["broken"]:
            text = words.replace("|", "/").replace("\n", " ")
            lines.append(f"- `{r['cell']}` **{name}**: {text}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from tests.invariants.cells import MOVES, every
    from tests.zoo.runner import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--moves", default=",".join(MOVES))
    parser.add_argument("--no-compiled", action="store_true")
    parser.add_argument("--fresh", action="store_true", help="rerun cells already in the file")
    parser.add_argument("--out", type=Path, default=PAGE)
    parser.add_argument("--render", action="store_true", help="only the page, from the file")
    args = parser.parse_args(argv)
    import fxquant

    if args.render:
        args.out.write_text(render(load()))
        return
    backends = [b for b in args.backends.split(",") if b in fxquant.list_backends()]
    moves = args.moves.split(",")
    cells = every(args.models.split(","), backends, compiled=not args.no_compiled)
    cells = [c for c in cells if c.move in moves]
    done = set() if args.fresh else {r["cell"] for r in load()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    fresh = _run(cells, done)
    args.out.write_text(render(load()))
    print(f"{len(fresh)} cells in {time.perf_counter() - start:.0f} s; {args.out}")


if __name__ == "__main__":
    sys.path.insert(0, os.fspath(ROOT))
    main()
