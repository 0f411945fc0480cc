"""The ``backend`` fixture: one parameter per first-party CPU backend, skipped when not installed.

A backend counts as installed when ``fxquant.list_backends()`` names it (found from entry
points without importing the plugin); a plugin that is installed but fails to load is not
skipped: its tests fail, which is the finding.
"""

from __future__ import annotations

import fxquant
import pytest

FIRST_PARTY = ("x86", "fbgemm", "qnnpack", "onednn")
"""The four CPU backends of issue 5, in the order the tests report them."""


def installed_first_party() -> list[str]:
    """The first-party backends that are installed, in :data:`FIRST_PARTY` order."""
    installed = set(fxquant.list_backends())
    return [name for name in FIRST_PARTY if name in installed]


@pytest.fixture(params=FIRST_PARTY)
def backend(request: pytest.FixtureRequest) -> str:
    """The name of one first-party backend; the test is skipped when it is not installed."""
    name: str = request.param
    if name not in installed_first_party():
        pytest.skip(f"backend {name!r} is not installed (pip install -e plugins/{name})")
    return name


@pytest.fixture
def qat_backend() -> str:
    """x86 when installed (the x86 default), else the first installed first-party backend."""
    installed = installed_first_party()
    if not installed:
        pytest.skip(f"none of {', '.join(FIRST_PARTY)} is installed")
    return "x86" if "x86" in installed else installed[0]
