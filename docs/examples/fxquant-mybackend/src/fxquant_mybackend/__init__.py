"""fxquant-mybackend: the mybackend backend for fxquant."""

__version__ = "0.1.0"
