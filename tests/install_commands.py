"""Every ``pip install`` command the docs and the error hints print, and how ``nox -s install``
runs each one (#22).

The commands are read from the files (README.md, docs/, each plugin's README) so that the
install session cannot drift from them; ``tests/docs/test_install_commands.py`` checks,
fast, that each one found is classified here and that the hints are among them. Kinds:

- ``clone``: run in a clean venv from the clone's root (``pip install -e . plugins/x86``);
- ``index``: the published form (``pip install fxquant-x86``), run in a clean venv against
  wheels built from the clone (``--find-links``), which checks the dependency metadata;
- ``scaffold``: installs a folder ``fxquant new-backend`` writes, run after writing it;
- ``skipped``: not run, with the reason (``SKIPPED``).

Stdlib only: the noxfile imports it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]

__all__ = [
    "PLUGINS",
    "ROOT",
    "SKIPPED",
    "Command",
    "dependencies_first",
    "development_install",
    "documented_commands",
    "local_plugins",
    "source_files",
]

PLUGINS = sorted(p.parent.name for p in (ROOT / "plugins").glob("*/pyproject.toml"))

# "pip install" then its arguments, up to a shell separator, a comment or the end of a code span
_COMMAND = re.compile(r"pip install((?: +(?:'[^']*'|\"[^\"]*\"|[^\s`#;&|()'\"]+))+)")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")

SKIPPED = {
    "pip install nox": "installs the tool that runs this session",
    "pip install -e . 'plugins/tensorrt[gpu]'": (
        "tensorrt-cu12 is several GB of CUDA libraries, for an NVIDIA GPU (none here); "
        "`pip install -e . plugins/tensorrt` is run"
    ),
    "pip install 'fxquant-tensorrt[gpu]'": "as above, from an index",
}
"""Commands not run, and why (each must still be found in the files)."""

# scaffold folders: what to run first, where the docs' command expects the folder
SCAFFOLDS = {
    "/tmp/fxquant-mychip": "fxquant new-backend mychip --directory /tmp",
    "./fxquant-mybackend": "fxquant new-backend mybackend",
}


@dataclass(frozen=True)
class Command:
    """One documented ``pip install``: where it is written and how the session runs it."""

    text: str
    source: str
    kind: str

    @property
    def arguments(self) -> list[str]:
        """The arguments after ``pip install``, shell-split."""
        return shlex.split(self.text)[2:]


def source_files(root: Path = ROOT) -> list[Path]:
    """README.md, every page under docs/ and every plugin's README, in that order."""
    pages = sorted(p for p in (root / "docs").rglob("*.md") if "/api/" not in p.as_posix())
    first = [p for p in pages if p.name == "getting-started.md"]
    return [
        root / "README.md",
        *first,
        *(p for p in pages if p not in first),
        *sorted((root / "plugins").glob("*/README.md")),
    ]


def _kind(text: str) -> str:
    if text in SKIPPED:
        return "skipped"
    arguments = shlex.split(text)[2:]
    targets = [a for a in arguments if not a.startswith("-")]
    if any(t.rstrip("/") in SCAFFOLDS for t in targets):
        return "scaffold"
    if targets and all(t.startswith(("fxquant", "'fxquant", '"fxquant')) for t in targets):
        return "index"
    return "clone"


def _code(text: str) -> list[str]:
    """The code of a Markdown page: fenced blocks, then inline spans of the prose."""
    blocks = _FENCE.findall(text)
    prose = _FENCE.sub("", text)
    return [*blocks, *_SPAN.findall(prose)]


def documented_commands(root: Path = ROOT) -> list[Command]:
    """Every ``pip install`` command in the files of :func:`source_files`, deduplicated, in order.

    A placeholder such as ``NAME`` (``pip install fxquant-NAME``) is not a command; the
    pages name the real ones.
    """
    found: dict[str, Command] = {}
    for path in source_files(root):
        for code in _code(path.read_text()):
            for match in _COMMAND.finditer(code):
                text = "pip install" + re.sub(r" +", " ", match.group(1)).rstrip()
                if "NAME" in text or text == "pip install":
                    continue
                source = path.relative_to(root).as_posix()
                found.setdefault(text, Command(text, source, _kind(text)))
    return list(found.values())


def local_plugins(name: str) -> list[str]:
    """``name`` and the first-party plugins it depends on, as folders to install from.

    A plugin may build on another (x86 on onednn); those live here, not on an index,
    and pip must never go looking for them there.
    """
    meta = tomllib.loads((ROOT / "plugins" / name / "pyproject.toml").read_text())
    found = [name]
    for requirement in meta["project"].get("dependencies", []):
        dist = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
        if dist.startswith("fxquant-") and dist.removeprefix("fxquant-") in PLUGINS:
            found = [*local_plugins(dist.removeprefix("fxquant-")), *found]
    return list(dict.fromkeys(found))


def dependencies_first() -> list[str]:
    """Every plugin, each after the first-party plugins it depends on (onednn before x86).

    pip 23.2 does not match a dependency on a local plugin given later in the same
    command with extras (``-e ./plugins/onednn[test]``): it looks for it on an index
    and fails. Listed first, the local plugin is pinned before anyone asks for it.
    """
    return list(dict.fromkeys(dep for name in PLUGINS for dep in local_plugins(name)))


def development_install() -> list[str]:
    """``pip install`` arguments for development: the core and every plugin editable, with
    their test extras, plugins after the first-party plugins they build on (one pip call:
    see :func:`dependencies_first`). ``nox -s dev`` runs them; ``nox -s install`` proves them.
    """
    plugins = [arg for name in dependencies_first() for arg in ("-e", f"plugins/{name}[test]")]
    return ["-e", ".[test,docs]", *plugins]


if __name__ == "__main__":
    for command in documented_commands():
        print(f"{command.kind:8} {command.text:60} {command.source}")
