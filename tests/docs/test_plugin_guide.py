"""docs/plugins.md walks the plugin ``fxquant new-backend`` writes, every file shown as it is.

The page's file blocks (a fence with ``title="PATH"``) run in tests/docs/test_pages.py with
the rest of the page; here: the example folder is what the command writes, and each file the
page shows is that file, so neither the page, the example nor the scaffold can drift.
"""

from __future__ import annotations

import re
from pathlib import Path

from fxquant.tools.scaffold import TEMPLATES, new_backend

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "fxquant-mybackend"
PAGE = (ROOT / "docs" / "plugins.md").read_text()
TITLED = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```', re.M | re.S)


def files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (not build or cache output), by relative path."""
    return {
        p.relative_to(folder).as_posix(): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not {"__pycache__", "build"} & set(p.parts)
        and ".egg-info" not in p.as_posix()
    }  # fmt: skip


def test_the_example_is_what_fxquant_new_backend_writes(tmp_path: Path) -> None:
    written = new_backend("mybackend", tmp_path)
    assert files(EXAMPLE) == files(written)


def test_the_guide_shows_every_file_of_the_plugin_as_it_is() -> None:
    shown = dict(TITLED.findall(PAGE))
    example = files(EXAMPLE)
    for path, text in shown.items():
        assert text == example[path], f"docs/plugins.md shows {path} other than it is"
    module = "src/fxquant_mybackend/"
    expected = {"pyproject.toml", *(module + f for f in ("plugin.py", "patterns.py"))}
    expected |= {module + "kernels.py", module + "qconfig.py"}
    assert expected <= set(shown)


def test_the_guide_starts_from_fxquant_new_backend_and_lists_what_it_writes() -> None:
    walk = PAGE.split("## From `fxquant new-backend`", 1)[1]
    first_command = re.search(r"```bash\n(.*?)\n", walk)
    assert first_command is not None
    assert first_command.group(1).startswith("fxquant new-backend mybackend ")
    tree = re.search(r"```text\n(fxquant-mybackend/\n.*?)```", walk, re.S)
    assert tree is not None
    listed = {line.split()[0] for line in tree.group(1).splitlines()[1:]}
    for path in (p.replace("$name", "mybackend") for p in TEMPLATES):
        assert path in listed or Path(path).name in listed, path
