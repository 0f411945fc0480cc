"""Old import paths of modules that moved (#21): ``import fxquant.kernels.cpu`` keeps working.

The core was reorganised into packages that show its layers (docs/design.md). Every path that
docs, tests, plugins or users imported before still imports, and gives the *same module
object* as the new path (``fxquant.kernels.cpu is fxquant.lowering.kernels.cpu``), so private
names, ``isinstance`` and monkeypatching through the old path behave as before.

No file is left at an old path: a finder at the front of ``sys.meta_path`` (installed by
``import fxquant``) answers only for the names of :data:`MOVED` and their submodules, and
loads the new module under the old name. Keeping old paths as table entries rather than
files lets git follow each move as a rename.

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

__all__ = ["MOVED", "install", "new_name"]

#: old module (or package) path -> its new path. A package's submodules follow it.
MOVED: Final[dict[str, str]] = {
    "fxquant.kernels": "fxquant.lowering.kernels",
    "fxquant.flow.lower": "fxquant.lowering.lower",
    "fxquant.flow.epilogues": "fxquant.lowering.epilogues",
    "fxquant.observer": "fxquant.numerics.observer",
    "fxquant.fake_quantize": "fxquant.numerics.fake_quantize",
    "fxquant.qdq": "fxquant.numerics.qdq",
    "fxquant.patterns._common": "fxquant.patterns.builders",
    "fxquant.cli": "fxquant.tools.cli",
    "fxquant.conformance": "fxquant.tools.conformance",
    "fxquant.demo": "fxquant.tools.demo",
    "fxquant.registry.describe": "fxquant.tools.describe",
    "fxquant.scaffold": "fxquant.tools.scaffold",
    "fxquant.testing": "fxquant.tools.testing",
}


def new_name(old: str) -> str | None:
    """The new path of module ``old``, or None when it did not move.

    Example:
        >>> new_name("fxquant.kernels.boundary")
        'fxquant.lowering.kernels.boundary'
    """
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(f"{prefix}."):
            return target + old[len(prefix) :]
    return None


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
