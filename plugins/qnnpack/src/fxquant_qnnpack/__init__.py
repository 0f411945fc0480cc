"""fxquant-qnnpack: the ``qnnpack`` backend of fxquant (see README.md)."""

from __future__ import annotations

__version__ = "0.1.0"
