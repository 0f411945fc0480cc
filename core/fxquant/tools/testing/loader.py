"""Importing a Python file by path, for plugin tests that use the repository's model zoo.

Example:
    >>> import fxquant.tools.testing.loader as loader
    >>> load_module_from_path(loader.__file__, "a_copy_of_the_loader").__name__
    'a_copy_of_the_loader'
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

__all__ = [
    "load_module_from_path",
]


def load_module_from_path(path: str | Path, name: str) -> ModuleType:
    """Import the Python file ``path`` as the module ``name`` (registered in ``sys.modules``).

    For a plugin's tests that use the repository's model zoo (``tests/flow/zoo.py``):
    plugin tests run without the core's test package on ``sys.path``.

    Raises:
        FileNotFoundError: there is no file at ``path``.

    Example:
        >>> import fxquant.tools.testing
        >>> load_module_from_path(fxquant.tools.testing.__file__, "a_copy_of_the_kit").__name__
        'a_copy_of_the_kit'
    """
    import importlib.util

    file = Path(path)
    if not file.is_file():
        msg = f"no Python file at {file}"
        raise FileNotFoundError(msg)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None  # a .py file always has a spec
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module
