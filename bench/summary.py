"""One summary of the benchmarks: fxquant against torch.ao across backends and models.

Reads what the benchmarks wrote under bench/results/ and prints one table, every
row a target of issues 5 and 12 (or a figure for reference, target "-"):

    lowered    bench_backends.py: int8 latency per call, fxquant and torch.ao on the
               same engine, "ao/fxq" the speedup (above 1: fxquant faster), SQNR
               of each against the float model (dB)
    compiled   bench_compiled_x86.py: x86's compiled deployment against torchao pt2e +
               torch.compile (freezing), latency and cold compile; the "torch.ao"
               columns hold pt2e's figures
    flow       bench_flow_backends.py: prepare_fx and convert_fx seconds with each
               backend's own default mapping and config against torch.ao's
               same-named backend; bench_flow.py's reference/native rows too,
               labelled as such

Lowered rows come from backends.json, then every other non-quick
backends_*.json in the order they were written (a later run of a row wins:
filtered reruns, see ``--output`` of bench_backends.py). Writes
bench/results/summary.json and, when matplotlib is installed (the ``bench``
extra), the plot docs/img/benchmarks.png.

    python bench/summary.py [--no-plot] [--markdown x86]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PLOT = Path(__file__).resolve().parents[1] / "docs" / "img" / "benchmarks.png"


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def lowered_rows() -> list[dict[str, Any]]:
    """bench_backends.py's rows, a later file's row replacing an earlier one of the same key."""
    files = sorted(
        (p for p in RESULTS.glob("backends_*.json") if "quick" not in p.name),
        key=lambda p: p.stat().st_mtime,
    )
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for path in [RESULTS / "backends.json", *files]:
        payload = _load(path)
        for row in (payload or {}).get("results", []):
            rows[(row["backend"], row["model"])] = {**row, "source": path.name}
    out = []
    for row in rows.values():
        ratio = row.get("fxq_over_ao")
        out.append(
            {
                "area": "lowered",
                "backend": row["backend"],
                "model": row["model"],
                "metric": "latency ms",
                "fxquant": row.get("fxquant_ms"),
                "torch_ao": row.get("torch_ao_ms"),
                "speedup": None if not ratio else round(1 / ratio, 3),
                "sqnr_fxquant": row.get("sqnr_fxquant"),
                "sqnr_torch_ao": row.get("sqnr_torch_ao"),
                "target": row.get("target", "-"),
                "ok": row.get("ok"),
                "error": "; ".join(f"{k}: {v}" for k, v in row.get("errors", {}).items()),
                "source": row["source"],
            }
        )
    return out


def flow_rows() -> list[dict[str, Any]]:
    """bench_flow_backends.py's rows (each backend's defaults), then bench_flow.py's."""
    out = []
    payload = _load(RESULTS / "flow_backends.json") or {}
    for row in payload.get("results", []):
        for step in ("prepare_fx", "convert_fx"):
            figures = row.get(step, {})
            depth = row["model"].startswith("resnet50_x")
            out.append(
                {
                    "area": "flow",
                    "backend": row["backend"],
                    "model": row["model"],
                    "metric": f"{step} s",
                    "fxquant": figures.get("fxquant_s"),
                    "torch_ao": figures.get("torch_ao_s"),
                    "speedup": figures.get("speedup"),
                    "target": "-" if depth else ">= 2x",
                    "ok": None if depth or not figures else figures["speedup"] >= 2.0,
                    "error": row.get("error", ""),
                    "source": "flow_backends.json",
                }
            )
    for backend, fit in payload.get("linearity", {}).items():
        for step in ("prepare_fx", "convert_fx"):
            k = fit.get(f"{step} fxquant")
            out.append(
                {
                    "area": "flow",
                    "backend": backend,
                    "model": "resnet50 x1/x2/x4",
                    "metric": f"{step} ~ nodes^k",
                    "fxquant": k,
                    "torch_ao": fit.get(f"{step} torch.ao"),
                    "speedup": None,
                    "target": "k <= 1.1 (linear)",
                    "ok": k is not None and k <= 1.1,
                    "error": "",
                    "source": "flow_backends.json",
                }
            )
    reference = _load(RESULTS / "flow.json") or {}
    for row in reference.get("results", []):
        out.append(
            {
                "area": "flow",
                "backend": "reference/native",
                "model": row["model"],
                "metric": row["metric"],
                "fxquant": row.get("fxquant"),
                "torch_ao": row.get("torch_ao"),
                "speedup": row.get("speedup"),
                "target": row.get("target") or "-",
                "ok": row.get("ok"),
                "error": row.get("error", ""),
                "source": "flow.json",
            }
        )
    return out


