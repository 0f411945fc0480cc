"""`fxquant.registry.only_for`: a hook that answers for one backend only (#21)."""

from __future__ import annotations

import types

import pytest
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.registry import hookimpl, only_for
from fxquant.registry.manager import Registry

from tests.registry.conftest import Installed, config


def _plugin(name: str, installed: Installed, calls: list[tuple[str, bool]]) -> types.ModuleType:
    @only_for("mine")
    def fxquant_pattern_configs(backend: str) -> list[object]:
        return [config(name)]

    @only_for("mine")
    def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping:
        calls.append((backend, is_qat))
        return QConfigMapping()

    module = installed.module(
        f"plugin_{name}",
        fxquant_pattern_configs=fxquant_pattern_configs,
        fxquant_default_qconfig_mapping=fxquant_default_qconfig_mapping,
    )
    installed.add("mine", module.__name__, "fxquant-mine")
    installed.add("other", module.__name__, "fxquant-mine")
    return module


def test_a_hook_under_only_for_answers_its_backend_with_every_argument(
    installed: Installed,
) -> None:
    calls: list[tuple[str, bool]] = []
    _plugin("relu", installed, calls)
    registry = Registry()
    assert [c.pattern for c in registry.get_backend_config("mine").configs] == ["relu"]
    registry.get_default_qconfig_mapping("mine", is_qat=True)
    assert calls == [("mine", True)]


def test_a_hook_under_only_for_has_nothing_for_another_backend(installed: Installed) -> None:
    calls: list[tuple[str, bool]] = []
    _plugin("relu", installed, calls)
    assert Registry().get_backend_config("other").configs == []
    assert calls == []


def test_only_for_keeps_the_hooks_name_docstring_and_signature() -> None:
    @only_for("mine")
    def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> str:
        """The mapping."""
        return "m"

    assert fxquant_default_qconfig_mapping.__name__ == "fxquant_default_qconfig_mapping"
    assert fxquant_default_qconfig_mapping.__doc__ == "The mapping."
    hook = hookimpl(fxquant_default_qconfig_mapping)
    assert hook("other", is_qat=False) is None


@pytest.mark.parametrize("plugin", ["x86", "onednn", "fbgemm", "qnnpack", "tensorrt", "executorch"])
def test_first_party_plugins_answer_no_other_backend(plugin: str) -> None:
    module = pytest.importorskip(f"fxquant_{plugin}.plugin")
    assert module.fxquant_pattern_configs("not-" + plugin) is None
    assert module.fxquant_default_qconfig_mapping("not-" + plugin, False) is None
    if hasattr(module, "fxquant_graph_mode"):  # tensorrt's transformer mode (#23)
        assert module.fxquant_graph_mode("not-" + plugin, None, None, False) is None
