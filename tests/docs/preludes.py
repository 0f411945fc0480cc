"""What a page's code blocks need that its prose sets up (for tests/docs/test_pages.py).

Each prelude gets pytest's ``monkeypatch`` and ``request`` (for clean-up) and
returns the names the page's blocks use without defining them.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fxquant-mybackend" / "src"


def plugins(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> dict[str, object]:
    """plugins.md installs docs/examples/fxquant-mybackend: here, its module is registered."""
    import fxquant
    import torch

    monkeypatch.syspath_prepend(str(EXAMPLE))
    for name in [m for m in sys.modules if m.startswith("fxquant_mybackend")]:
        monkeypatch.delitem(sys.modules, name)
    from fxquant_mybackend import plugin

    fxquant.register_plugin(plugin, backend="mybackend")
    request.addfinalizer(lambda: fxquant.unregister_plugin(plugin))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    # "x86 plus my_config": a pattern x86 does not configure, so adding it is no conflict
    int8 = fxquant.DTypeConfig(input_dtype=torch.uint8, output_dtype=torch.uint8)
    my_config = fxquant.BackendPatternConfig(torch.nn.Softplus).add_dtype_config(int8)
    return {"model": model, "example_inputs": (torch.randn(2, 4),), "my_config": my_config}


def distributed(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> dict[str, object]:
    """distributed.md's recipes on one rank: what torchrun would set, and the user's objects.

    A group of one runs every collective the recipes call (plugins/distributed/tests run them
    on two processes and check the results); here the page's code must run as written.
    """
    import fxquant
    import torch
    import torch.distributed as dist

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    request.addfinalizer(lambda: dist.is_initialized() and dist.destroy_process_group())
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten()
    )
    data = [(torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))) for _ in range(2)]
    return {
        "torch": torch,
        "model": model,
        "mapping": fxquant.get_default_qconfig_mapping("reference"),
        "qat_mapping": fxquant.get_default_qconfig_mapping("reference", is_qat=True),
        "example_inputs": (torch.randn(1, 3, 8, 8),),
        "batches": [images for images, _ in data],
        "my_shard": data,
        "loss_fn": lambda output, labels: output.square().mean(),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.01),
    }
