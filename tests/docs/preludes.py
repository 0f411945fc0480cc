"""What a page's code blocks need that its prose sets up (for tests/docs/test_pages.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fxquant-mybackend" / "src"


def plugins(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """plugins.md installs docs/examples/fxquant-mybackend: here, its module is registered."""
    import fxquant
    import torch

    monkeypatch.syspath_prepend(str(EXAMPLE))
    for name in [m for m in sys.modules if m.startswith("fxquant_mybackend")]:
        monkeypatch.delitem(sys.modules, name)
    from fxquant_mybackend import plugin

    fxquant.register_plugin(plugin, backend="mybackend")
    monkeypatch.setattr("fxquant.registry.default_registry", fxquant.registry.default_registry)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    return {"model": model, "example_inputs": (torch.randn(2, 4),), "_registered": plugin}
