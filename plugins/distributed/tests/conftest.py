"""The hypothesis profile of the core's tests (tests/conftest.py), which these tests ran under
before they moved here (#21): the machine is shared, so no per-example deadline."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

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
