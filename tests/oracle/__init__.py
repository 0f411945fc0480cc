"""torch.ao.quantization as a reference oracle, with its quirks kept in one place.

Tests compare fxquant against torch.ao where it still exists, and skip where it is gone.
Quirks handled here (measured on torch 2.13):

- ``get_*_backend_config()`` crashes in a fresh process unless
  ``torch.ao.quantization.backend_config.utils`` is imported first;
- its FX flow keeps every model alive through a ``functools.cache`` on
  ``fx.utils.assert_and_get_unique_device``: :func:`release` clears it;
- it warns on every call (deprecation, quint8 tensor creation): :func:`quiet`
  silences those so ``filterwarnings = error`` applies to fxquant alone.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator
from types import ModuleType

import pytest


def load() -> ModuleType:
    """Return ``torch.ao.quantization`` ready for use, or skip the test."""
    with quiet():
        ao = pytest.importorskip("torch.ao.quantization")
        importlib.import_module("torch.ao.quantization.backend_config.utils")
        importlib.import_module("torch.ao.quantization.backend_config")
        importlib.import_module("torch.ao.quantization.quantize_fx")
    return ao


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence torch.ao's deprecation and quantized-dtype warnings inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message=r".*quantiz.*", category=UserWarning)
        warnings.filterwarnings("ignore", message=r".*deprecat.*", category=UserWarning)
        yield


def release() -> None:
    """Drop the models torch.ao's flow keeps alive through its device cache."""
    with contextlib.suppress(ImportError, AttributeError):
        utils = importlib.import_module("torch.ao.quantization.fx.utils")
        utils.assert_and_get_unique_device.cache_clear()
