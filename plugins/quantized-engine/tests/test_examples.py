"""Every docstring example of the package holds (the plugin's own modules, run as doctests)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import fxquant_quantized_engine
import pytest

MODULES = [
    "fxquant_quantized_engine",
    *(
        f"fxquant_quantized_engine.{info.name}"
        for info in pkgutil.iter_modules(fxquant_quantized_engine.__path__)
    ),
]


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_of_each_module_hold(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
