"""The whole invariant matrix: every zoo model x installed backend x user move,
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
import re
import statistics
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
its deployment; x86's compiled deployment on the default move), against these
invariants (`tests/invariants/checks.py`):

- **untouched**: the caller's model, example inputs and call inputs are never modified;
- **agrees**: the lowered and deployed models agree with their reference model within one
  quantization step per quantized node, or the report names the node and why (a deployment
  is seen at its output only: a step there is the larger of the output's range / 255 and
  how far the float ops after the last quantized values, a head kept float, move the output
  when each of those values is one step off);
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
(`prepare_qat_fx`, two steps of torchvision's QAT recipe distilling the float model,
BatchNorm statistics frozen, convert), `state_dict`, `threads`. `object_type` gives the
type torch.ao's `default_weight_observer`, as a user copies it from torch.ao's docs
(symmetric -128..127, eps 2**-23): qnnpack and executorch, whose kernels take weights in
-127..127 with a scale of at least 2**-12, keep that type float, and explain's reason
`quant_range` names the observer arguments that fit; their cells check the rest of the
model. `nox -s tests` runs a seeded slice of 24 cells (`tests/invariants/test_matrix.py`);
`nox -s matrix` runs all of them and writes this page:

```bash
nox -s matrix
OMP_NUM_THREADS=1 python -m tests.invariants.matrix --models resnet,bert --backends x86
```

Each cell's row is appended to `bench/results/matrix.jsonl` as it ends: a run stopped and
started again goes on with the cells not in the file, and one process per backend
(`--backends executorch` beside `--backends tensorrt`) can share it; `--render` writes this
page from the file. Work the moves of one model and backend repeat is done once: the
default run (the baseline of `module_none`, `object_type` and `strict`, the serial run of
`threads`, the model `state_dict` saves), and the checks of its output forms where a move
builds the same models again (same code, state and report), which spares a deployment.
Most of a cell's time is its backend's deployment, the quantization itself a few seconds.
A torchvision ResNet-18's executorch default cell, profiled alone on an idle core (71 s,
the process's first cell): `to_edge_transform_and_lower` 47 s (XNNPACK's own passes 27 s,
each re-tracing the whole graph; the process's first lowering also builds the SDPA and
bilinear patterns XNNPACK matches), `torch.export` and the plugin's passes 11 s (most of
it the first cell's imports), the `.pte` serialization 2 s, ExecuTorch's runtime under
1 s. The checks compare only local errors (`compare(..., gains=False)`): the output
gains, one more run of the model per quantized node, took 40 of the cell's seconds on
loaded cores and no invariant reads them.
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
    """The rows of the results file, the last row of each cell (a rerun replaces its row).

    A compiled run's row (``resnet-x86-default-compiled``) and a plain run's row of the same
    model, backend and move are two cells: a later run with ``--no-compiled`` never replaces
    the compiled deployment's row (the page merges them, :func:`by_cell`).
    """
    path = path or RESULTS
    if not path.exists():
        return []
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["cell"]] = row
    return list(rows.values())


def by_cell(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model, backend and move: its compiled and plain rows merged (ok when both
    are, their broken invariants together, their seconds summed), so the tables count it once.

    Example:
        >>> row = {"cell": "a", "model": "m", "backend": "x86", "move": "default", "ok": True,
        ...        "broken": [], "seconds": 1.0}
        >>> [r["ok"] for r in by_cell([row, {**row, "cell": "a-compiled", "ok": False}])]
        [False]
    """
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        key = (row["model"], row["backend"], row["move"])
        seen = merged.get(key)
        if seen is None:
            merged[key] = row
            continue
        times = [t for t in (seen.get("seconds"), row.get("seconds")) if t is not None]
        merged[key] = {
            **seen,
            "ok": seen["ok"] and row["ok"],
            "broken": [*seen["broken"], *row["broken"]],
            "seconds": sum(times) if times else None,
        }
    return list(merged.values())


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