def compiled_rows() -> list[dict[str, Any]]:
    """bench_compiled_x86.py's rows (#19): fxquant compiled against pt2e + torch.compile.

    The "torch.ao" columns hold pt2e's figures here (X86InductorQuantizer, torch.compile
    with freezing); a latency row is met when latency and SQNR are, a compile row when
    fxquant's cold compile is at most pt2e's.
    """
    out = []
    # the full run, then reduced ones (--quick, or filtered with --output compiled_x86_*.json),
    # their sizes in the model's name
    files = sorted(RESULTS.glob("compiled_x86*.json"), key=lambda p: p.stat().st_mtime)
    for path in files:
        out.extend(_compiled_file_rows(path))
    return out


def _compiled_file_rows(path: Path) -> list[dict[str, Any]]:
    payload = _load(path) or {}
    quick = " quick" if payload.get("machine", {}).get("quick") else ""
    out = []
    for row in payload.get("results", []):
        error = "; ".join(f"{k}: {v}" for k, v in row.get("errors", {}).items())
        base = {"area": "compiled", "backend": "x86 vs pt2e", "error": error}
        model = f"{row['model']}{quick} b{row['batch']}"
        ratio = row.get("fxq_over_pt2e")
        compile_fxq, compile_pt2e = row.get("compile_s_fxquant"), row.get("compile_s_pt2e")
        out.append(
            {
                **base,
                "model": model,
                "metric": "latency ms",
                "fxquant": row.get("fxquant_ms"),
                "torch_ao": row.get("pt2e_ms"),
                "speedup": None if not ratio else round(1 / ratio, 3),
                "sqnr_fxquant": row.get("sqnr_fxquant"),
                "sqnr_torch_ao": row.get("sqnr_pt2e"),
                "target": f"fxq/pt2e <= {row['target']}, dB >=",
                # latency and SQNR; the cold compile has its own row
                "ok": None
                if not ratio
                else ratio <= row["target"] and row["sqnr_fxquant"] >= row["sqnr_pt2e"],
                "source": path.name,
            }
        )
        out.append(
            {
                **base,
                "model": model,
                "metric": "cold compile s",
                "fxquant": compile_fxq,
                "torch_ao": compile_pt2e,
                "speedup": round(compile_pt2e / compile_fxq, 3)
                if compile_fxq and compile_pt2e
                else None,
                "target": "fxq <= pt2e",
                "ok": None if not compile_fxq or not compile_pt2e else compile_fxq <= compile_pt2e,
                "source": path.name,
            }
        )
    return out


def minilm_rows() -> list[dict[str, Any]]:
    """bench_compiled_minilm.py's rows (#19): the real all-MiniLM-L6-v2 compiled int8 against
    pt2e compiled and fp32 ``torch.compile``, each with fxquant's cosine to float (met: at
    least issue 23's 0.99; the latency rows are reported, the issue sets no bar for them)."""
    out = []
    for path in sorted(RESULTS.glob("compiled_minilm*.json"), key=lambda p: p.stat().st_mtime):
        payload = _load(path) or {}
        for row in payload.get("results", []):
            error = "; ".join(f"{k}: {v}" for k, v in row.get("errors", {}).items())
            cosine = row.get("cosine_fxquant")
            for other in ("pt2e", "fp32"):
                ratio = row.get(f"fxq_over_{other}")
                out.append(
                    {
                        "area": "compiled",
                        "backend": f"x86 vs {other}",
                        "error": error,
                        "model": f"MiniLM b{row['batch']}",
                        "metric": f"latency ms, cosine {cosine}",
                        "fxquant": row.get(f"fxquant_ms_vs_{other}"),
                        "torch_ao": row.get(f"{other}_ms"),
                        "speedup": None if not ratio else round(1 / ratio, 3),
                        "sqnr_fxquant": None,
                        "sqnr_torch_ao": None,
                        "target": "cosine >= 0.99",
                        "ok": None if cosine is None else cosine >= 0.99,
                        "source": path.name,
                    }
                )
    return out


