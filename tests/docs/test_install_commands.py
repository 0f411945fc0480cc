"""The install commands the docs and error hints print are the ones ``nox -s install`` runs,
and each would work from a clone (#22). Fast: nothing is installed here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import fxquant
import pytest
import tomllib
from fxquant.registry.install import checkout_root, install_command, local_plugin_folders

from tests.install_commands import ROOT, SKIPPED, development_install, documented_commands

COMMANDS = documented_commands()
PLUGINS = sorted(p.parent.name for p in (ROOT / "plugins").glob("*/pyproject.toml"))
# backends: the plugins with an entry point (not quantized-engine, a library; nor distributed,
# an optional part)
BACKENDS = [
    n
    for n in PLUGINS
    if "fxquant.backends"
    in tomllib.loads((ROOT / "plugins" / n / "pyproject.toml").read_text())["project"].get(
        "entry-points", {}
    )
]


def test_the_install_session_runs_the_commands_read_from_the_files() -> None:
    noxfile = (ROOT / "noxfile.py").read_text()
    assert "def install(session" in noxfile
    assert "documented_commands()" in noxfile
    kinds = {c.kind for c in COMMANDS}
    assert kinds <= {"clone", "index", "scaffold", "skipped"}
    assert {"clone", "index", "scaffold"} <= kinds


def test_every_skipped_command_is_still_in_the_files_and_says_why() -> None:
    found = {c.text for c in COMMANDS}
    assert set(SKIPPED) <= found
    assert all(len(reason) > 20 for reason in SKIPPED.values())


def test_the_getting_started_and_readme_commands_are_found() -> None:
    texts = {c.text for c in COMMANDS}
    assert "pip install -e . plugins/quantized-engine plugins/onednn plugins/x86" in texts
    assert "pip install fxquant fxquant-x86" in texts
    assert "pip install fxquant-x86" in texts


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.kind == "clone"], ids=str)
def test_a_clone_command_names_the_local_plugins_its_plugins_build_on(command: object) -> None:
    # `pip install plugins/x86` alone fails: pip looks for fxquant-onednn on an index
    arguments = command.arguments  # type: ignore[attr-defined]
    folders = [a for a in arguments if a.startswith("plugins/")]
    for folder in folders:
        name = folder.removeprefix("plugins/").split("[")[0]
        needed = [f"plugins/{p.name}" for p in local_plugin_folders(name, ROOT)]
        assert set(needed) <= {f.split("[")[0] for f in folders}, command
    if folders:
        assert "." in arguments, f"{command}: the core is not on an index either"


@pytest.mark.parametrize("name", BACKENDS)
def test_the_error_hint_installs_what_a_documented_command_installs(name: str) -> None:
    if checkout_root() is None:
        pytest.skip("fxquant runs from an installed wheel: the hint is pip install fxquant-NAME")
    hint = install_command(name).split()[2:]
    relative = {Path(a).relative_to(ROOT).as_posix() for a in hint if Path(a).is_absolute()}
    relative.discard(".")
    documented = [
        {a.split("[")[0] for a in c.arguments if a.startswith("plugins/")}
        for c in COMMANDS
        if c.kind == "clone"
    ]
    assert relative in documented, (name, hint)


@pytest.mark.parametrize(
    "readme", sorted(ROOT.glob("plugins/*/README.md")), ids=lambda p: p.parent.name
)
def test_plugin_readmes_give_the_pattern_count_fxquant_show_prints(readme: Path) -> None:
    # the command itself, in a fresh process: what a reader running it sees
    # "(240 patterns; 248 where the CPU computes bfloat16)": a count that depends on the host
    pattern = r"fxquant show (\w+) .*?\((\d+) patterns(?:; (\d+) where [^)]*)?\)"
    for name, *counts in re.findall(pattern, readme.read_text()):
        shown = subprocess.run(
            [sys.executable, "-m", "fxquant", "show", name],
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()[0]  # fmt: skip
        assert any(f"({count} patterns," in shown for count in counts if count), (readme, shown)


def test_plugins_md_shows_fxquant_backends_as_the_table_it_prints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    from fxquant.tools.cli import render_backends

    monkeypatch.syspath_prepend(str(ROOT / "docs" / "examples" / "fxquant-mybackend" / "src"))
    example = importlib.import_module("fxquant_mybackend.patterns")
    kernels = importlib.import_module("fxquant_mybackend.kernels")

    page = (ROOT / "docs" / "plugins.md").read_text()
    shown = re.search(r"```text\n(\| backend .*?)\n```", page, re.S)
    assert shown is not None
    data = [
        {
            "name": "mybackend",
            "status": "ok",
            "reason": "",
            "pattern_count": len(example.pattern_configs()),
            "kernel_count": len(kernels.lowering_rules()),
            "plugins": [
                {
                    "distribution": "fxquant-mybackend",
                    "version": "0.1.0",
                    "entry_point": "",
                    "status": "ok",
                    "reason": "",
                    "import_ms": 2.1,
                    "builtin": False,
                }
            ],
        },
        {
            "name": "reference",
            "status": "ok",
            "reason": "",
            "pattern_count": len(fxquant.get_backend_config("reference").configs),
            "kernel_count": 0,
            "plugins": [
                {
                    "distribution": "fxquant",
                    "version": fxquant.__version__,
                    "entry_point": "",
                    "status": "ok",
                    "reason": "",
                    "import_ms": 1.2,
                    "builtin": True,
                }
            ],
        },
    ]
    assert shown.group(1) == render_backends(data)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.kind == "clone"], ids=str)
def test_a_clone_command_keeps_an_editable_core_editable(command: object) -> None:
    # `pip install . plugins/x86` after `pip install -e .` replaced the editable core with a
    # copy: edits under core/ stopped taking effect
    arguments = command.arguments  # type: ignore[attr-defined]
    for index, argument in enumerate(arguments):
        if argument == "." or argument.startswith(".["):
            assert arguments[index - 1 : index] == ["-e"], f"{command}: use -e {argument}"


def _readme_backend_table() -> dict[str, list[str]]:
    """README's "Install one backend" table: {backend: [clone command, index command]}."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Install one backend", 1)[1].split("\n#", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    return {
        row[0].removeprefix("| `").split("`")[0]: [
            re.findall(r"`(pip install [^`]+)`", cell)[0] for cell in row[1:]
        ]
        for row in rows
    }


