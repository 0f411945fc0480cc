"""The core holds the mechanism, plugins the backends: no backend's kernels live in core/ (#11);
the core's modules keep to their layers, with no import cycle, and plugins import only public
fxquant names (#21)."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from fxquant import moved

from tests import layout_graph

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
    assert sorted(
        p.name for p in (CORE / "lowering" / "kernels").iterdir() if p.suffix == ".py"
    ) == [
        "__init__.py",
        "boundary.py",
        "cpu.py",
        "integer.py",
    ]


@pytest.mark.parametrize(
    ("moved", "home"),
    [
        ("fxquant.lowering.kernels.onednn", "fxquant_onednn.modules"),
        ("fxquant.lowering.kernels.quantized_engine", "fxquant_quantized_engine"),
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


@pytest.mark.parametrize("folder", ["quantized-engine", "distributed", "transformers"])
def test_a_library_or_optional_part_registers_no_backend(folder: str) -> None:
    # read from the folder: fxquant-distributed need not be installed to be checked
    meta = tomllib.loads((ROOT / "plugins" / folder / "pyproject.toml").read_text())
    assert "entry-points" not in meta["project"]


# ---------------------------------------------------------------- the layers (#21)
# Bottom to top; a module belongs to the layer of its longest matching prefix and imports only
# from its own layer and those below (docs/design.md draws this). Function-level imports count
# too; those under `if TYPE_CHECKING:` do not (tests/layout_graph.py).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "fxquant.errors",
            "fxquant.enums",
            "fxquant.version",
            "fxquant.moved",
            "fxquant.plugin_roots",
            "fxquant.dtypes",
            "fxquant.factory",
            "fxquant.torch_ao_names",
            "fxquant.config.checks",
            "fxquant.config.pattern",
        ),
    ),
    ("lowering vocabulary", ("fxquant.lowering",)),
    (
        "numerics",
        (
            "fxquant.numerics.qdq",
            "fxquant.numerics.observer",
            "fxquant.numerics.fake_quantize",
            "fxquant.numerics.saved_shapes",
            "fxquant.lowering.kernels",
        ),
    ),
    ("config", ("fxquant.config",)),
    ("nn", ("fxquant.nn",)),
    ("patterns", ("fxquant.patterns",)),
    ("registry", ("fxquant.registry",)),
    (
        "flow",
        ("fxquant.flow",),
    ),
    (
        "after the flow",
        ("fxquant.numerics",),
    ),
    ("facade", ("fxquant",)),
    ("tools", ("fxquant.tools", "fxquant.__main__")),
)
# (importer, imported): why this one import goes up
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("fxquant.numerics", "fxquant.tools.debug"): (
        "the debugger's documented path, fxquant.numerics.compare/fallback: a PEP 562 "
        "__getattr__ loads the tool on first use only, so the mechanism never imports it"
    ),
}
# the strongly connected components left: none (#21); an entry here needs a reason
KNOWN_CYCLES: list[list[str]] = []


def layer_of(module: str) -> int:
    best = (-1, -1)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(f"{prefix}.")) and len(prefix) > best[1]:
                best = (index, len(prefix))
    if best[0] < 0:
        msg = f"{module} is in no layer of tests/test_layout.py's LAYERS"
        raise AssertionError(msg)
    return best[0]


@pytest.fixture(scope="module")
def graph() -> layout_graph.Graph:
    return layout_graph.build_graph()


def test_every_core_module_has_a_layer(graph: layout_graph.Graph) -> None:
    for module in graph.modules:
        layer_of(module)


def test_no_core_module_imports_from_a_layer_above_its_own(graph: layout_graph.Graph) -> None:
    upward = [
        f"{i.source} ({LAYERS[layer_of(i.source)][0]}) -> {i.target} "
        f"({LAYERS[layer_of(i.target)][0]}), line {i.line}"
        for i in graph.imports
        if i.target in graph.modules
        and layer_of(i.source) < layer_of(i.target)
        and (i.source, i.target) not in ALLOWED_UPWARD
    ]
    assert upward == []


def test_the_core_has_no_import_cycle_but_the_known_ones(graph: layout_graph.Graph) -> None:
    assert layout_graph.cycles(graph) == KNOWN_CYCLES


def function_level_imports_without_a_reason(graph: layout_graph.Graph) -> list[str]:
    """Function-level imports of core modules whose statement carries no ``# why:`` comment."""
    found = []
    for module in graph.modules.values():
        lines = module.path.read_text().splitlines()
        spans = {
            node.lineno: node.end_lineno or node.lineno
            for node in ast.walk(module.tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
        }
        for imp in graph.imports:
            if imp.source != module.name or not imp.in_function or imp.target not in graph.modules:
                continue
            statement = lines[imp.line - 1 : spans[imp.line]]
            if not any("# why:" in line for line in statement):
                found.append(f"{module.name}:{imp.line}: {imp.target}")
    return sorted(set(found))


def test_every_function_level_import_in_the_core_says_why(graph: layout_graph.Graph) -> None:
    # only where import time, an optional dependency or a cycle at run time needs it (#21)
    assert function_level_imports_without_a_reason(graph) == []


def test_a_function_level_import_without_a_reason_is_found(tmp_path: Path) -> None:
    package = tmp_path / "fxquant"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "b.py").write_text("")
    (package / "a.py").write_text(
        "def f():\n    from fxquant import b\n\n"
        "def g():\n    from fxquant import b  # why: import time\n\n"
        "def h():\n    from fxquant import (  # why: import time\n        b,\n    )\n"
    )
    found = layout_graph.build_graph(tmp_path)
    assert function_level_imports_without_a_reason(found) == ["fxquant.a:2: fxquant.b"]