def _coverage(rows: list[dict[str, Any]]) -> list[str]:
    """How much of the whole matrix the rows are, per backend: cells run, passed, their time."""
    from tests.invariants.cells import MOVES
    from tests.zoo.runner import ZOO

    whole = len(ZOO) * len(BACKENDS) * len(MOVES)
    column = len(ZOO) * len(MOVES)
    cells = by_cell(rows)
    lines = [
        f"The whole matrix is {whole} cells ({len(ZOO)} models x {len(BACKENDS)} backends x "
        f"{len(MOVES)} moves); {len(cells)} were run, {sum(r['ok'] for r in cells)} pass.",
        "",
        "| backend | cells run | of | pass | fail | cell time (h) | run (UTC) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend in BACKENDS:
        mine = [r for r in rows if r["backend"] == backend]
        if not mine:
            lines.append(f"| {backend} | 0 | {column} | | | | not run |")
            continue
        counted = [r for r in cells if r["backend"] == backend]
        passed = sum(r["ok"] for r in counted)
        timed = [r["seconds"] for r in mine if r.get("seconds") is not None]
        hours = f"{sum(timed) / 3600:.1f}" if timed else "not recorded"
        when = sorted(r.get("when", "") for r in mine)
        span = when[0] if when[0] == when[-1] else f"{when[0]} to {when[-1]}"
        lines.append(
            f"| {backend} | {len(counted)} | {column} | {passed} | {len(counted) - passed} "
            f"| {hours} | {span} |"
        )
    return [*lines, "", _compiled(rows)]


def _compiled(rows: list[dict[str, Any]]) -> str:
    """How many x86 default cells checked the compiled deployment (the table above merges
    their row with the plain run's, :func:`by_cell`, and counts each cell once)."""
    from tests.zoo.runner import ZOO

    compiled = [r for r in rows if r["cell"].endswith("-compiled")]
    passed = sum(r["ok"] for r in compiled)
    timed = [r["seconds"] for r in compiled if r.get("seconds") is not None]
    took = f", {statistics.median(timed):.0f} s a cell (median)" if timed else ""
    return (
        f"x86's compiled deployment (torch.compile, inductor) on the default move: "
        f"{len(compiled)} of {len(ZOO)} cells run with it, {passed} pass{took}"
        + ("." if compiled else " (every run passed `--no-compiled`).")
    )


_NODE_STEPS = re.compile(r"^(?P<form>[\w ()]+): \S+ \((?P<what>[^)]*)\) is [\d.]+ steps")


def _cause(invariant: str, words: str) -> str:
    """What a failure is, without the node, the numbers or the paths that vary by cell: the
    key failing cells are grouped under."""
    found = _NODE_STEPS.match(words)
    if found:
        return f"{invariant}: {found['form']}: {found['what']}"
    return f"{invariant}: " + re.sub(r"'[^']*'|\([^)]*\)|/\S+|\d+(\.\d+)?", "_", words)


def _failing(rows: list[dict[str, Any]]) -> list[str]:
    """Every failing cell once under each cause it shows, with the words it printed."""
    groups: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        for name, words in r["broken"]:
            text = words.replace("|", "/").replace("\n", " ")
            cell = f"`{r['cell']}`" + (" (noted in FINDINGS)" if _known(r) else "")
            groups.setdefault(_cause(name, words), {}).setdefault(cell, []).append(text)
    lines = ["## Failing cells, by cause", ""]
    for cause, cells in sorted(groups.items(), key=lambda item: -len(item[1])):
        first = next(iter(cells.values()))[0]
        name = first if len(first) < 200 else first[:200] + "..."
        invariant = cause.split(":")[0]
        lines += [f"### {len(cells)} cell(s), {invariant}: {name}", ""]
        lines += [f"- {cell}: " + "; ".join(words) for cell, words in cells.items()]
        lines.append("")
    return lines


def render(rows: list[dict[str, Any]]) -> str:
    """The page: the counts per backend, a model x backend grid of moves, and every failing
    cell grouped by cause."""
    from tests.invariants.cells import MOVES
    from tests.zoo.runner import ZOO

    cells = by_cell(rows)
    known = sum(1 for r in cells if not r["ok"] and _known(r))
    invariants = Counter(name for r in cells for name in {n for n, _ in r["broken"]})
    lines = [_HEAD, "## The last run", "", *_coverage(rows), ""]
    lines.append(
        f"{known} of the {len(cells) - sum(r['ok'] for r in cells)} failing cells carry a finding "
        "noted in tests/invariants/cells.py (FINDINGS). Broken invariants (cells): "
        + (", ".join(f"{k} {v}" for k, v in invariants.most_common()) or "none")
        + "."
    )
    lines += ["", "| model | backend | " + " | ".join(MOVES) + " |"]
    lines.append("| --- | --- |" + " --- |" * len(MOVES))
    grid: dict[tuple[str, str], dict[str, str]] = {}
    order = {name: index for index, name in enumerate(ZOO)}
    for r in sorted(cells, key=lambda r: (BACKENDS.index(r["backend"]), order.get(r["model"], 0))):
        grid.setdefault((r["model"], r["backend"]), {})[r["move"]] = _mark(r)
    for (model, backend), marks in grid.items():
        lines.append(
            f"| {model} | {backend} | " + " | ".join(marks.get(m, "") for m in MOVES) + " |"
        )
    return "\n".join([*lines, "", *_failing(rows)])


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
