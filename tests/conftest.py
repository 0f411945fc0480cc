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
PROFILE = os.environ.get("FXQUANT_HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI") else "default"
)
settings.load_profile(PROFILE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under "quick", a test's own ``@settings(max_examples=N)`` is capped at the profile's 20 too
    (``nox -s fuzz`` runs the N). hypothesis reads a test's settings from this attribute when the
    test runs; were it renamed, the tests would run their own N, slower but the same checks."""
    if PROFILE != "quick":
        return
    cap = settings.get_profile("quick").max_examples
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if isinstance(own, settings) and own.max_examples > cap:
            test._hypothesis_internal_use_settings = settings(own, max_examples=cap)


@pytest.fixture
def ao() -> Iterator[ModuleType]:
    """torch.ao.quantization as an oracle (skips when it is gone); releases its caches after."""
    module = oracle.load()
    try:
        yield module
    finally:
        oracle.release()
