"""docs/plugins.md carries the hook reference exactly as the hookspec docstrings say it.

Run ``python -m tests.registry.test_docs`` to rewrite the reference section.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from fxquant.registry import hookspecs

PLUGINS_MD = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
START, END = "<!-- hook-reference:start -->", "<!-- hook-reference:end -->"
HOOKS = (
    "fxquant_pattern_configs",
    "fxquant_lowering_kernels",
    "fxquant_default_qconfig_mapping",
    "fxquant_deployment",
    "fxquant_graph_mode",
)
RECORDS = (
    "LoweringRule",
    "LoweringMatch",
    "QParams",
    "Dequantize",
    "Quantize",
    "Declined",
    "Override",
    "Deployment",
    "Deployed",
    "GraphMode",
)


def hook_reference() -> str:
    """The Markdown of the reference: one section per hook, then the records hooks return."""
    parts = []
    for name in (*HOOKS, *RECORDS):
        obj = getattr(hookspecs, name)
        signature = inspect.signature(obj)
        arguments = ", ".join(signature.parameters)
        parts.append(f"### `{name}({arguments})`\n\n```text\n{inspect.getdoc(obj)}\n```\n")
    return "\n".join(parts)


def documented_reference(text: str) -> str:
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def test_every_hookspec_is_listed_in_the_reference() -> None:
    specs = {n for n in dir(hookspecs) if n.startswith("fxquant_")}
    assert specs == set(HOOKS)
    assert all(inspect.getdoc(getattr(hookspecs, n)) for n in HOOKS)


def test_plugins_md_reference_is_identical_to_the_hookspec_docstrings() -> None:
    assert documented_reference(PLUGINS_MD.read_text()) == hook_reference().strip("\n"), (
        "docs/plugins.md is out of date: run python -m tests.registry.test_docs"
    )


def test_every_hook_marks_none_and_the_merge_rule() -> None:
    for name in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "``None``" in doc, name
        assert "Merge rule" in doc, name
        assert "Example::" in doc, name


if __name__ == "__main__":
    text = PLUGINS_MD.read_text()
    before, rest = text.split(START, 1)
    after = rest.split(END, 1)[1]
    PLUGINS_MD.write_text(f"{before}{START}\n{hook_reference()}{END}{after}")
    print(f"rewrote the hook reference in {PLUGINS_MD}")
