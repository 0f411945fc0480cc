"""Shared fixtures: the repository's model zoo (loaded by path) and one-thread timing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from fxquant.tools import testing

ZOO = Path(__file__).resolve().parents[3] / "tests" / "flow" / "zoo.py"


@pytest.fixture(scope="session")
def zoo() -> ModuleType:
    """``tests/flow/zoo.py`` of this repository (ResNet-, MobileNetV2-, BERT-like, SmallCNN).

    Loaded by path: plugin tests run without the core's test package on sys.path.
    """
    if not ZOO.exists():
        pytest.skip(f"the model zoo {ZOO} is not here (plugin installed outside the repository)")
    return testing.load_module_from_path(ZOO, "fxquant_repo_zoo")


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
