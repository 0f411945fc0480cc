"""The zoo (issue 20): every architecture of ``tests/zoo`` on every backend, with torch.ao's
SQNR on the same recipe next to fxquant's on the CPU backends.

Each model runs in a child process (one per model, all its backends, with a time limit), so
a crash or a hang in a toolchain costs one model's row, not the run; results are written
after each model to bench/results/zoo.json, then rendered as bench/results/zoo.md (the
table the guide's page docs/guide/zoo.md holds) and docs/img/zoo.png (a grid of the SQNRs
in the colours of bench/summary.py's plot). The recipe is ``tests/zoo/runner.py``'s.

    OMP_NUM_THREADS=1 python bench/zoo.py [--models resnet,bert] [--backends x86,executorch]
                                          [--no-oracle] [--timeout 1200] [--render]

``--render`` redraws the table and the plot from zoo.json without running anything;
``--models``/``--backends`` update those rows of an existing zoo.json and keep the others.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
JSON = RESULTS / "zoo.json"
MARKDOWN = RESULTS / "zoo.md"
PLOT = ROOT / "docs" / "img" / "zoo.png"
GUIDE = ROOT / "docs" / "guide" / "zoo.md"
TOLERANCE_DB = 0.5  # fxquant's SQNR at least torch.ao's minus this, on the CPU backends
ONE_BATCH = "SQNR on one held-out batch (seed 99)"  # the scoring of rows from before #20's fix
sys.path.insert(0, os.fspath(ROOT))


def child(model: str, backends: list[str], oracle: bool) -> None:
    """Run one model on ``backends``; print one JSON line per result as it comes."""
    from tests.zoo.runner import run

    for backend in backends:
        result = run(model, backend, oracle=oracle)
        print("ZOO " + json.dumps(result.record()), flush=True)


def _results_of(output: str) -> list[dict[str, Any]]:
    return [json.loads(line[4:]) for line in output.splitlines() if line.startswith("ZOO ")]


def run_model(
    model: str, backends: list[str], oracle: bool, timeout: float
) -> list[dict[str, Any]]:
    """One child process for ``model``: its results, and a row per backend it never reached."""
    command = [sys.executable, __file__, "--child", model, "--backends", ",".join(backends)]
    if not oracle:
        command.append("--no-oracle")
    reason = ""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        output = done.stdout
        if done.returncode:
            reason = f"the process died (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired as expired:
        raw = expired.stdout or b""
        output = raw.decode() if isinstance(raw, bytes) else raw
        reason = f"no result within the run's {timeout:.0f} s limit"
    results = _results_of(output)
    reached = {r["backend"] for r in results}
    for backend in backends:
        if backend not in reached:
            results.append(
                {"model": model, "backend": backend, "ok": False, "reason": reason, "clear": False}
            )
    return results


# --- the table and the plot --------------------------------------------------------------------


def verdict(row: dict[str, Any]) -> str:
    """``ok``, ``below torch.ao`` or ``failed`` for one result."""
    if not row.get("ok"):
        return "failed"
    ao = row.get("ao_sqnr")
    if ao is not None and math.isfinite(ao) and row["sqnr"] < ao - TOLERANCE_DB:
        return "below torch.ao"
    return "ok"


def _db(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.1f}"


def scoring(row: dict[str, Any]) -> str:
    """How ``row``'s SQNRs were computed (rows written before it was recorded: one batch)."""
    return str(row.get("scoring") or ONE_BATCH)


def _cell(row: dict[str, Any] | None, current: str) -> str:
    if row is None:
        return "not run"
    older = " †" if scoring(row) != current else ""  # scored another way: said under the table
    if not row.get("ok"):
        return "**fail**" + older
    text = _db(row.get("sqnr"))
    if row.get("ao_sqnr") is not None or row.get("ao_reason"):
        ao = _db(row.get("ao_sqnr")) if row.get("ao_sqnr") is not None else "fail"
        ao = "all float" if ao == "inf" else ao  # torch.ao quantized nothing
        text += f" ({ao})"
    return text + (" ⚠" if verdict(row) == "below torch.ao" else "") + older