def _cell(value: Any, spec: str, width: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{'-':>{width}}"
    return f"{value:>{width}{spec}}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print("# fxquant vs torch.ao (ao/fxq > 1: fxquant faster); 1 thread, interleaved rounds")
    print(
        f"{'area':<8} {'backend':<16} {'model':<20} {'metric':<30} {'fxquant':>9} "
        f"{'torch.ao':>9} {'ao/fxq':>7} {'dB fxq':>6} {'dB ao':>6}  {'target':<23} met"
    )
    for r in rows:
        head = f"{r['area']:<8} {r['backend']:<16} {r['model']:<20} {r['metric']:<30}"
        if r["fxquant"] is None and r["error"]:
            print(f"{head} FAILED: {r['error'][:90]}")
            continue
        met = {True: "yes", False: "NO", None: "-"}[r["ok"]]
        print(
            f"{head} {_cell(r['fxquant'], '.3f', 9)} {_cell(r['torch_ao'], '.3f', 9)} "
            f"{_cell(r['speedup'], '.2f', 7)} {_cell(r.get('sqnr_fxquant'), '.1f', 6)} "
            f"{_cell(r.get('sqnr_torch_ao'), '.1f', 6)}  {r['target']:<23} {met}"
        )


def plot(rows: list[dict[str, Any]], path: Path) -> str:
    """Bars of torch.ao / fxquant per row (lowered latency; flow steps), 1.0 and targets marked.

    Returns the line to print: where the plot went, or why there is none.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e '.[bench]')"
    lowered = [r for r in rows if r["area"] == "lowered" and r["speedup"]]
    flow = [
        r
        for r in rows
        if r["area"] == "flow" and r["speedup"] and r["source"] == "flow_backends.json"
    ]
    compiled = [r for r in rows if r["area"] == "compiled" and r["speedup"]]
    panels = [(lowered, "int8 latency: torch.ao / fxquant (> 1: fxquant faster)")]
    panels.append((flow, "flow on each backend's defaults: torch.ao / fxquant"))
    panels.append((compiled, "x86 compiled (#19): pt2e + torch.compile / fxquant"))
    panels = [(p, t) for p, t in panels if p]
    if not panels:
        return "no plot: no full-run results to draw (--quick runs are not summarised)"
    height = max(len(p) for p, _ in panels) * 0.28 + 1.5
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), height), squeeze=False)
    for ax, (data, title) in zip(axes[0], panels, strict=True):
        labels = [_label(r) for r in data]
        values = [r["speedup"] for r in data]
        colors = [{True: "#2a9d8f", False: "#e76f51", None: "#8d99ae"}[r["ok"]] for r in data]
        ax.barh(range(len(data)), values, color=colors)
        ax.set_yticks(range(len(data)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", linewidth=0.8)
        for index, r in enumerate(data):
            sqnr = r.get("sqnr_fxquant")
            note = f"{r['speedup']:.2f}x" + (f"  {sqnr:.0f} dB" if sqnr is not None else "")
            ax.text(r["speedup"], index, " " + note, va="center", fontsize=6)
        if max(values) / min(values) > 10:  # flow speedups span 1x to 50x: a log axis
            ax.set_xscale("log")
            ax.set_xlim(min(values) / 1.5, max(values) * 3)
            ticks = [t for t in (1, 2, 5, 10, 20, 50) if t <= max(values) * 3]
            ax.set_xticks(ticks, [f"{t}x" for t in ticks])
            ax.axvline(2.0, color="black", linewidth=0.6, linestyle="--")  # the flow target
        else:
            ax.set_xlim(0, max(values) * 1.25)
        ax.set_title(title, fontsize=9)
    fig.text(
        0.01, 0.005, "green: target met, red: missed, grey: no target; dB: fxquant's SQNR",
        fontsize=7,
    )  # fmt: skip
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def _label(row: dict[str, Any]) -> str:
    metric = "" if row["area"] == "lowered" else " " + row["metric"].split()[0]
    return f"{row['backend']} {row['model']}{metric}"


def markdown(rows: list[dict[str, Any]], backend: str) -> None:
    """The rows of ``backend`` as a Markdown table (the plugins' READMEs quote it)."""
    print(
        "| area | model | metric | fxquant | torch.ao | torch.ao / fxquant "
        "| SQNR fxquant / torch.ao | target | met |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r["backend"] != backend:
            continue
        if r["fxquant"] is None and r["error"]:
            print(f"| {r['area']} | {r['model']} | {r['metric']} | FAILED: {r['error'][:80]} |||||")
            continue
        sqnr = (
            f"{r['sqnr_fxquant']:.1f} / {r['sqnr_torch_ao']:.1f} dB"
            if r.get("sqnr_fxquant") is not None and r.get("sqnr_torch_ao") is not None
            else "-"
        )
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        met = {True: "yes", False: "**no**", None: "-"}[r["ok"]]
        print(
            f"| {r['area']} | {r['model']} | {r['metric']} | {r['fxquant']} | {r['torch_ao']} "
            f"| {speedup} | {sqnr} | {r['target']} | {met} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-plot", action="store_true", help="table and JSON only")
    parser.add_argument("--markdown", metavar="BACKEND", help="print BACKEND's rows as Markdown")
    args = parser.parse_args()
    rows = lowered_rows() + flow_rows() + compiled_rows() + minilm_rows()
    if args.markdown:
        markdown(rows, args.markdown)
        return
    print_table(rows)
    path = RESULTS / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"results": rows}, indent=2) + "\n")
    print(f"wrote {path}")
    if not args.no_plot:
        print(plot(rows, PLOT))


if __name__ == "__main__":
    main()
