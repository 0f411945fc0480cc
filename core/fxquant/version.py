"""The core's version, a leaf: the registry checks plugins' ``requires`` against it
(``fxquant/__init__`` imports the registry, so the registry cannot import ``fxquant``).

Example:
    >>> from fxquant import __version__
    >>> __version__ == VERSION
    True
"""

from __future__ import annotations

from typing import Final

__all__ = ["VERSION"]

VERSION: Final = "0.1.0"
