"""Registry speed, after `import torch`: import cost, listing, cold assembly.

Targets (issue 3): `import fxquant` adds <= 50 ms; `list_backends()` with 100
installed entry points <= 10 ms and imports none of them; cold
`get_backend_config` of a ~200-pattern backend <= 30 ms. Each figure is the
median over fresh processes (every measurement is a first call). Prints a
table and writes bench/results/registry.json.

    python bench/bench_registry.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "registry.json"
PLUGINS = 100
PATTERNS = 200

IMPORT = """
import time, torch
start = time.perf_counter()
import {module}
print(time.perf_counter() - start)
"""

LIST = """
import sys, time, torch, fxquant, fxquant.registry as registry
registry.default_registry()  # imports the registry's modules: counted in the import rows
start = time.perf_counter()
names = registry.list_backends()
seconds = time.perf_counter() - start
imported = [m for m in sys.modules if m.startswith("bench_plugin_")]
assert len(names) >= {plugins} and not imported, (len(names), imported)
print(seconds)
"""

ASSEMBLE = """
import time, torch, fxquant, fxquant.registry as registry
import fxquant.config.backend  # the plugin's own imports are not the registry's cost
registry.list_backends()  # metadata scanned: measure the assembly
start = time.perf_counter()
config = registry.get_backend_config("{backend}")
seconds = time.perf_counter() - start
assert len(config.configs) >= {patterns}, len(config.configs)
print(seconds)
"""

BIG_PLUGIN = """
import torch
import fxquant.registry
from fxquant.config.backend import BackendPatternConfig, DTypeConfig

INT8 = DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)

@fxquant.registry.hookimpl
def fxquant_pattern_configs(backend):
    if backend != "big":
        return None
    return [BackendPatternConfig(f"op{{i}}").add_dtype_config(INT8) for i in range({patterns})]
"""


def write_dist(site: Path, name: str, backend: str, module: str) -> None:
    """A bare .dist-info (METADATA + entry_points.txt): what pip leaves behind."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    info.joinpath("entry_points.txt").write_text(f"[fxquant.backends]\n{backend} = {module}\n")


def make_site(root: Path) -> Path:
    site = root / "site"
    site.mkdir()
    for i in range(PLUGINS):
        # the modules do not exist: importing one would fail the listing check
        write_dist(site, f"bench-plugin-{i:03d}", f"bench{i:03d}", f"bench_plugin_{i:03d}")
    write_dist(site, "bench-big", "big", "bench_big_plugin")
    site.joinpath("bench_big_plugin.py").write_text(
        textwrap.dedent(BIG_PLUGIN.format(patterns=PATTERNS))
    )
    return site


def median_seconds(script: str, runs: int, pythonpath: Path | None = None) -> float:
    env = None
    if pythonpath is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    samples = []
    for _ in range(runs):
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
        )
        if result.returncode != 0:
            raise SystemExit(result.stderr)
        samples.append(float(result.stdout.strip().splitlines()[-1]))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per figure (>= 5)")
    # every bench script takes --quick (nox -s bench -- --quick passes it to all of them);
    # this one is quick already, so it only drops to the fewest runs a median needs
    parser.add_argument("--quick", action="store_true", help="5 runs per figure")
    args = parser.parse_args()
    runs = 5 if args.quick else max(5, args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        site = make_site(Path(tmp))
        rows = [
            ("import fxquant (after torch)", IMPORT.format(module="fxquant"), None, 0.050),
            (
                "import fxquant.registry (after torch)",
                IMPORT.format(module="fxquant.registry"),
                None,
                0.050,
            ),
            (
                "import fxquant.registry.manager (first use)",
                IMPORT.format(module="fxquant.registry.manager"),
                None,
                None,
            ),
            (
                f"list_backends() with {PLUGINS} entry points",
                LIST.format(plugins=PLUGINS),
                site,
                0.010,
            ),
            (
                f"cold get_backend_config, {PATTERNS} patterns",
                ASSEMBLE.format(backend="big", patterns=PATTERNS),
                site,
                0.030,
            ),
            (
                "cold get_backend_config('reference')",
                ASSEMBLE.format(backend="reference", patterns=150),
                None,
                None,
            ),
        ]
        results = []
        for name, script, path, budget in rows:
            seconds = median_seconds(script, runs, path)
            ok = budget is None or seconds <= budget
            results.append(
                {
                    "name": name,
                    "median_ms": round(seconds * 1000, 2),
                    "budget_ms": None if budget is None else budget * 1000,
                    "ok": ok,
                }
            )
    width = max(len(r["name"]) for r in results)
    print(f"{'measure':<{width}}  median ms  budget ms  ok   (median of {runs} fresh processes)")
    for r in results:
        budget = "-" if r["budget_ms"] is None else f"{r['budget_ms']:.0f}"
        verdict = "yes" if r["ok"] else "NO"
        print(f"{r['name']:<{width}}  {r['median_ms']:>9.2f}  {budget:>9}  {verdict}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"runs": runs, "python": sys.version.split()[0], "results": results}, indent=2)
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
