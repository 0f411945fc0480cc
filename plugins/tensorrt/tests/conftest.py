"""Shared fixtures: the repository's model zoo (loaded by path) and one-thread timing."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

ZOO = Path(__file__).resolve().parents[3] / "tests" / "flow" / "zoo.py"


@pytest.fixture(scope="session")
def zoo() -> ModuleType:
    """``tests/flow/zoo.py`` of this repository (ResNet-, MobileNetV2-, BERT-like, SmallCNN).

    Loaded by path: plugin tests run without the core's test package on sys.path.
    """
    if not ZOO.exists():
        pytest.skip(f"the model zoo {ZOO} is not here (plugin installed outside the repository)")
    spec = importlib.util.spec_from_file_location("fxquant_repo_zoo", ZOO)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
