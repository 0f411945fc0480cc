"""Every code block of the documentation runs, so the docs cannot rot.

The pages: docs/ and every plugin's README (README.md's own blocks run in
tests/test_readme.py, which checks what each prints). Per page, its ``python``
blocks run in order in one namespace (a page reads as one session); a ``text``
block right after a ``python`` block (nothing between) is what that block prints,
and must be; ``bash``/``console`` lines that call ``fxquant`` must parse with the
command's own parser; ``toml`` blocks must parse. Other ``text`` blocks are prose
(command output, trees, signatures) and are not run. A plugin README's blocks
are skipped, with the command that installs it, where the plugin is not
installed. A block that cannot run
here (it needs a GPU, or a package the test environment lacks) says so with a
``# needs: MODULE`` first line and is skipped only when MODULE is missing. A block
whose first line names the test that runs it instead (``# torch.ao version:
tests/docs/test_migration.py ...``: torch.ao warns on every call) is left to that test.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
import sys
from pathlib import Path

import pytest
import tomllib
from fxquant.registry.install import install_command
from fxquant.tools.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DOC_PAGES = sorted(
    p for p in DOCS.rglob("*.md") if not {"hooks", "examples"} & set(p.relative_to(DOCS).parts)
)
PLUGIN_READMES = sorted((ROOT / "plugins").glob("*/README.md"))
PAGES = [*DOC_PAGES, *PLUGIN_READMES]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
# what a page's blocks need that its text sets up: plugins.md walks a plugin's files,
# distributed.md runs under torchrun
PRELUDES = {
    "plugins.md": "tests.docs.preludes:plugins",
    "distributed.md": "tests.docs.preludes:distributed",
}


RUN_ELSEWHERE = re.compile(r"# .*: (tests/\S+\.py)")


def blocks(page: Path, language: str) -> list[str]:
    return [code for lang, code in FENCE.findall(page.read_text()) if lang == language]


def shown_outputs(page: Path) -> list[str | None]:
    """Per ``python`` block, the ``text`` block right after it (what it prints), or None."""
    text = page.read_text()
    fences = list(FENCE.finditer(text))
    shown: list[str | None] = []
    for fence, after in zip(fences, [*fences[1:], None], strict=True):
        if fence.group(1) != "python":
            continue
        follows = after is not None and not text[fence.end() : after.start()].strip()
        shown.append(after.group(2) if follows and after.group(1) == "text" else None)
    return shown


def missing_plugin(page: Path) -> str | None:
    """For a plugin's README: why its blocks cannot run here (the plugin is not installed)."""
    if page not in PLUGIN_READMES:
        return None
    folder = page.parent.name
    if importlib.util.find_spec(f"fxquant_{folder.replace('-', '_')}") is not None:
        return None
    return f"plugins/{folder} is not installed ({install_command(folder)})"


def run_elsewhere(code: str) -> bool:
    """The block's first line names the test that runs it, and that test exists."""
    found = RUN_ELSEWHERE.match(code)
    return bool(found) and (DOCS.parent / found.group(1)).is_file()


def page_id(page: Path) -> str:
    return str(page.relative_to(DOCS if page.is_relative_to(DOCS) else ROOT))


