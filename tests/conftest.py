from __future__ import annotations

import os
from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

from tests import oracle

# The machine is shared: no per-example deadline, fewer examples on CI. `nox -s tests` runs
# the "quick" profile (FXQUANT_HYPOTHESIS_PROFILE=quick: its 30-minute budget); `nox -s fuzz`
# reruns every property test under "default".
settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=100
)
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60
)
settings.register_profile(
    "quick", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=20
)
settings.load_profile(
    os.environ.get("FXQUANT_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default")
)


@pytest.fixture
def ao() -> Iterator[ModuleType]:
    """torch.ao.quantization as an oracle (skips when it is gone); releases its caches after."""
    module = oracle.load()
    try:
        yield module
    finally:
        oracle.release()
