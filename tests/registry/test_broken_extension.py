"""A broken distribution extending a backend never takes that backend down (#22).

The extension is a real installed distribution: a ``.dist-info`` folder with its
``entry_points.txt`` and a package that raises on import, on a temporary path put
on ``sys.path`` of a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from fxquant.errors import PluginError, PluginWarning
from fxquant.registry.loading import scan
from fxquant.registry.manager import Registry

from tests.registry.conftest import Installed

pytestmark = pytest.mark.skipif(
    "x86" not in {r.backend for r in scan()}, reason="needs the fxquant-x86 plugin installed"
)


def _install_broken_extension(root: Path) -> None:
    dist_info = root / "acme_x86_extra-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-x86-extra\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text("[fxquant.backends]\nx86 = acme_x86_extra.plugin\n")
    package = root / "acme_x86_extra"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text("raise ImportError('acme needs libacme.so')\n")


def _run(root: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(root), *sys.path])
    full_env = {**os.environ, "PYTHONPATH": path, **env}
    for name in ("FXQUANT_DISABLE_PLUGINS", "FXQUANT_PLUGINS", "FXQUANT_STRICT_PLUGINS"):
        if name not in env:
            full_env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
        check=False,
    )


GET_X86 = (
    "import fxquant.registry as r\n"
    "print(len(r.get_backend_config('x86').configs))\n"
    "print(len(r.get_backend_config('x86').configs))\n"  # cached: no second warning
)


def test_x86_loads_without_a_broken_extension_with_one_warning(tmp_path: Path) -> None:
    _install_broken_extension(tmp_path)
    result = _run(tmp_path, GET_X86)
    assert result.returncode == 0, result.stderr
    clean = _run(tmp_path, GET_X86, FXQUANT_DISABLE_PLUGINS="acme-x86-extra")
    assert clean.returncode == 0, clean.stderr
    assert result.stdout == clean.stdout  # the same patterns as without the extension
    lines = [line for line in result.stderr.splitlines() if "PluginWarning" in line]
    assert len(lines) == 1, result.stderr
    assert "backend 'x86' loaded without acme-x86-extra 1.0" in lines[0]
    assert "ImportError: acme needs libacme.so" in lines[0]
    assert "FXQUANT_DISABLE_PLUGINS=acme-x86-extra" in lines[0]
    assert "PluginWarning" not in clean.stderr


def test_fxquant_backends_shows_x86_ok_and_the_extension_failed(tmp_path: Path) -> None:
    _install_broken_extension(tmp_path)
    code = "import sys, fxquant.tools.cli as c; sys.exit(c.main(['backends', '--json']))"
    result = _run(tmp_path, code)
    assert result.returncode == 0, result.stderr
    x86 = next(b for b in json.loads(result.stdout) if b["name"] == "x86")
    assert x86["status"] == "ok"
    statuses = {p["distribution"]: p["status"] for p in x86["plugins"]}
    assert statuses["acme-x86-extra"] == "failed"
    assert statuses["fxquant-x86"] == "ok"


def test_strict_plugins_make_the_broken_extension_an_error(tmp_path: Path) -> None:
    _install_broken_extension(tmp_path)
    code = (
        "import fxquant.registry as r\n"
        "from fxquant.errors import PluginError\n"
        "try:\n"
        "    r.get_backend_config('x86')\n"
        "except PluginError as e:\n"
        "    print(e)\n"
    )
    result = _run(tmp_path, code, FXQUANT_STRICT_PLUGINS="1")
    assert result.returncode == 0, result.stderr
    assert "acme-x86-extra 1.0" in result.stdout
    assert "failed to import: ImportError: acme needs libacme.so" in result.stdout


def test_the_backends_own_plugin_failing_is_still_an_error(
    installed: Installed, registry: Registry
) -> None:
    installed.module("fine_extension", fxquant_pattern_configs=lambda backend: [])
    installed.add("mine", "no_such_module_for_fxquant_mine", dist="fxquant-mine")
    installed.add("mine", "fine_extension", dist="acme-mine-extra")
    with pytest.raises(PluginError, match=r"fxquant-mine 1\.0 .* failed to import"):
        registry.get_backend_config("mine")


def test_an_extension_of_a_backend_without_other_plugins_fails_it(
    installed: Installed, registry: Registry
) -> None:
    installed.add("lonely", "no_such_module_for_fxquant_lonely", dist="acme-lonely")
    with pytest.raises(PluginError, match=r"acme-lonely 1\.0 .* failed to import"):
        registry.get_backend_config("lonely")


def test_a_broken_extension_warns_once_in_process(installed: Installed, registry: Registry) -> None:
    installed.patterns("mine", "fxquant-mine", "relu")
    installed.add("mine", "no_such_module_for_acme", dist="acme-mine-extra")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = registry.get_backend_config("mine")
        second = registry.get_backend_config("mine")
    assert len(first.configs) == len(second.configs) == 1
    assert [type(w.message) for w in caught] == [PluginWarning]
    assert "FXQUANT_DISABLE_PLUGINS=acme-mine-extra" in str(caught[0].message)
