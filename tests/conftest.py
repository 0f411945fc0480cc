from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from tests import oracle


@pytest.fixture
def ao() -> Iterator[ModuleType]:
    """torch.ao.quantization as an oracle (skips when it is gone); releases its caches after."""
    module = oracle.load()
    try:
        yield module
    finally:
        oracle.release()
