"""Measures the core's layout (#21): lines per package, the import graph, long functions, and
plugins' imports of private fxquant names. tests/test_layout.py asserts on these figures;
``python tests/layout_graph.py`` prints them (the before/after table of #21).

Definitions (the same code gives every figure):
- a *line* is a physical line holding a token other than a comment (docstrings count, blank
  and comment-only lines do not), over every ``.py`` file of ``core/fxquant``;
- an *import edge* is any ``import``/``from ... import`` in a module, at module level or inside
  a function, except under ``if TYPE_CHECKING:``; ``from P import n`` points at module ``P.n``
  when that is a module of the core, else at ``P``; parents are not implied;
- a *cycle* is a strongly connected component of more than one module of that graph;
- a function's *length* is its line count (as above) without its docstring.
- a *code line* (the mechanism's size target) is a line outside every docstring: a module's,
  class's or function's, and PEP 257's attribute docstrings (a string right after an
  assignment in a module, a class or ``__init__``), in ``ruff format``'s layout (the core
  holds no ``fmt: skip``: tests/test_layout.py), so packing a table tighter moves no count.
"""

from __future__ import annotations

import ast
import io
import itertools
import sys
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
PLUGINS = ROOT / "plugins"
SKIPPED_TOKENS = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


@dataclass(frozen=True, slots=True)
class Module:
    name: str  # fxquant.flow.match
    path: Path
    tree: ast.Module
    code_lines: frozenset[int]

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@dataclass(frozen=True, slots=True)
class Import:
    source: str  # the importing module
    target: str  # the imported name, resolved to a module of the core when it is one
    line: int
    names: tuple[str, ...] = ()  # the names of a ``from`` import
    in_function: bool = False


