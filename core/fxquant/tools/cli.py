"""The ``fxquant`` command: ``backends``, ``show NAME``, ``demo``, ``check NAME``, ``new-backend``.

argparse only (the core depends on torch, pluggy and importlib-metadata).

Every subcommand reads the registry and renders plain data (``--json``
dumps the same data), so a broken plugin shows up as a status line instead
of a traceback. Tables are Markdown, so a plugin's README can embed the
output of ``fxquant show NAME --width 0`` as it is; by default its long cells wrap
to the terminal's width (continuation rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from fxquant.errors import PluginError, UnknownBackendError
from fxquant.registry import default_registry
from fxquant.registry.install import install_hint
from fxquant.tools.describe import describe
from fxquant.tools.scaffold import new_backend
from fxquant.tools.tables import markdown_table, output_width
from fxquant.version import VERSION

__all__ = ["main", "markdown_table", "render_backends", "render_show"]

_EPILOG = """\
examples:
  fxquant backends              list installed backends and their plugins
  fxquant backends --json       the same, as JSON
  fxquant show reference        the pattern table of the built-in backend
  fxquant show x86 --json       one backend's patterns, as JSON
  fxquant demo                  quantize a model with every installed backend
  fxquant demo --backends x86   the same with the backends named
  fxquant demo --json           the demo's results as JSON (progress on stderr)
  fxquant check x86             does the x86 backend keep the plugin contract?
  fxquant new-backend mine      a plugin skeleton in ./fxquant-mine that passes check

environment:
  FXQUANT_DISABLE_PLUGIN_AUTOLOAD=1   load no installed plugin (built-ins stay)
  FXQUANT_PLUGINS=a,b                 load only these distributions
  FXQUANT_DISABLE_PLUGINS=a,b         skip these distributions
  FXQUANT_PROGRESS=0|1                progress on stderr (demo, check): never / always;
                                      unset: only when stderr is a terminal (a bar with
                                      tqdm installed, else a few plain lines)
