"""mkdocs hooks: one page per installed backend, and the benchmark tables, made at build time.

Nothing here is copied by hand: each backend page is what ``fxquant show NAME
--json`` says (fxquant.tools.describe) plus the benchmark sections of the
plugin's README (read from its distribution's metadata, so a third-party
plugin gets a page too), and the benchmark page gathers those sections with
the summary plot when ``docs/img/benchmarks.png`` exists.

    on_config          adds "Backends > NAME" to the nav for every installed backend
    on_files           adds the generated backends/NAME.md files
    on_page_markdown   fills the <!-- backends-table --> and <!-- benchmark-sections -->
                       markers of backends/index.md and benchmarks.md
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

from fxquant.registry import default_registry, get_default_qconfig_mapping, list_backends
from fxquant.tools.cli import markdown_table
from fxquant.tools.describe import class_str, describe, pattern_text
from mkdocs.structure.files import File, Files

PLOT = "img/benchmarks.png"
BENCHMARK_HEADING = re.compile(r"^##\s+.*(speed|figures|bench)", re.IGNORECASE)
LINK = re.compile(r"\[([^\]]+)\]\((?!https?://)[^)]+\)")


def backends() -> list[str]:
    """Installed backends whose plugins load (a failed one has no page to show)."""
    names = []
    for name in list_backends():
        try:
            default_registry().assembled(name)
        except Exception:  # fxquant backends shows the failure; no page here
            continue
        names.append(name)
    return names


def on_config(config: Any) -> Any:
    for section in config["nav"]:
        if isinstance(section, dict) and "Backends" in section:
            section["Backends"] += [{name: f"backends/{name}.md"} for name in backends()]
    return config


def on_files(files: Files, config: Any) -> Files:
    for name in backends():
        files.append(File.generated(config, f"backends/{name}.md", content=backend_page(name)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if "<!-- backends-table -->" in markdown:
        markdown = markdown.replace("<!-- backends-table -->", backends_table())
    if "<!-- benchmark-sections -->" in markdown:
        plot = Path(config["docs_dir"], PLOT).is_file()
        markdown = markdown.replace("<!-- benchmark-sections -->", benchmark_sections(plot))
    return markdown


def backends_table() -> str:
    rows = []
    for name in backends():
        data = describe(default_registry().assembled(name))
        plugins = ", ".join(f"{p['distribution']} {p['version']}" for p in data["plugins"])
        runs_on = data["deployment"] or "PyTorch"
        link = f"[{name}]({name}.md)"
        counts = [str(len(data["patterns"])), str(len(data["lowering_kernels"]))]
        rows.append([link, *counts, runs_on, plugins])
    return markdown_table(["backend", "patterns", "kernels", "runs on", "plugins"], rows)


def readme_of(distribution: str) -> str:
    """The README a distribution ships as its long description ("" when it has none).

    A distribution installed from a local folder (``pip install -e plugins/x86``, as nox
    does) is read from that folder's README.md: its metadata is a copy made at install
    time, older than the figures a benchmark run has since written.
    """
    try:
        found = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""
    folder = local_folder(found)
    if folder is not None and (folder / "README.md").is_file():
        return (folder / "README.md").read_text()
    payload = found.metadata.get_payload()  # type: ignore[attr-defined]
    return payload if isinstance(payload, str) else ""


def local_folder(found: importlib.metadata.Distribution) -> Path | None:
    """The folder a distribution was installed from, if pip recorded a local one (PEP 610)."""
    text = found.read_text("direct_url.json")
    url = json.loads(text).get("url", "") if text else ""
    return (
        Path(urllib.parse.unquote(url.removeprefix("file://")))
        if url.startswith("file://")
        else None
    )


def benchmark_section(readme: str, level: str = "###") -> str:
    """The README's benchmark sections, one heading level down, relative links as text."""
    found, keep = [], False
    for line in readme.splitlines():
        if line.startswith("## "):
            keep = bool(BENCHMARK_HEADING.match(line))
            line = f"{level} {line[3:]}" if keep else line
        elif keep and line.startswith("### "):
            line = "#" + line
        if keep:
            found.append(LINK.sub(r"\1", line))
    return "\n".join(found).strip()


def benchmark_sections(plot: bool) -> str:
    parts = [f"![Benchmarks: fxquant against torch.ao, per backend]({PLOT})\n"] if plot else []
    for name in backends():
        plugins = describe(default_registry().assembled(name))["plugins"]
        sections = [benchmark_section(readme_of(p["distribution"])) for p in plugins]
        text = "\n\n".join(
            s for p, s in zip(plugins, sections, strict=True) if s and not is_builtin(p)
        )
        if text:
            parts.append(f"## {name}\n\nFrom the [{name} page](backends/{name}.md).\n\n{text}\n")
    return "\n".join(parts) or "No installed plugin publishes benchmark figures."


