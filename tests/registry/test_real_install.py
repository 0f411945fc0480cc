"""Real installs: the example backend and two throwaway distributions, pip-installed in a venv.

The venv is made without pip and sees the running environment through a
``.pth`` file (torch, pluggy, pip, setuptools and the editable fxquant), so
installing is offline and fast: ``pip install --no-deps --no-build-isolation
--no-index``. Every check runs in a subprocess of the venv's python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fxquant.registry.loading import scan

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fxquant-mybackend"

EXTRA_PLUGIN = """
import torch
import fxquant.registry
from fxquant.config.backend import BackendPatternConfig, DTypeConfig

@fxquant.registry.hookimpl
def fxquant_pattern_configs(backend):
    if backend != "mybackend":
        return None
    int8 = DTypeConfig(torch.quint8, torch.quint8, None, None)
    return [BackendPatternConfig(torch.nn.Hardswish).add_dtype_config(int8)]
"""

BROKEN_PLUGIN = 'raise RuntimeError("broken on purpose")\n'


def write_distribution(root: Path, name: str, backend: str, plugin_source: str) -> Path:
    """A minimal distribution `name` whose entry point `backend` is `<package>.plugin`."""
    package = name.replace("-", "_")
    folder = root / name
    (folder / package).mkdir(parents=True)
    (folder / package / "__init__.py").write_text("")
    (folder / package / "plugin.py").write_text(plugin_source)
    (folder / "pyproject.toml").write_text(
        textwrap.dedent(f"""
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{name}"
            version = "0.1.0"
            dependencies = ["fxquant"]

            [project.entry-points."fxquant.backends"]
            {backend} = "{package}.plugin"

            [tool.setuptools]
            packages = ["{package}"]
        """)
    )
    return folder


@dataclass
class Venv:
    python: Path
    purelib: str

    def run(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        # none of this run's FXQUANT_ settings, nor a pytest-xdist worker's variables (a pytest
        # in the venv is not a worker: pytest-benchmark, where installed, warns as if it were)
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("FXQUANT_", "PYTEST_XDIST_"))
        }
        environment.update(env or {})
        return subprocess.run(
            [str(self.python), *args],
            capture_output=True,
            text=True,
            check=False,
            env=environment,
            timeout=120,
        )

    def fxquant(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run("-m", "fxquant", *args, env=env)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    root = tmp_path_factory.mktemp("real_install")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "venv",
            "--system-site-packages",
            "--without-pip",
            str(root / "venv"),
        ],
        check=True,
    )
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # addsitedir (not a bare path) so the running env's own .pth files, e.g. the editable
    # fxquant, are processed too
    outer = sysconfig.get_paths()["purelib"]
    Path(purelib, "outer_env.pth").write_text(f"import site; site.addsitedir({outer!r})\n")
    # a copy: building in place would leave build/ and *.egg-info in docs/examples
    example = shutil.copytree(
        EXAMPLE, root / "example", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    extra = write_distribution(root, "fxquant-extra", "mybackend", EXTRA_PLUGIN)
    broken = write_distribution(root, "fxquant-broken", "broken", BROKEN_PLUGIN)
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            str(example),
            str(extra),
            str(broken),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    return Venv(python, purelib)


def test_discovery_reads_metadata_and_imports_no_plugin(venv: Venv) -> None:
    script = (
        "import sys, json, fxquant.moved, fxquant.registry as r\n"
        "names = r.list_backends()\n"
        "prefixes = ('fxquant_', 'fxquant.patterns')\n"
        # the optional parts that trace other libraries' models are imported by `import
        # fxquant` itself, by design (#21): they are not backends and register no hook
        "tracers = {part for part, _ in fxquant.moved.TRACERS.values()}\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(prefixes)\n"
        "                and m.split('.')[0] not in tracers)\n"
        "print(json.dumps([names, loaded]))\n"
    )
    result = venv.run("-c", script)
    assert result.returncode == 0, result.stderr
    # plus whatever backends the outer environment already has (e.g. installed plugins)
    outer = {record.backend for record in scan()}
    expected = sorted(outer | {"broken", "mybackend", "reference"})
    assert json.loads(result.stdout) == [expected, []]


def test_backends_shows_extension_failure_and_the_builtin(venv: Venv) -> None:
    result = venv.fxquant("backends", "--json")
    assert result.returncode == 0, result.stderr
    data = {b["name"]: b for b in json.loads(result.stdout)}
    mybackend, broken = data["mybackend"], data["broken"]
    assert [(p["distribution"], p["version"]) for p in mybackend["plugins"]] == [
        ("fxquant-extra", "0.1.0"),
        ("fxquant-mybackend", "0.1.0"),
    ]
    assert mybackend["status"] == "ok"
    assert broken["status"] == "failed"
    assert broken["reason"] == (
        "fxquant-broken 0.1.0 (entry point 'broken = fxquant_broken.plugin') for backend 'broken' "
        "failed to import: RuntimeError: broken on purpose"
    )
    assert data["reference"]["status"] == "ok"
    text = venv.fxquant("backends")
    assert text.returncode == 0, text.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in text.stdout.splitlines()]
    assert ["broken", "failed"] in [row[:2] for row in rows]


def test_the_extension_adds_one_pattern_and_show_names_its_distribution(venv: Venv) -> None:
    count = "import fxquant.registry as r; print(len(r.get_backend_config('mybackend').configs))"
    with_extra = venv.run("-c", count)
    without = venv.run("-c", count, env={"FXQUANT_DISABLE_PLUGINS": "fxquant-extra"})
    assert with_extra.returncode == without.returncode == 0, with_extra.stderr + without.stderr
    assert int(with_extra.stdout) == int(without.stdout) + 1
    show = venv.fxquant("show", "mybackend")
    assert show.returncode == 0, show.stderr
    row = next(line for line in show.stdout.splitlines() if line.startswith("| Hardswish "))
    assert "| fxquant-extra " in row


def test_a_broken_plugin_breaks_only_its_backend(venv: Venv) -> None:
    script = (
        "import fxquant.registry as r\n"
        "from fxquant.errors import PluginError\n"
        "try:\n"
        "    r.get_backend_config('broken')\n"
        "except PluginError as e:\n"
        "    print(type(e.__cause__).__name__)\n"
        "print(r.get_backend_config('reference').name, r.get_backend_config('mybackend').name)\n"
        "print(type(r.get_default_qconfig_mapping('mybackend')).__name__)\n"
    )
    result = venv.run("-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["RuntimeError", "reference mybackend", "QConfigMapping"]
    show = venv.fxquant("show", "broken")
    assert show.returncode == 1
    assert "failed to import: RuntimeError: broken on purpose" in show.stderr


def test_a_distribution_visible_twice_on_sys_path_loads_once(venv: Venv) -> None:
    # a second path to the same site-packages: Python keeps both on sys.path
    alias = Path(venv.purelib).parent / "site-packages-alias"
    if not alias.exists():
        alias.symlink_to(venv.purelib, target_is_directory=True)
    script = (
        "import sys, fxquant.registry as r\n"
        "assert sys.argv[1] in sys.path, sys.path\n"
        "records = r.default_registry().records()\n"
        "print(sorted(x.dist_key for x in records if x.backend == 'mybackend'))\n"
        "print(len(r.get_backend_config('mybackend').configs) > 0)\n"
    )
    result = venv.run("-c", script, str(alias), env={"PYTHONPATH": str(alias)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["['fxquant-extra', 'fxquant-mybackend']", "True"]
