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
settings.load_profile("ci" if os.environ.get("CI") else "default")