def markdown(rows: list[dict[str, Any]]) -> str:
    """The grid (SQNR, torch.ao's in brackets) and one line per failure and per gap.

    The header names the scoring; a cell scored another way (a row from an older run) is
    marked with † and the line under the table says how it was scored, never mixed silently.
    """
    from tests.zoo.runner import BACKENDS, SCORING, ZOO

    by = {(r["model"], r["backend"]): r for r in rows}
    models = list(ZOO)  # every model: the ones not run show as such
    older = sorted({scoring(r) for r in rows} - {SCORING})
    lines = [
        f"SQNR vs float in dB, {SCORING}; torch.ao's on the same batches in brackets.",
        "",
        "| model | what | " + " | ".join(BACKENDS) + " |",
        "|---|---|" + "---|" * len(BACKENDS),
    ]
    for name in models:
        cells = [_cell(by.get((name, b)), SCORING) for b in BACKENDS]
        lines.append(f"| {name} | {ZOO[name].what} | " + " | ".join(cells) + " |")
    if older:
        marked = sum(scoring(r) != SCORING for r in rows)
        lines += ["", f"† {marked} cells from an older run, scored otherwise: {'; '.join(older)}."]
    failures = [r for r in rows if not r.get("ok")]
    gaps = [r for r in rows if verdict(r) == "below torch.ao"]
    ao_failures = [r for r in rows if r.get("ao_reason")]
    ok = sum(bool(r.get("ok")) for r in rows)
    lines += ["", f"{ok} of {len(rows)} model x backend runs succeed end to end."]
    if failures:
        lines += [
            "",
            "Failures (the error fxquant raises; *not an fxquant error* marks the others):",
            "",
        ]
        for r in failures:
            mark = "" if r.get("clear") else " *not an fxquant error*"
            lines.append(f"- {r['model']} on {r['backend']}:{mark} {_escape(r.get('reason', ''))}")
    if gaps:
        lines += ["", f"Below torch.ao by more than {TOLERANCE_DB} dB:", ""]
        for r in gaps:
            sqnrs = f"{_db(r['sqnr'])} dB, torch.ao {_db(r['ao_sqnr'])} dB"
            lines.append(f"- {r['model']} on {r['backend']}: {sqnrs}")
    if ao_failures:
        lines += ["", "torch.ao's failures on the same recipe:", ""]
        for r in ao_failures:
            lines.append(f"- {r['model']} on {r['backend']}: {_escape(r['ao_reason'][:200])}")
    return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def plot(rows: list[dict[str, Any]], path: Path) -> str:
    """A model x backend grid: fxquant's SQNR in each cell, coloured as bench/summary.py's bars
    (green: ok and at least torch.ao's minus 0.5 dB, red: failed or below, grey: not run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e '.[bench]')"
    from tests.zoo.runner import BACKENDS, ZOO

    by = {(r["model"], r["backend"]): r for r in rows}
    models = list(ZOO)  # every model: the ones not run show as such
    colours = {"ok": "#2a9d8f", "below torch.ao": "#e9c46a", "failed": "#e76f51", None: "#8d99ae"}
    fig, ax = plt.subplots(figsize=(1.3 * len(BACKENDS) + 2.5, 0.3 * len(models) + 1.3))
    for y, name in enumerate(models):
        for x, backend in enumerate(BACKENDS):
            row = by.get((name, backend))
            state = verdict(row) if row else None
            ax.add_patch(plt.Rectangle((x, y), 0.96, 0.92, color=colours[state]))
            text = "fail" if state == "failed" else ("" if row is None else _db(row.get("sqnr")))
            ao = row.get("ao_sqnr") if row else None
            if ao is not None and state != "failed":
                text += " (float)" if math.isinf(ao) else f" ({_db(ao)})"
            ax.text(x + 0.48, y + 0.46, text, ha="center", va="center", fontsize=6)
    ax.set_xlim(0, len(BACKENDS))
    ax.set_ylim(len(models), 0)
    ax.set_xticks([x + 0.48 for x in range(len(BACKENDS))], BACKENDS, fontsize=7)
    ax.set_yticks([y + 0.46 for y in range(len(models))], models, fontsize=7)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(
        "zoo: SQNR vs float in dB, pooled over 8 held-out batches (torch.ao's, same batches)",
        fontsize=9,
    )
    fig.text(
        0.01, 0.005,
        "green: ok, yellow: > 0.5 dB below torch.ao, red: failed, grey: not run",
        fontsize=7,
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def render(rows: list[dict[str, Any]]) -> None:
    """zoo.md, the plot, and the table in docs/guide/zoo.md (between its markers)."""
    MARKDOWN.write_text(markdown(rows))
    start, end = "<!-- zoo-table -->\n", "<!-- /zoo-table -->"
    page = GUIDE.read_text()
    if start in page and end in page:
        head, rest = page.split(start, 1)
        GUIDE.write_text(
            head + start + "\n" + MARKDOWN.read_text() + "\n" + end + rest.split(end, 1)[1]
        )
    print(MARKDOWN.read_text())
    print(plot(rows, PLOT))


def _load() -> list[dict[str, Any]]:
    """zoo.json's rows, and those of any parts (zoo-NAME.json, from ``--out``) over them."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for path in [JSON, *sorted(RESULTS.glob("zoo-*.json"))]:
        if path.exists():
            rows.update(
                {(r["model"], r["backend"]): r for r in json.loads(path.read_text())["results"]}
            )
    return _sorted(list(rows.values()))


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from tests.zoo.runner import BACKENDS, ZOO

    order = {name: i for i, name in enumerate(ZOO)}
    return sorted(rows, key=lambda r: (order.get(r["model"], 99), BACKENDS.index(r["backend"])))