def test_the_readme_lists_every_backends_install_commands_in_one_table() -> None:
    table = _readme_backend_table()
    assert set(table) == {*BACKENDS, "reference"}
    documented = {c.text: c.kind for c in COMMANDS}
    for name, (clone, index) in table.items():
        assert documented.get(clone) == "clone", clone
        assert documented.get(index) == "index", index
        if name == "reference":
            assert (clone, index) == ("pip install -e .", "pip install fxquant")
            continue
        needed = [f"plugins/{p.name}" for p in local_plugin_folders(name, ROOT)]
        assert clone.split()[2:] == ["-e", ".", *needed], (name, clone)
        assert index == f"pip install fxquant-{name}"


def test_the_development_command_installs_core_and_every_plugin_editable_in_order() -> None:
    arguments = development_install()
    assert arguments[:2] == ["-e", ".[test,docs]"]
    assert arguments[2::2] == ["-e"] * len(PLUGINS)
    folders = [a.removeprefix("plugins/").removesuffix("[test]") for a in arguments[3::2]]
    assert sorted(folders) == PLUGINS
    for position, name in enumerate(folders):  # each after the local plugins it builds on
        before = {p.name for p in local_plugin_folders(name, ROOT)[:-1]}
        assert before <= set(folders[:position]), (name, folders)
    readme = (ROOT / "README.md").read_text()
    assert "pip install nox && nox -s dev" in readme
    assert "def dev(session" in (ROOT / "noxfile.py").read_text()
