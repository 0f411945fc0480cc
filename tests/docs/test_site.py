"""The documentation site builds with ``mkdocs build --strict``: no broken link, no stale page.

This is how CI builds the site: ``nox -s tests`` installs the ``docs`` extra and sets
``FXQUANT_DOCS_REQUIRED=1``, so a missing mkdocs fails there instead of skipping (in a
virtualenv without the extra, the build is left to ``nox -s docs``).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fxquant.registry import list_backends
from fxquant.registry.loading import scan

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "hooks" / "generated_pages.py"


def require_mkdocs() -> None:
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("FXQUANT_DOCS_REQUIRED") == "1":
            pytest.fail("mkdocs is not installed: pip install -e '.[docs]'")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]', or nox -s docs)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_mkdocs()
    folder = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr, result.stderr[-4000:]
    return folder


def hook() -> ModuleType:
    require_mkdocs()  # the hook imports mkdocs' File
    spec = importlib.util.spec_from_file_location("generated_pages", HOOK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def test_every_installed_backend_has_a_generated_page(site: Path) -> None:
    # installed = announced by an entry point (what the site's build sees); a plugin another
    # test registered in this process with register_plugin is not installed
    installed = sorted({record.backend for record in scan()})
    for name in installed:
        page = text(site / "backends" / name / "index.html")
        assert f"fxquant show {name} --json" in page
        assert "Default mapping" in page
    index = text(site / "backends" / "index.html")
    assert all(f'href="{name}/"' in index for name in installed)


def test_the_api_reference_renders_docstrings_and_their_examples(site: Path) -> None:
    page = text(site / "api" / "fxquant" / "index.html")
    assert 'id="fxquant.flow.prepare_fx"' in page
    assert "&gt;&gt;&gt;" in page  # Example: sections render as code, not as prose


def test_the_benchmark_page_shows_the_plugins_figures(site: Path) -> None:
    page = text(site / "benchmarks" / "index.html")
    if "x86" in list_backends():
        assert "Speed and accuracy" in page
    plot = (ROOT / "docs" / "img" / "benchmarks.png").is_file()
    assert ('src="../img/benchmarks.png"' in page) == plot


def test_the_plot_is_included_only_when_it_exists() -> None:
    generated = hook()
    # the image itself, not a README's mention of the file's path
    image = "](img/benchmarks.png)"
    assert image in generated.benchmark_sections(plot=True)
    assert image not in generated.benchmark_sections(plot=False)


def test_a_readme_section_keeps_its_tables_and_drops_its_relative_links() -> None:
    readme = (
        "# x\n\n## Speed (1 thread)\n\n| a |\n| - |\n\nsee [bench](../../bench/b.py)\n\n## Other\n"
    )
    section = hook().benchmark_section(readme)
    assert section == "### Speed (1 thread)\n\n| a |\n| - |\n\nsee bench"
