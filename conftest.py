"""Hypothesis profiles for every test under this repository: the core's (tests/, the doctests
in core/) and each plugin's (plugins/*/tests), so a plugin's property tests run under the same
budget and the same determinism as the core's.

The machine is shared: no per-example deadline anywhere. ``nox -s tests`` runs "quick"
(FXQUANT_HYPOTHESIS_PROFILE=quick: 20 examples, derandomized, so a CI run is a function of the
commit: a property test cannot fail there by the luck of the draw); ``nox -s fuzz`` reruns every
property test under "default" (100 examples, a fresh random draw each run) to explore.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from fxquant import moved
from hypothesis import HealthCheck, settings


def _old_path_files() -> list[str]:
    """The files at fxquant's old module paths: importing one warns (a DeprecationWarning, an
    error under this suite's filterwarnings), so the doctest collection of core/ skips them;
    tests/test_layout.py imports each on purpose."""
    core = Path(__file__).parent / "core"
    found = []
    for old in [*moved.MOVED, *moved.OPTIONAL]:
        base = core / old.replace(".", "/")
        for path in (base, base.with_suffix(".py")):
            if path.exists():
                found.append(os.fspath(path.relative_to(Path(__file__).parent)))
    return found


collect_ignore = _old_path_files()

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("default", max_examples=100, **_COMMON)
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("quick", max_examples=20, derandomize=True, **_COMMON)
PROFILE = os.environ.get("FXQUANT_HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI") else "default"
)
settings.load_profile(PROFILE)


def _torchvision_importable() -> None:
    """Where torchvision is installed (nox's tests, zoo and matrix sessions), define the op
    schemas its import needs on the CPU torch before any test runs: transformers imports
    torchvision whenever it is installed (its image utilities), so without them every
    transformers test fails at import, not only the zoo's torchvision models."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        from tests.zoo import torchvision_models

        # a dependency of its own missing (Pillow): the tests that need it say so
        with contextlib.suppress(ImportError):
            torchvision_models.load()


_torchvision_importable()


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
