"""The backend keeps fxquant's plugin contract: the checks of ``fxquant check mybackend``."""

import pytest
from fxquant.tools.conformance import conformance_checks

BACKEND = "mybackend"


@pytest.mark.parametrize("check", conformance_checks(BACKEND), ids=str)
def test_backend_keeps_the_plugin_contract(check):
    check(BACKEND)