def is_builtin(plugin: dict[str, Any]) -> bool:
    return plugin["distribution"] == "fxquant"


def observer_text(factory: Any) -> str:
    """An observer or fake-quantize constructor as a line: class, dtype, range, qscheme."""
    if factory is None:
        return "float"
    built = factory()
    observer = getattr(built, "activation_post_process", built)
    parts = [type(built).__name__]
    if observer is not built:
        parts.append(f"({type(observer).__name__})")
    dtype = getattr(observer, "dtype", None)
    if dtype is not None:
        parts.append(str(dtype).removeprefix("torch."))
    low, high = getattr(observer, "quant_min", None), getattr(observer, "quant_max", None)
    if low is not None and high is not None:
        parts.append(f"{low}..{high}")
    qscheme = getattr(observer, "qscheme", None)
    if qscheme is not None:
        parts.append(str(qscheme).removeprefix("torch."))
    if getattr(observer, "is_dynamic", False):
        parts.append("dynamic")
    return " ".join(parts)


def mapping_table(name: str, is_qat: bool) -> str:
    try:
        mapping = get_default_qconfig_mapping(name, is_qat=is_qat)
    except Exception as error:  # shown on the page instead
        return f"No default mapping: {error}"
    entries = [("global", mapping.global_qconfig)]
    entries += [
        (class_str(op) if isinstance(op, type) else pattern_text(op), qconfig)
        for op, qconfig in mapping.object_type_qconfigs.items()
    ]
    entries += [(f"module {n!r}", q) for n, q in mapping.module_name_qconfigs.items()]
    entries += [(f"regex {n!r}", q) for n, q in mapping.module_name_regex_qconfigs.items()]
    rows = [
        [what, "float (not quantized)", ""]
        if qconfig is None
        else [what, observer_text(qconfig.activation), observer_text(qconfig.weight)]
        for what, qconfig in entries
    ]
    return markdown_table(["entry", "activation", "weight"], rows)


def backend_page(name: str) -> str:
    data = describe(default_registry().assembled(name))
    summary = data["summary"]
    plugins = ", ".join(f"`{p['distribution']} {p['version']}`" for p in data["plugins"])
    kernels: dict[str, list[str]] = {}
    for kernel in data["lowering_kernels"]:
        kernels.setdefault(kernel["name"], []).append(kernel["pattern"])
    kernel_rows = [[k, str(len(v)), ", ".join(v)] for k, v in kernels.items()]
    pattern_rows = [
        [p["pattern"], p["observation_type"], " / ".join(p["dtype_configs"]), p["lowering_kernel"]]
        for p in data["patterns"]
    ]
    benchmarks = "\n\n".join(
        section
        for p in data["plugins"]
        if not is_builtin(p) and (section := benchmark_section(readme_of(p["distribution"]), "###"))
    )
    return "\n".join(
        [
            f"# Backend `{name}`",
            "",
            f"Generated from the installed plugins ({plugins}) when the site was built: the same",
            f"data as `fxquant show {name} --json`. Runs on: "
            f"{data['deployment'] or 'PyTorch (the model convert_fx returns)'}.",
            "",
            markdown_table(
                ["", name],
                [
                    ["Quantization scheme", summary["quantization_scheme"]],
                    ["Data types", summary["data_type"]],
                    ["Patterns", str(len(data["patterns"]))],
                    ["Lowering kernels", str(len(data["lowering_kernels"]))],
                ],
            ),
            "",
            "## Default mapping",
            "",
            "`fxquant.get_default_qconfig_mapping(" + repr(name) + ")`:",
            "",
            mapping_table(name, is_qat=False),
            "",
            "With `is_qat=True`:",
            "",
            mapping_table(name, is_qat=True),
            "",
            "## Kernels",
            "",
            markdown_table(["kernel", "patterns", "which"], kernel_rows)
            if kernel_rows
            else "No lowering kernels: converted models stay in reference form"
            + (" and deploy to the runtime above." if data["deployment"] else "."),
            "",
            f"## Patterns ({len(pattern_rows)})",
            "",
            markdown_table(["pattern", "observation type", "dtypes", "kernel"], pattern_rows),
            "",
            "## Benchmarks",
            "",
            benchmarks or "The plugin publishes no benchmark figures.",
            "",
        ]
    )