def test_the_code_line_count_leaves_out_every_docstring_attribute_docstrings_too(
    tmp_path: Path,
) -> None:
    package = tmp_path / "fxquant"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""The module."""\n'
        "LIMIT = 3\n"
        '"""An attribute docstring (PEP 257)."""\n\n'
        "class A:\n"
        '    """The class."""\n\n'
        "    size: int = 1\n"
        '    """Its size."""\n\n'
        "    def f(self) -> int:\n"
        "        x = 1\n"
        '        "a string statement in a function body is code"\n'
        "        return x\n"
    )
    graph = layout_graph.build_graph(tmp_path)
    # LIMIT, class A, size, def f, x = 1, the string statement, return x
    assert layout_graph.code_lines_without_tools(graph) == 7


def test_the_core_is_in_ruffs_layout_so_the_line_count_measures_code() -> None:
    # A `fmt: skip` or `fmt: off` packs a table or a call past ruff's layout: the code-line
    # count would then measure how tightly lines were packed, not how much code there is.
    markers = re.compile(r"#\s*fmt:\s*(skip|off)\b")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(CORE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if markers.search(line)
    ]
    assert found == [], "leave the layout to `ruff format`"


def test_no_core_module_imports_a_moved_module_by_its_old_path(graph: layout_graph.Graph) -> None:
    old = [
        f"{i.source}:{i.line}: {i.target}"
        for i in graph.imports
        if i.target.startswith("fxquant.") and moved.new_name(i.target) is not None
    ]
    assert old == []


def test_no_core_function_is_over_50_lines(graph: layout_graph.Graph) -> None:
    # #21: a reader follows each step of the flow on one screen; split the function into
    # named steps (a helper that says what the lines do) rather than raising the limit
    assert layout_graph.long_functions(graph, limit=50) == []


def test_no_plugin_imports_a_private_fxquant_module_or_name() -> None:
    assert layout_graph.plugin_private_imports() == []


def test_the_graph_sees_function_level_imports_and_skips_type_checking_ones(
    tmp_path: Path,
) -> None:
    package = tmp_path / "fxquant"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from fxquant import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fxquant import c\n"
        "from fxquant.a import f\n"
    )
    (package / "c.py").write_text("import fxquant.b\n")
    found = layout_graph.build_graph(tmp_path)
    assert layout_graph.cycles(found) == [["fxquant.a", "fxquant.b"]]


@pytest.mark.parametrize(("old", "new"), sorted(moved.MOVED.items()))
def test_an_old_import_path_warns_and_gives_the_module_at_its_new_path(old: str, new: str) -> None:
    # a fresh process: the warning is given once, on the first import
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        f"    module = importlib.import_module({old!r})\n"
        f"print(module is importlib.import_module({new!r}) or hasattr(module, '__path__'))\n"
        "print([str(w.message) for w in seen if w.category is DeprecationWarning])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    same, warnings = out.stdout.splitlines()
    assert same == "True"
    assert f"{old} moved to {new}" in warnings


def test_an_old_package_path_gives_its_submodules_once() -> None:
    with pytest.warns(DeprecationWarning, match="fxquant.lowering.kernels"):
        import fxquant.kernels.cpu
    import fxquant.lowering.kernels.cpu

    assert fxquant.kernels.cpu is fxquant.lowering.kernels.cpu
    assert fxquant.kernels.cpu.has_vnni is fxquant.lowering.kernels.cpu.has_vnni


def test_every_old_path_is_a_file_and_nothing_is_installed_on_the_meta_path() -> None:
    code = (
        "import sys; before = list(sys.meta_path); import fxquant; print(sys.meta_path == before)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "True"), out.stderr
    for old in [*moved.MOVED, *moved.CONTRACT_PATHS, *moved.OPTIONAL]:
        base = CORE.parent / old.replace(".", "/")
        assert base.with_suffix(".py").is_file() or (base / "__init__.py").is_file(), old


@pytest.mark.parametrize(("path", "new"), sorted(moved.CONTRACT_PATHS.items()))
def test_a_contract_submodule_reexports_its_numerics_module_without_a_warning(
    path: str, new: str
) -> None:
    contract, numerics = importlib.import_module(path), importlib.import_module(new)
    assert contract.__all__ == numerics.__all__
    assert all(getattr(contract, name) is getattr(numerics, name) for name in numerics.__all__)


@pytest.mark.parametrize(
    "old", sorted(o for o in {**moved.MOVED, **moved.CONTRACT_PATHS} if o.count(".") == 1)
)
def test_a_moved_top_level_module_is_an_attribute_of_a_bare_fxquant(old: str) -> None:
    # ``import fxquant; fxquant.fake_quantize.FakeQuantize`` worked while the package
    # imported the module itself; a fresh process, so no earlier import sets the attribute
    name = old.split(".")[1]
    code = (
        "import fxquant, importlib, warnings\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"print(fxquant.{name} is importlib.import_module({old!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "True"), out.stderr


# ------------------------------------------------------- optional parts (#21)
# distributions of their own (plugins/distributed, plugins/transformers); the core names them
# only in fxquant.moved's tables, and the facade imports the installed tracers by those names


def test_no_core_module_imports_an_optional_part(graph: layout_graph.Graph) -> None:
    optional = [new for new, _ in moved.OPTIONAL.values()]
    importers = sorted(
        {
            i.source
            for i in graph.imports
            if any(i.target == o or i.target.startswith(f"{o}.") for o in optional)
        }
    )
    assert importers == []


def test_an_optional_part_left_only_its_old_path_files_in_the_core() -> None:
    for old in moved.OPTIONAL:
        path = CORE.parent / old.replace(".", "/")
        files = [path.with_suffix(".py")] if path.with_suffix(".py").exists() else path.glob("*.py")
        for file in files:
            assert "redirect(__name__)" in file.read_text(), file


def test_a_tracer_part_is_a_distribution_of_its_own_with_no_backend() -> None:
    for package, distribution in moved.TRACERS.values():
        assert (package, distribution) in moved.OPTIONAL.values()
        folder = ROOT / "plugins" / distribution.removeprefix("fxquant-")
        meta = tomllib.loads((folder / "pyproject.toml").read_text())
        assert meta["project"]["name"] == distribution
        assert "entry-points" not in meta["project"]


@pytest.mark.parametrize(
    ("old", "new", "distribution"), [(o, *v) for o, v in moved.OPTIONAL.items()]
)
def test_an_optional_part_keeps_its_old_import_path_when_installed(
    old: str, new: str, distribution: str
) -> None:
    if importlib.util.find_spec(new) is None:
        pytest.skip(f"{distribution} is not installed")
    with pytest.warns(DeprecationWarning, match=new):
        old_module = importlib.import_module(old)
    package = importlib.import_module(new)
    assert old_module is package or old_module.__name__ == old  # a module, or a package of its own
    assert all(getattr(old_module, n) is getattr(package, n) for n in package.__all__)


@pytest.mark.parametrize(
    ("old", "new", "distribution"), [(o, *v) for o, v in moved.OPTIONAL.items()]
)
def test_an_optional_part_not_installed_names_the_distribution_to_install(
    old: str, new: str, distribution: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, new, None)  # what find_spec answers when it is missing
    for name in [m for m in sys.modules if m == old or m.startswith(f"{old}.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ModuleNotFoundError, match=f"pip install {distribution}") as error:
        importlib.import_module(old)
    assert error.value.name == old
    with pytest.raises(ModuleNotFoundError, match=f"pip install {distribution}"):
        importlib.import_module(f"{old}.a_submodule")


def _documented_imports() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("plugins/*/README.md")]
    found = []
    for page in pages:
        for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S):
            for module in re.findall(r"^\s*(?:from|import)\s+(fxquant[\w.]*)", block, re.M):
                found.append((page.relative_to(ROOT).as_posix(), module))
    return sorted(set(found))


def test_every_module_the_docs_import_is_a_file_at_its_real_path() -> None:
    # a reader opens the file a snippet names; an old path's file only redirects
    wrong = []
    for page, module in _documented_imports():
        if not module.startswith("fxquant.") or module.split(".")[0] != "fxquant":
            continue
        base = CORE.parent / module.replace(".", "/")
        path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if not path.is_file() or "redirect(__name__)" in path.read_text():
            wrong.append(f"{page}: {module}")
    assert wrong == []


# "#23" or "(#18)": an issue a reader of the code or of a page cannot open; an HTML entity
# (&#123;) and a six-digit colour (#a0b1c2, #123456) are not issue numbers
_ISSUE_TAG = re.compile(r"(?<![&\w])#\d{1,3}\b")


def _issue_citations(path: Path, base: Path = ROOT) -> list[str]:
    lines = path.read_text(errors="replace").splitlines()
    where = path.relative_to(base)
    return [
        f"{where}:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if _ISSUE_TAG.search(line)
    ]


def _sources_and_pages() -> list[Path]:
    plugins = ROOT / "plugins"
    found = [*CORE.rglob("*.py"), *plugins.glob("*/src/**/*.py"), *plugins.glob("*/README.md")]
    found += [*plugins.glob("*/pyproject.toml"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    return sorted(found)


def test_no_source_or_page_cites_an_issue_number() -> None:
    # a comment says why the code is as it is; the history behind it is in the commits
    cited = [hit for path in _sources_and_pages() for hit in _issue_citations(path)]
    assert cited == []


def test_an_issue_number_is_found_and_a_colour_or_a_noqa_is_not(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        'x = 1  # noqa: E501  # fill "#a0b1c2", "#123456", "&#123;"\ny = 2  # (#23)\n'
    )
    hits = [hit.partition(": ")[2] for hit in _issue_citations(sample, tmp_path)]
    assert hits == ["y = 2  # (#23)"]