def _save(rows: list[dict[str, Any]], started: float, path: Path = JSON) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, os.fspath(ROOT / "bench"))
    import harness

    record = {
        "machine": harness.machine(["torch", "transformers", "executorch", "onnxruntime"]),
        "seconds": time.perf_counter() - started,
        "results": rows,
    }
    path.write_text(json.dumps(record, indent=1, default=str))


def main() -> None:
    from tests.zoo.runner import BACKENDS, ZOO

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--no-oracle", action="store_true", help="skip torch.ao's runs")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per model")
    parser.add_argument("--render", action="store_true", help="redraw from zoo.json only")
    parser.add_argument(
        "--out", help="write the rows of this run to bench/results/zoo-OUT.json (a part)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="accepted (nox -s bench passes it)")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if args.child:
        child(args.child, backends, not args.no_oracle)
        return
    if args.render:
        render(_load())
        return
    unknown = [m for m in args.models.split(",") if m not in ZOO]
    if unknown:
        parser.error(f"unknown models {unknown}; the zoo has: {', '.join(ZOO)}")
    started = time.perf_counter()
    path = RESULTS / f"zoo-{args.out}.json" if args.out else JSON
    rows = [] if args.out else _load()
    for model in args.models.split(","):
        fresh = run_model(model, backends, not args.no_oracle, args.timeout)
        keys = {(r["model"], r["backend"]) for r in fresh}
        rows = _sorted([r for r in rows if (r["model"], r["backend"]) not in keys] + fresh)
        _save(rows, started, path)
        sys.stdout.flush()
        for r in fresh:
            state = verdict(r)
            figures = f"{_db(r.get('sqnr')):>6} (torch.ao {_db(r.get('ao_sqnr'))})"
            print(f"{model:24} {r['backend']:11} {state:15} {figures} {r.get('reason', '')[:120]}")
    render(_load())


if __name__ == "__main__":
    main()
