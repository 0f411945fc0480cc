"""Old import paths of modules that moved, as plain files, and the optional parts' tables.

The core was reorganised into packages that show its layers (docs/design.md). Every path that
users imported before still imports: a small file sits at each old path (``fxquant/qdq.py``,
``fxquant/kernels/cpu.py``...) and calls :func:`redirect`, which warns once with a
``DeprecationWarning`` naming the new path and puts the module at the new path in its place,
so ``fxquant.qdq is fxquant.numerics.qdq`` and private names, ``isinstance`` and monkeypatching
through the old path behave as before. Nothing is installed on ``sys.meta_path``: every path
is a file a reader can open. An old *package* path keeps a package of its own (its
submodules' files live in it) that re-exports the new package's names.

The contract's own submodules ``fxquant.observer`` and ``fxquant.fake_quantize`` are not old
paths: they are files that re-export :mod:`fxquant.numerics` 's modules without a warning.

Optional parts left the core for distributions of their own (:data:`OPTIONAL`):
``import fxquant.distributed`` gives ``fxquant_distributed`` when ``fxquant-distributed`` is
installed, and otherwise raises ``ModuleNotFoundError`` naming the distribution to install.
Those that trace another library's models (:data:`TRACERS`: transformers' tracer, in
``fxquant-transformers``) register themselves in ``fxquant.flow.trace.MODEL_TRACERS`` when
imported, and ``import fxquant`` imports the installed ones (:func:`import_tracers`).

Example:
    >>> new_name("fxquant.kernels.cpu")
    'fxquant.lowering.kernels.cpu'
    >>> new_name("fxquant.flow.trace") is None
    True
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
import warnings
from typing import Final

__all__ = [
    "CONTRACT_PATHS",
    "MOVED",
    "OPTIONAL",
    "TRACERS",
    "import_tracers",
    "missing_optional_part",
    "new_name",
    "redirect",
    "tracer_hint",
]

#: old module (or package) path -> its new path. A package's submodules follow it.
MOVED: Final[dict[str, str]] = {
    "fxquant.kernels": "fxquant.lowering.kernels",
    "fxquant.lowering.lower": "fxquant.flow.lower",
    "fxquant.lowering.epilogues": "fxquant.flow.epilogues",
    "fxquant.numerics.equalization": "fxquant.flow.equalization.observers",
    "fxquant.flow.equalize": "fxquant.flow.equalization.prepare",
    "fxquant.flow.equalize_convert": "fxquant.flow.equalization.convert",
    "fxquant.patterns.reference": "fxquant.patterns.generic",
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

#: the contract's submodules, files that re-export the numerics modules without a warning
CONTRACT_PATHS: Final[dict[str, str]] = {
    "fxquant.observer": "fxquant.numerics.observer",
    "fxquant.fake_quantize": "fxquant.numerics.fake_quantize",
}

#: optional parts in distributions of their own: old package path -> (its package now,
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
                f"{distribution!r}, which is not installed; to install it: {_install(distribution)}"
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
    found = [package for package, _ in TRACERS.values() if _importable(package)]
    for package in found:
        importlib.import_module(package)
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
        f"not installed: {_install(distribution)}"
    )


def _install(distribution: str) -> str:
    folder = distribution.removeprefix("fxquant-")
    return f"pip install {distribution} (from a source checkout: pip install plugins/{folder})"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package that is missing
        return False


def redirect(old: str) -> types.ModuleType:
    """Put the module at ``old``'s new path in place of ``old`` (an old path's file calls it).

    Warns with a ``DeprecationWarning`` that names the new path; an optional part that is
    not installed raises ``ModuleNotFoundError`` naming the distribution instead. An old
    *package* keeps its own module object (its submodules' files live in it) and gets the new
    package's public names and a module ``__getattr__`` for the rest.

    Returns:
        The module at the new path.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True):
        ...     warnings.simplefilter("always")
        ...     import fxquant.qdq, fxquant.numerics.qdq
        >>> fxquant.qdq is fxquant.numerics.qdq
        True
    """
    missing = missing_optional_part(old)
    if missing is not None:
        raise missing
    new = new_name(old)
    if new is None:
        msg = f"{old!r} is not an old module path of fxquant (fxquant.moved.MOVED)"
        raise ValueError(msg)
    # stacklevel 3: the warning names the importer's line, not the old path's file
    warnings.warn(
        f"{old} moved to {new}; import {new} instead ({old} will be removed)",
        DeprecationWarning,
        stacklevel=3,
    )
    module = importlib.import_module(new)
    current = sys.modules[old]
    if hasattr(current, "__path__"):  # a package: keep it, so its submodules' files load
        public = getattr(module, "__all__", [n for n in vars(module) if not n.startswith("_")])
        vars(current).update({name: getattr(module, name) for name in public})
        vars(current)["__getattr__"] = functools.partial(getattr, module)
        return module
    sys.modules[old] = module  # the import system hands out what sys.modules holds
    return module