"""


def _backends_data() -> list[dict[str, Any]]:

    data = []
    for report in default_registry().reports():
        plugins = [
            {
                "distribution": p.distribution,
                "version": p.version,
                "entry_point": p.entry_point,
                "status": p.status,
                "reason": p.reason,
                "import_ms": round(p.import_seconds * 1000, 2),
                "builtin": p.builtin,
            }
            for p in report.plugins
        ]
        data.append(
            {
                "name": report.name,
                "status": report.status,
                "reason": report.reason,
                "pattern_count": report.pattern_count,
                "kernel_count": report.kernel_count,
                "plugins": plugins,
            }
        )
    return data


def render_backends(data: list[dict[str, Any]]) -> str:
    """The text of ``fxquant backends``: one table row per backend, then the reasons.

    Example:
        >>> print(render_backends([]))  # doctest: +ELLIPSIS
        no backends installed; to install one: pip install ...
    """
    if not data:
        return f"no backends installed; {install_hint()}"
    rows = []
    notes = []
    for backend in data:
        plugins = ", ".join(
            f"{p['distribution']} {p['version']}".strip() for p in backend["plugins"]
        )
        import_ms = sum(p["import_ms"] for p in backend["plugins"])
        ok = backend["status"] == "ok"
        counts = [str(backend["pattern_count"]), str(backend["kernel_count"])] if ok else ["-", "-"]
        rows.append([backend["name"], backend["status"], *counts, plugins, f"{import_ms:.1f} ms"])
        if backend["reason"]:
            notes.append(f"{backend['name']}: {backend['status']}: {backend['reason']}")
        notes += [
            f"{backend['name']}: {p['distribution']} {p['version']} is {p['status']}: {p['reason']}"
            for p in backend["plugins"]
            if p["status"] not in ("ok", backend["status"])
        ]
    header = ["backend", "status", "patterns", "kernels", "plugins", "import"]
    return "\n".join([markdown_table(header, rows), *notes])


def render_show(data: dict[str, Any], width: int | None = None) -> str:
    """The text of ``fxquant show NAME``: the summary table, then every pattern config.

    ``width``: the widest a line may be (long cells wrap); ``None``: as wide as the content.

    Example:
        >>> from fxquant.registry import default_registry
        >>> from fxquant.tools.describe import describe
        >>> text = render_show(describe(default_registry().assembled("reference")))
    """
    summary = data["summary"]
    name = data["name"]
    plugins = ", ".join(f"{p['source']} {p['version']}".strip() for p in data["plugins"])
    rows = [
        ["Quantization Scheme", summary["quantization_scheme"]],
        ["Data Type", summary["data_type"]],
        [
            "Quantized and Fused Operators and Mapping",
            ", ".join(summary["reference_module_mapping"]),
        ],
        ["Fused Module Mapping", ", ".join(summary["fused_module_mapping"])],
        ["QAT Module Mapping", ", ".join(summary["qat_module_mapping"])],
        ["Runs On", data.get("deployment") or "PyTorch (the model convert_fx returns)"],
    ]
    patterns = [
        [
            p["pattern"],
            p["observation_type"],
            " / ".join(p["dtype_configs"]),
            p["fused_module"],
            p["qat_module"],
            p["reference_quantized_module"],
            p["lowering_kernel"],
            p["source"],
            f"overrides {', '.join(p['overrides'])}" if p["overrides"] else "",
        ]
        for p in data["patterns"]
    ]
    header = [
        "pattern",
        "observation type",
        "dtypes",
        "fused",
        "QAT",
        "reference",
        "kernel",
        "from",
        "overridden",
    ]
    return "\n".join(
        [
            f"backend {name!r} ({len(data['patterns'])} patterns, "
            f"{len(data['lowering_kernels'])} lowering kernels; plugins: {plugins})",
            "",
            markdown_table(["", name], rows, width),
            "",
            markdown_table(header, patterns, width),
        ]
    )


def _emit(data: Any, text: str, as_json: bool, out: TextIO) -> None:
    out.write(json.dumps(data, indent=2) if as_json else text)
    out.write("\n")


def _cmd_backends(args: argparse.Namespace, out: TextIO) -> int:
    data = _backends_data()
    _emit(data, render_backends(data), args.json, out)
    return 0


def _cmd_show(args: argparse.Namespace, out: TextIO) -> int:

    try:
        data = describe(default_registry().assembled(args.name))
    except (UnknownBackendError, PluginError) as error:
        print(f"fxquant: error: {error}", file=sys.stderr)
        return 1
    width = output_width() if args.width is None else args.width or None
    _emit(data, render_show(data, width), args.json, out)
    return 0


def _cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from fxquant.tools.demo import run_demo  # why: import time: only `fxquant demo` loads it

    names = None if args.backends is None else [n.strip() for n in args.backends.split(",")]
    chosen = [n for n in names if n] if names is not None else None
    return run_demo(out, backends=chosen, as_json=args.json)


def _cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from fxquant.tools.conformance import (  # why: import time: only `fxquant check` loads it
        CheckStatus,
        check_backend,
        render_results,
    )

    try:
        rows = check_backend(args.name, shapes=args.shapes, seed=args.seed)
    except (UnknownBackendError, PluginError) as error:
        print(f"fxquant: error: {error}", file=sys.stderr)
        return 1
    shown = [r for r in rows if r.result == CheckStatus.FAIL] if args.failures else rows
    data = [
        {"pattern": r.pattern, "check": r.check, "result": r.result.value, "reason": r.reason}
        for r in shown
    ]
    _emit(data, render_results(shown, args.name, counted=rows), args.json, out)
    return 1 if any(r.result == CheckStatus.FAIL for r in rows) else 0


def _cmd_new_backend(args: argparse.Namespace, out: TextIO) -> int:

    try:
        folder = new_backend(args.name, args.directory)
    except (ValueError, FileExistsError) as error:
        print(f"fxquant: error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {folder}: pip install -e {folder} && fxquant check {args.name}", file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fxquant`` (exposed for docs and tests).

    Example:
        >>> build_parser().parse_args(["show", "x86"]).name
        'x86'
    """
    parser = argparse.ArgumentParser(
        prog="fxquant",
        description="BackendConfig-driven FX quantization: inspect backends and their plugins.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fxquant {VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    backends = commands.add_parser("backends", help="list installed backends and their plugins")
    backends.add_argument("--json", action="store_true", help="print JSON instead of a table")
    backends.set_defaults(run=_cmd_backends)
    show = commands.add_parser("show", help="show one backend's summary and pattern table")
    show.add_argument("name", help="the backend, e.g. reference or x86")
    show.add_argument("--json", action="store_true", help="print JSON instead of tables")
    show.add_argument(
        "--width",
        type=int,
        help="wrap long cells to this many columns (default: the terminal's, else COLUMNS, "
        "else 120); 0: one line per row, for embedding in Markdown",
    )
    show.set_defaults(run=_cmd_show)
    demo = commands.add_parser("demo", help="quantize a built-in model with every backend")
    demo.add_argument(
        "--backends", help="comma-separated backends to run (default: every installed one)"
    )
    demo.add_argument("--json", action="store_true", help="print JSON instead of tables")
    demo.set_defaults(run=_cmd_demo)
    _add_check(commands)
    new = commands.add_parser("new-backend", help="write a plugin skeleton that passes check")
    new.add_argument("name", help="the backend's name (a Python identifier, e.g. mychip)")
    new.add_argument(
        "--directory", default=".", help="where to create fxquant-NAME/ (default: here)"
    )
    new.set_defaults(run=_cmd_new_backend)
    return parser


def _add_check(commands: Any) -> None:
    check = commands.add_parser(
        "check", help="check that an installed backend keeps the plugin contract"
    )
    check.add_argument("name", help="the backend, e.g. x86")
    check.add_argument("--shapes", type=int, default=3, help="random sizes per case (3)")
    check.add_argument("--seed", type=int, default=0, help="seed of sizes, weights, inputs")
    check.add_argument("--failures", action="store_true", help="show only the failed rows")
    check.add_argument("--json", action="store_true", help="print JSON instead of a table")
    check.set_defaults(run=_cmd_check)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fxquant`` with ``argv`` (default: the process arguments); return the exit code.

    Example:
        >>> main(["--version"])  # doctest: +SKIP
        fxquant 0.1.0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        code: int = args.run(args, sys.stdout)
    except BrokenPipeError:  # `fxquant show x86 | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (absorbs the final flush)
        return 0
    return code
