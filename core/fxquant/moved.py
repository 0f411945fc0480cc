"""Old import paths of modules that moved (#21): ``import fxquant.kernels.cpu`` keeps working.

The core was reorganised into packages that show its layers (docs/design.md). Every path that
docs, tests, plugins or users imported before still imports, and gives the *same module
object* as the new path (``fxquant.kernels.cpu is fxquant.lowering.kernels.cpu``), so private
names, ``isinstance`` and monkeypatching through the old path behave as before.

No file is left at an old path: a finder at the front of ``sys.meta_path`` (installed by
``import fxquant``) answers only for the names of :data:`MOVED` and their submodules, and
loads the new module under the old name. Keeping old paths as table entries rather than
files lets git follow each move as a rename.

Optional parts left the core for distributions of their own (:data:`OPTIONAL`):
``import fxquant.distributed`` gives ``fxquant_distributed`` when ``fxquant-distributed`` is
installed, and otherwise raises ``ModuleNotFoundError`` naming the distribution to install.
Those that trace another library's models (:data:`TRACERS`: transformers' tracer, in
``fxquant-transformers``) register themselves in ``fxquant.flow.trace.MODEL_TRACERS`` when
imported, and ``import fxquant`` imports the installed ones (:func:`import_tracers`).

Example:
    >>> import fxquant.kernels.cpu, fxquant.lowering.kernels.cpu
    >>> fxquant.kernels.cpu is fxquant.lowering.kernels.cpu
    True
    >>> new_name("fxquant.flow.lower")
    'fxquant.lowering.lower'
    >>> new_name("fxquant.flow.trace") is None
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Final

__all__ = [
    "MOVED",
    "OPTIONAL",
    "TRACERS",
    "import_tracers",
    "install",
    "missing_optional_part",
    "new_name",
    "tracer_hint",
]

#: old module (or package) path -> its new path. A package's submodules follow it.
MOVED: Final[dict[str, str]] = {
    "fxquant.kernels": "fxquant.lowering.kernels",
    "fxquant.flow.lower": "fxquant.lowering.lower",
    "fxquant.flow.epilogues": "fxquant.lowering.epilogues",
    "fxquant.observer": "fxquant.numerics.observer",
    "fxquant.fake_quantize": "fxquant.numerics.fake_quantize",
    "fxquant.qdq": "fxquant.numerics.qdq",
    "fxquant.patterns._common": "fxquant.patterns.builders",
    "fxquant.calibration": "fxquant.tools.calibration",
    "fxquant.checkpoint": "fxquant.tools.checkpoint",
    "fxquant.cli": "fxquant.tools.cli",
    "fxquant.conformance": "fxquant.tools.conformance",
    "fxquant.demo": "fxquant.tools.demo",
    "fxquant.export": "fxquant.tools.export",
    "fxquant.registry.describe": "fxquant.tools.describe",
    "fxquant.progress": "fxquant.tools.progress",
    "fxquant.quiet": "fxquant.tools.quiet",
    "fxquant.scaffold": "fxquant.tools.scaffold",
    "fxquant.testing": "fxquant.tools.testing",
}

#: optional parts in distributions of their own (#21): old package path -> (its package now,
#: the distribution that holds it). No core module imports them.
OPTIONAL: Final[dict[str, tuple[str, str]]] = {
    "fxquant.distributed": ("fxquant_distributed", "fxquant-distributed"),
    "fxquant.flow.hf_trace": ("fxquant_transformers", "fxquant-transformers"),
}

#: optional parts that trace another library's models: that library's top-level package ->
#: (the part's package, its distribution). Each registers its tracer in
#: ``fxquant.flow.trace.MODEL_TRACERS`` on import.
TRACERS: Final[dict[str, tuple[str, str]]] = {
    "transformers": ("fxquant_transformers", "fxquant-transformers"),
}


def new_name(old: str) -> str | None:
    """The new path of module ``old``, or None when it did not move.

    Example:
        >>> new_name("fxquant.kernels.boundary")
        'fxquant.lowering.kernels.boundary'
        >>> new_name("fxquant.distributed.merge")  # an optional part: its distribution's package
        'fxquant_distributed.merge'
    """
    moves = {**MOVED, **{path: target for path, (target, _) in OPTIONAL.items()}}
    for prefix, target in moves.items():
        if old == prefix or old.startswith(f"{prefix}."):
            return target + old[len(prefix) :]
    return None


def missing_optional_part(old: str) -> ModuleNotFoundError | None:
    """The error for importing ``old`` when it is an optional part that is not installed.

    Example:
        >>> missing_optional_part("fxquant.flow") is None
        True
    """
    for prefix, (target, distribution) in OPTIONAL.items():
        if (old == prefix or old.startswith(f"{prefix}.")) and not _importable(target):
            msg = (
                f"{old!r} is an optional part of fxquant, in the distribution "
                f"{distribution!r} (#21), which is not installed; to install it: pip install "
                f"{distribution} (from a source checkout: pip install plugins/"
                f"{distribution.removeprefix('fxquant-')})"
            )
            return ModuleNotFoundError(msg, name=old)
    return None


def import_tracers() -> list[str]:
    """Import the installed parts of :data:`TRACERS` (each registers its tracer); their names.

    ``import fxquant`` calls it, after the flow: the flow itself imports no optional part.

    Example:
        >>> set(import_tracers()) <= {package for package, _ in TRACERS.values()}
        True
    """
    found = []
    for package, _ in TRACERS.values():
        if _importable(package):
            importlib.import_module(package)
            found.append(package)
    return found


def tracer_hint(model_class: type) -> str:
    """What to install when ``model_class`` comes from a library traced by a missing part.

    Empty when that part is imported, or when no part traces the class's library.

    Example:
        >>> tracer_hint(int)
        ''
    """
    library = model_class.__module__.partition(".")[0]
    package, distribution = TRACERS.get(library, ("", ""))
    if not package or package in sys.modules:
        return ""
    return (
        f"; {library} models are traced by fxquant's optional part {distribution!r}, which is "
        f"not installed: pip install {distribution} (from a source checkout: pip install "
        f"plugins/{distribution.removeprefix('fxquant-')})"
    )


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package that is missing
        return False


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # a placeholder module; exec_module puts the real one in its place

    def exec_module(self, module: types.ModuleType) -> None:
        # the import system returns what sys.modules holds under the name after exec
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        missing = missing_optional_part(fullname)
        if missing is not None:
            raise missing  # rather than "No module named ...": say what to install
        new = new_name(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None  # not moved, or no such module at the new path either
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once; importing this module does it).

    First: the path finder would otherwise load a moved package's submodule a second time
    under its old name.

    Example:
        >>> install(); sum(isinstance(f, _MovedFinder) for f in sys.meta_path)
        1
    """
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


install()  # on import: `import fxquant` imports this module first (#21)
