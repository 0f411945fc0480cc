"""The core holds the mechanism, plugins the backends: no backend's kernels live in core/ (#11)."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "fxquant"
# the int8 kernel libraries of particular backends: torch.ops.onednn (onednn, x86) and
# torch.ops.quantized on a quantized engine (fbgemm, qnnpack)
BACKEND_LIBRARIES = ("torch.ops.onednn", "torch.ops.quantized")


def _backend_library_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and ast.unparse(node) in BACKEND_LIBRARIES:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_core_module_calls_a_backends_kernel_library() -> None:
    hits = [hit for path in CORE.rglob("*.py") for hit in _backend_library_calls(path)]
    assert hits == []


def test_the_core_kernels_are_the_ones_every_backend_uses() -> None:
    assert sorted(p.name for p in (CORE / "lowering" / "kernels").iterdir() if p.suffix == ".py") == [
        "__init__.py",
        "boundary.py",
        "cpu.py",
        "integer.py",
    ]


@pytest.mark.parametrize(
    ("moved", "home"),
    [
        ("fxquant.kernels.onednn", "fxquant_onednn.modules"),
        ("fxquant.kernels.quantized_engine", "fxquant_quantized_engine"),
        ("fxquant.patterns.engine", "fxquant_quantized_engine.patterns"),
    ],
)
def test_modules_serving_some_backends_live_in_their_plugins(moved: str, home: str) -> None:
    assert importlib.util.find_spec(moved) is None
    package = home.split(".")[0]
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed")
    assert importlib.util.find_spec(home) is not None


def _distribution(name: str) -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed")


@pytest.mark.parametrize(
    ("plugin", "library"),
    [
        ("fxquant-fbgemm", "fxquant-quantized-engine"),
        ("fxquant-qnnpack", "fxquant-quantized-engine"),
        ("fxquant-x86", "fxquant-onednn"),
    ],
)
def test_a_backend_depends_on_the_plugin_that_holds_its_kernels(plugin: str, library: str) -> None:
    requirements = _distribution(plugin).requires or []
    assert [r for r in requirements if r.split(";")[0].startswith(f"{library}<")] == [
        f"{library}<0.2,>=0.1"
    ]


def test_the_shared_quint8_engine_library_registers_no_backend() -> None:
    found = _distribution("fxquant-quantized-engine").entry_points
    assert [e for e in found if e.group == "fxquant.backends"] == []