def test_every_page_is_found_and_every_fence_has_a_language() -> None:
    ids = {page_id(p) for p in PAGES}
    assert {"index.md", "migration.md", "plugins.md", "conformance.md"} <= ids
    assert {"plugins/executorch/README.md", "plugins/tensorrt/README.md"} <= ids
    unlabelled = [
        page_id(p) for p in DOC_PAGES for lang, _ in FENCE.findall(p.read_text()) if not lang
    ]
    assert unlabelled == []


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python")], ids=page_id)
def test_python_blocks_run_in_order(
    page: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    missing = missing_plugin(page)
    if missing:
        pytest.skip(missing)
    if page in PLUGIN_READMES:  # their snippets save model.pte, model.onnx where they run
        monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    prelude = PRELUDES.get(page_id(page))
    if prelude:
        module, function = prelude.split(":")
        namespace.update(getattr(importlib.import_module(module), function)(monkeypatch, request))
    codes = blocks(page, "python")
    for number, (code, shown) in enumerate(zip(codes, shown_outputs(page), strict=True), 1):
        if run_elsewhere(code):
            continue
        needs = re.match(r"# needs: (\S+)", code)
        if needs and importlib.util.find_spec(needs.group(1)) is None:
            pytest.skip(f"block {number} needs {needs.group(1)}")
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            exec(compile(code, f"{page_id(page)} block {number}", "exec"), namespace)
        if shown is not None:  # the page shows what the block prints: it must be that
            assert printed.getvalue().rstrip() == shown.rstrip(), f"block {number}'s output"


def fxquant_commands(page: Path) -> list[list[str]]:
    found = []
    for code in blocks(page, "bash") + blocks(page, "console"):
        for line in code.splitlines():
            command = line.removeprefix("$ ").split("#", 1)[0].strip()
            for part in command.split("&&"):
                words = shlex.split(part)
                if words[:1] == ["fxquant"]:
                    found.append(words[1:])
    return found


@pytest.mark.parametrize("page", [p for p in PAGES if fxquant_commands(p)], ids=page_id)
def test_fxquant_commands_parse(page: Path) -> None:
    parser = build_parser()
    for words in fxquant_commands(page):
        with contextlib.redirect_stderr(io.StringIO()) as errors:
            try:
                parser.parse_args(words)
            except SystemExit as error:  # argparse exits 0 after --help, 2 on a bad line
                exited = error.code
            else:
                exited = 0
        assert exited == 0, f"fxquant {' '.join(words)}: {errors.getvalue()}"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "toml")], ids=page_id)
def test_toml_blocks_parse(page: Path) -> None:
    for code in blocks(page, "toml"):
        tomllib.loads(code)


def test_the_blocks_of_a_page_run_in_this_interpreter() -> None:
    assert sys.version_info >= (3, 11)  # tomllib; the docs test runs where the suite runs


def test_a_plugin_readme_whose_plugin_is_missing_is_skipped_with_its_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readme = next(p for p in PLUGIN_READMES if p.parent.name == "x86")
    assert missing_plugin(readme) is None  # installed here: its blocks run
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    reason = missing_plugin(readme)
    assert reason is not None
    assert reason.startswith("plugins/x86 is not installed (pip install ")
    folders = [Path(word).name for word in reason.removesuffix(")").split()[-3:]]
    assert folders == ["quantized-engine", "onednn", "x86"]  # what x86 builds on, first
    assert missing_plugin(DOCS / "index.md") is None  # docs pages run with what is installed


# a page says how things are; which issue, session or review round brought them is in the
# commits (`git log -- PAGE`)
HISTORY = re.compile(
    r"\bissues? \d+\b|\bhelper [a-z]+\d|\bstop \d+\b|\b(?:first|second|third) round\b", re.I
)
RENDERED = {"guide/matrix.md"}  # written from its results by tests/invariants/matrix.py


def history_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if HISTORY.search(line)]


def test_no_page_narrates_the_history_behind_it() -> None:
    pages = [ROOT / "README.md", *(p for p in PAGES if page_id(p) not in RENDERED)]
    found = [f"{page_id(p)}: {line}" for p in pages for line in history_lines(p.read_text())]
    assert found == []


def test_history_is_told_from_a_round_trip_and_a_per_round_ratio() -> None:
    narrated = "issue 19's targets\nThird round (helper h19k)\nthe merged tree of stop 28"
    assert len(history_lines(narrated)) == 3
    plain = "a state_dict round trip\nmedians of per-round ratios\n5 rounds\nfiled issues"
    assert history_lines(plain) == []
