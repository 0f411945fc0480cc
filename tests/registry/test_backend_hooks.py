"""Each backend's hook implementations read like the hookspecs they implement."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points

import pytest
from fxquant.registry import hookspecs

_HOOKSPECS = {
    name: spec
    for name, spec in vars(hookspecs).items()
    if name.startswith("fxquant_") and inspect.isfunction(spec)
}
_PLUGIN_MODULES = sorted(
    {point.value.partition(":")[0] for point in entry_points(group="fxquant.backends")}
)


@pytest.mark.parametrize("module_name", _PLUGIN_MODULES)
def test_each_hook_implementation_carries_its_hookspec_name_and_arguments(
    module_name: str,
) -> None:
    """help() and tracebacks show the hook's name, and its arguments are the hookspec's."""
    module = importlib.import_module(module_name)
    impls = {name: getattr(module, name) for name in _HOOKSPECS if hasattr(module, name)}
    assert impls, f"{module_name} implements no hook"
    for name, impl in impls.items():
        assert (impl.__name__, inspect.unwrap(impl).__code__.co_name) == (name, name)
        spec = inspect.signature(_HOOKSPECS[name]).parameters
        assert list(inspect.signature(impl).parameters.values()) == list(spec.values()), name
