"""``fxquant check`` and ``fxquant new-backend`` as a plugin author runs them: real installs.

A venv that sees this environment (as in tests/registry/test_real_install.py)
gets the planted backends as an installed distribution and a fresh skeleton
from ``fxquant new-backend``; the commands run in subprocesses of that venv.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from tests.conformance import planted
from tests.registry.test_real_install import Venv, venv  # noqa: F401  (the venv fixture)

pytestmark = pytest.mark.slow

PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "fxquant-planted"
version = "0.1.0"
dependencies = ["fxquant"]

[project.entry-points."fxquant.backends"]
faulty = "fxquant_planted.planted"
clean = "fxquant_planted.planted"

[tool.setuptools]
packages = ["fxquant_planted"]
"""


def install(venv: Venv, folder: Path) -> None:  # noqa: F811  (the fixture's name)
    result = venv.run(
        "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
        "--disable-pip-version-check", str(folder),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def installed(venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Venv:  # noqa: F811
    root = tmp_path_factory.mktemp("conformance")
    package = root / "planted" / "fxquant_planted"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(planted.__file__, package / "planted.py")
    (root / "planted" / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    install(venv, root / "planted")
    made = venv.fxquant("new-backend", "mychip", "--directory", str(root))
    assert made.returncode == 0, made.stderr
    install(venv, root / "fxquant-mychip")
    installed.skeleton = root / "fxquant-mychip"  # type: ignore[attr-defined]
    return venv


def skeleton() -> Path:
    """The folder ``fxquant new-backend mychip`` wrote (set by the fixture)."""
    folder: Path = installed.skeleton  # type: ignore[attr-defined]
    return folder


def test_check_exits_zero_on_a_clean_backend(installed: Venv) -> None:
    result = installed.fxquant("check", "clean", "--shapes", "1")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert result.stdout.splitlines()[-1].startswith("clean: ")
    assert ", 0 fail," in result.stdout.splitlines()[-1]


def test_check_prints_the_planted_faults_and_exits_one(installed: Venv) -> None:
    result = installed.fxquant("check", "faulty", "--shapes", "1", "--failures")
    assert result.returncode == 1, result.stderr
    rows = [[c.strip() for c in line.split("|")[1:4]] for line in result.stdout.splitlines()[2:-1]]
    assert sorted(rows) == [
        ["Conv2d", "default_mapping", "fail"],
        ["Conv2d", "default_qat_mapping", "fail"],
        ["Hardswish", "well_formed", "fail"],
        ["reference.Linear (qlinear)", "kernel[linear]", "fail"],
        ["reference.Linear (qlinear)", "warnings[linear]", "fail"],
    ]


def test_a_new_backend_skeleton_passes_check_and_its_own_tests(installed: Venv) -> None:
    result = installed.fxquant("check", "mychip", "--shapes", "1")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    lowered = [line for line in result.stdout.splitlines() if "| kernel[linear] " in line]
    assert len(lowered) == 1
    assert "(mychip_qlinear)" in lowered[0]
    assert "| pass " in lowered[0]
    tests = installed.run("-m", "pytest", "-q", "-p", "no:cacheprovider", str(skeleton() / "tests"))
    assert tests.returncode == 0, tests.stdout[-3000:]


def test_unknown_backend_is_an_error_that_lists_the_installed(installed: Venv) -> None:
    result = installed.fxquant("check", "x68")
    assert result.returncode == 1
    assert "unknown backend 'x68'" in result.stderr


def test_new_backend_refuses_a_bad_name_and_an_existing_folder(
    installed: Venv, tmp_path: Path
) -> None:
    bad = installed.fxquant("new-backend", "My-Chip", "--directory", str(tmp_path))
    assert bad.returncode == 1
    assert "lowercase Python identifier" in bad.stderr
    first = installed.fxquant("new-backend", "again", "--directory", str(tmp_path))
    second = installed.fxquant("new-backend", "again", "--directory", str(tmp_path))
    assert (first.returncode, second.returncode) == (0, 1)
    assert "exists already" in second.stderr
