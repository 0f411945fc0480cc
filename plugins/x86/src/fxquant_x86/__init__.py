"""fxquant-x86: the ``x86`` backend for fxquant (see README.md)."""

from __future__ import annotations

__version__ = "0.1.0"