@dataclass(slots=True)
class Graph:
    modules: dict[str, Module]
    imports: list[Import] = field(default_factory=list)

    def edges(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {name: set() for name in self.modules}
        for imp in self.imports:
            if imp.target in self.modules and imp.target != imp.source:
                out[imp.source].add(imp.target)
        return out


def code_lines(text: str) -> frozenset[int]:
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in SKIPPED_TOKENS:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return frozenset(lines)


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load_modules(base: Path = CORE, package: str = "fxquant") -> dict[str, Module]:
    found = {}
    for path in sorted((base / package).rglob("*.py")):
        text = path.read_text()
        name = module_name(path, base)
        found[name] = Module(name, path, ast.parse(text), code_lines(text))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ast.unparse(test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}


def _walk_imports(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _walk_imports(other, in_function)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_function
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _walk_imports(child, inner)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports_of(module: Module, known: Iterable[str]) -> Iterator[Import]:
    known = set(known)
    for node, in_function in _walk_imports(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module.name, alias.name, node.lineno, (), in_function)
            continue
        base = _absolute(module, node)
        names = tuple(alias.name for alias in node.names)
        submodules = [f"{base}.{n}" for n in names if f"{base}.{n}" in known]
        for target in submodules:
            yield Import(module.name, target, node.lineno, (), in_function)
        rest = tuple(n for n in names if f"{base}.{n}" not in known)
        if rest or not submodules:
            yield Import(module.name, base, node.lineno, rest, in_function)


def build_graph(base: Path = CORE, package: str = "fxquant") -> Graph:
    modules = load_modules(base, package)
    graph = Graph(modules)
    for module in modules.values():
        graph.imports.extend(imports_of(module, modules))
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    edges = graph.edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def function_lengths(module: Module) -> Iterator[tuple[str, int]]:
    """(qualified name, length) of every function of the module."""

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                span = set(range(child.lineno, (child.end_lineno or child.lineno) + 1))
                doc = ast.get_docstring(child, clean=False)
                if doc is not None:
                    first = child.body[0]
                    span -= set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
                yield name, len(span & module.code_lines)
                yield from visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(module.tree, f"{module.name}:")


def long_functions(graph: Graph, limit: int = 50) -> list[tuple[str, int]]:
    return sorted(
        ((name, n) for m in graph.modules.values() for name, n in function_lengths(m) if n > limit),
        key=lambda item: -item[1],
    )


def lines_by_package(graph: Graph, depth: int = 2) -> dict[str, int]:
    """Lines per package: ``fxquant.flow`` for everything under flow/, ``fxquant.<module>`` for
    a top-level module."""
    out: dict[str, int] = {}
    for module in graph.modules.values():
        key = ".".join(module.name.split(".")[:depth])
        out[key] = out.get(key, 0) + len(module.code_lines)
    return dict(sorted(out.items(), key=lambda item: -item[1]))


def lines_without_tools(graph: Graph) -> int:
    """The core's lines but those of ``fxquant.tools`` (the cli, demo, scaffold, conformance,
    testing kit, describe, the numerics debugger and fallback, export, calibration,
    checkpoint, progress, quiet): the figure #21 bounds."""
    return sum(
        len(m.code_lines)
        for m in graph.modules.values()
        if not (m.name == "fxquant.tools" or m.name.startswith("fxquant.tools."))
    )


def _is_string(statement: ast.stmt) -> bool:
    value = statement.value if isinstance(statement, ast.Expr) else None
    return isinstance(value, ast.Constant) and isinstance(value.value, str)


def _docstrings(node: ast.AST) -> Iterator[ast.stmt]:
    """A node's docstring and, in a module, a class or ``__init__``, its attribute docstrings.

    An attribute docstring is PEP 257's string literal right after an assignment (Sphinx and
    IDEs show it as the attribute's documentation).
    """
    body: list[ast.stmt] = getattr(node, "body", [])
    if body and _is_string(body[0]):
        yield body[0]
    if isinstance(node, ast.Module | ast.ClassDef) or getattr(node, "name", "") == "__init__":
        for before, statement in itertools.pairwise(body):
            if isinstance(before, ast.Assign | ast.AnnAssign) and _is_string(statement):
                yield statement


def docstring_lines(module: Module) -> frozenset[int]:
    """The lines of the module's, its classes' and its functions' docstrings, attributes' too."""
    found: set[int] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            for doc in _docstrings(node):
                found.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    return frozenset(found)


def code_lines_without_tools(graph: Graph) -> int:
    """As :func:`lines_without_tools`, without docstring lines (the code-line target)."""
    return sum(
        len(m.code_lines - docstring_lines(m))
        for m in graph.modules.values()
        if not (m.name == "fxquant.tools" or m.name.startswith("fxquant.tools."))
    )


def _is_private(dotted: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))


def plugin_private_imports(plugins: Path = PLUGINS) -> list[str]:
    """Every import in a plugin's source of a ``_``-prefixed fxquant module or name."""
    hits = []
    for src in sorted(plugins.glob("*/src")):
        for package in sorted(p for p in src.iterdir() if p.is_dir()):
            for name, module in load_modules(src, package.name).items():
                for imp in imports_of(module, ()):
                    if imp.target.split(".")[0] != "fxquant":
                        continue
                    private = [n for n in imp.names if _is_private(n)]
                    if _is_private(imp.target) or private:
                        what = ", ".join(private) or imp.target
                        hits.append(f"{name}:{imp.line}: {imp.target}: {what}")
    return hits


def report(graph: Graph, out: object = sys.stdout) -> None:
    def say(*parts: object) -> None:
        print(*parts, file=out)  # type: ignore[call-overload]

    total = sum(len(m.code_lines) for m in graph.modules.values())
    say(f"core/fxquant: {total} lines in {len(graph.modules)} modules")
    say(f"core without fxquant.tools: {lines_without_tools(graph)} lines (#21's target: 15000)")
    code = code_lines_without_tools(graph)
    say(f"core without fxquant.tools, docstrings left out: {code} code lines (target: 12500)")
    for package, n in lines_by_package(graph).items():
        say(f"  {package:40} {n:6}")
    function_level = [i for i in graph.imports if i.in_function and i.target in graph.modules]
    say(f"function-level imports of core modules: {len(function_level)}")
    found = cycles(graph)
    say(f"import cycles (strongly connected components): {len(found)}")
    for component in found:
        say("  " + " <-> ".join(component))
    longs = long_functions(graph)
    say(f"functions over 50 lines: {len(longs)}")
    for name, n in longs:
        say(f"  {n:4} {name}")
    private = plugin_private_imports()
    say(f"plugin imports of private fxquant modules/names: {len(private)}")
    for hit in private:
        say(f"  {hit}")


if __name__ == "__main__":
    report(build_graph())
