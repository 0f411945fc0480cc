"""The registry: discovery, assembly, isolation of failures, caching, registration."""

from __future__ import annotations

import itertools
import sys
import threading
import types
from typing import Any

import pytest
import torch
from fxquant.errors import (
    ConfigError,
    PluginAPIVersionError,
    PluginConflictError,
    PluginError,
    UnknownBackendError,
    extension_skipped_warning,
)
from fxquant.registry import Override, hookimpl
from fxquant.registry.install import checkout_root, install_command, install_hint
from fxquant.registry.loading import PluginInfo, PluginStatus
from fxquant.registry.manager import Registry

from tests.registry.conftest import FakeDist, Installed, config

relu, linear, conv = torch.nn.ReLU, torch.nn.Linear, torch.nn.Conv2d


def patterns_of(registry: Registry, name: str) -> list[Any]:
    return [c.pattern for c in registry.get_backend_config(name).configs]


# --- discovery -----------------------------------------------------------------------------------


def test_list_backends_is_sorted_includes_reference_and_imports_no_plugin(
    installed: Installed, registry: Registry
) -> None:
    installed.add("zeta", "not_a_module_zeta", dist="fxquant-zeta")
    installed.add("alpha", "not_a_module_alpha", dist="fxquant-alpha")
    assert registry.list_backends() == ["alpha", "reference", "zeta"]
    assert "not_a_module_zeta" not in sys.modules
    assert "not_a_module_alpha" not in sys.modules


def test_get_backend_config_imports_only_the_entry_points_of_that_backend(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("mine", "fxquant-mine", linear)
    installed.add("other", "not_a_module_other", dist="fxquant-other")
    assert patterns_of(registry, "mine") == [linear]
    assert "not_a_module_other" not in sys.modules


def test_several_distributions_contribute_to_one_backend(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("x86", "fxquant-x86", linear, conv)
    installed.patterns("x86", "fxquant-x86-extra", relu)
    assert patterns_of(registry, "x86") == [linear, conv, relu]


@pytest.mark.parametrize(
    "order", list(itertools.permutations(["fxquant-b", "fxquant-c", "fxquant-a"]))
)
def test_assembly_order_does_not_depend_on_install_order(
    installed: Installed, registry: Registry, order: tuple[str, ...]
) -> None:
    ops = {"fxquant-a": linear, "fxquant-b": conv, "fxquant-c": relu}
    for dist in order:
        installed.patterns("x86", dist, ops[dist])
    assert patterns_of(registry, "x86") == [linear, conv, relu]


def test_tryfirst_and_trylast_move_a_plugin_to_the_front_or_the_back(
    installed: Installed, registry: Registry
) -> None:
    def late(backend: str) -> list[Any]:
        return [config(linear)]

    def early(backend: str) -> list[Any]:
        return [config(relu)]

    late_module = types.ModuleType("late_plugin")
    late_module.fxquant_pattern_configs = hookimpl(trylast=True)(late)  # type: ignore[attr-defined]
    early_module = types.ModuleType("early_plugin")
    early_module.fxquant_pattern_configs = hookimpl(tryfirst=True)(early)  # type: ignore[attr-defined]
    installed.monkeypatch.setitem(sys.modules, "late_plugin", late_module)
    installed.monkeypatch.setitem(sys.modules, "early_plugin", early_module)
    installed.add("x86", "late_plugin", dist="fxquant-a")
    installed.patterns("x86", "fxquant-b", conv)
    installed.add("x86", "early_plugin", dist="fxquant-c")
    assert patterns_of(registry, "x86") == [relu, conv, linear]


def test_a_distribution_visible_twice_on_sys_path_loads_once(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("x86", "fxquant-x86", linear)
    # the same distribution further down sys.path (e.g. an older copy), under its folder spelling
    installed.dists.append(FakeDist("fxquant_x86", "0.9", entry_points=[("x86", "older_copy")]))
    assert patterns_of(registry, "x86") == [linear]
    assert installed.imported == ["plugin_fxquant_x86_x86"]


def test_a_plugin_that_ignores_backend_cannot_leak_into_another_backend(
    installed: Installed, registry: Registry
) -> None:
    installed.module("greedy", fxquant_pattern_configs=lambda backend: [config(conv)])
    installed.add("greedy", "greedy", dist="fxquant-greedy")
    installed.patterns("x86", "fxquant-x86", linear)
    assert patterns_of(registry, "x86") == [linear]
    assert patterns_of(registry, "greedy") == [conv]


# --- conflicts and overrides ---------------------------------------------------------------------


def test_two_distributions_configuring_one_pattern_is_a_conflict_naming_both(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("x86", "fxquant-x86", linear)
    installed.patterns("x86", "fxquant-x86-extra", linear)
    with pytest.raises(PluginConflictError) as caught:
        registry.get_backend_config("x86")
    assert str(caught.value) == (
        "backend 'x86': pattern Linear is configured by both fxquant-x86 1.0 (entry point "
        "'x86 = plugin_fxquant_x86_x86') and fxquant-x86-extra 1.0 (entry point "
        "'x86 = plugin_fxquant_x86_extra_x86') (hook fxquant_pattern_configs); the later plugin "
        "must return it wrapped in fxquant.registry.Override(...) to replace it, or disable one "
        "with FXQUANT_DISABLE_PLUGINS"
    )


def test_an_override_replaces_the_earlier_config_and_records_who_overrode_it(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("x86", "fxquant-x86", linear, conv)
    replacement = config(linear).set_root_module(linear)
    installed.module(
        "better", fxquant_pattern_configs=lambda backend: [Override(replacement, "faster")]
    )
    installed.add("x86", "better", dist="fxquant-x86-better")
    backend = registry.assembled("x86")
    # a copy of it: the registry never holds a plugin's object (#18)
    assert backend.config.configs[0] is not replacement
    assert backend.config.configs[0].to_dict() == replacement.to_dict()
    origin = backend.pattern_origins[linear]
    assert (origin.source, origin.overrides, origin.reason) == (
        "fxquant-x86-better",
        ("fxquant-x86",),
        "faster",
    )
    assert backend.pattern_origins[conv].overrides == ()


def test_one_plugin_returning_a_pattern_twice_is_an_error(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("x86", "fxquant-x86", linear, linear)
    with pytest.raises(PluginError, match=r"returned pattern Linear twice in hook fxquant_pattern"):
        registry.get_backend_config("x86")


# --- failures stay with their backend ------------------------------------------------------------


def test_an_import_error_breaks_only_its_backend(installed: Installed, registry: Registry) -> None:
    installed.add("broken", "fxquant_no_such_module", dist="fxquant-broken", version="0.3")
    installed.patterns("x86", "fxquant-x86", linear)
    with pytest.raises(PluginError) as caught:
        registry.get_backend_config("broken")
    assert str(caught.value) == (
        "fxquant-broken 0.3 (entry point 'broken = fxquant_no_such_module') for backend 'broken' "
        "failed to import: ModuleNotFoundError: No module named 'fxquant_no_such_module'"
    )
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)
    assert patterns_of(registry, "x86") == [linear]


def test_a_hook_that_raises_names_distribution_version_entry_point_and_hook(
    installed: Installed, registry: Registry
) -> None:
    def fxquant_pattern_configs(backend: str) -> list[Any]:
        msg = "no kernels today"
        raise RuntimeError(msg)

    installed.module("raising", fxquant_pattern_configs=fxquant_pattern_configs)
    installed.add("raising", "raising", dist="fxquant-raising", version="2.1")
    with pytest.raises(PluginError) as caught:
        registry.get_backend_config("raising")
    assert str(caught.value) == (
        "fxquant-raising 2.1 (entry point 'raising = raising') raised in hook "
        "fxquant_pattern_configs for backend 'raising': RuntimeError: no kernels today"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        ("Linear", "'Linear'"),
        ([torch.nn.Linear], "an item <class 'torch.nn.modules.linear.Linear'> of type type"),
    ],
)
def test_a_hook_returning_the_wrong_type_is_a_plugin_error(
    installed: Installed, registry: Registry, answer: object, shown: str
) -> None:
    installed.module("wrong", fxquant_pattern_configs=lambda backend: answer)
    installed.add("wrong", "wrong", dist="fxquant-wrong")
    with pytest.raises(PluginError) as caught:
        registry.get_backend_config("wrong")
    assert str(caught.value) == (
        f"fxquant-wrong 1.0 (entry point 'wrong = wrong') returned {shown} (expected a list of "
        "BackendPatternConfig, or None) in hook fxquant_pattern_configs for backend 'wrong'"
    )


def test_a_pattern_config_without_pattern_is_a_plugin_error(
    installed: Installed, registry: Registry
) -> None:
    from fxquant.config.backend import BackendPatternConfig

    installed.module("nopattern", fxquant_pattern_configs=lambda backend: [BackendPatternConfig()])
    installed.add("nopattern", "nopattern", dist="fxquant-nopattern")
    with pytest.raises(PluginError, match=r"returned an invalid BackendPatternConfig") as caught:
        registry.get_backend_config("nopattern")
    assert isinstance(caught.value.__cause__, ConfigError)


def test_a_failed_backend_raises_the_same_error_again_without_reloading(
    installed: Installed, registry: Registry
) -> None:
    calls = []

    def fxquant_pattern_configs(backend: str) -> list[Any]:
        calls.append(backend)
        msg = "boom"
        raise RuntimeError(msg)

    installed.module("flaky", fxquant_pattern_configs=fxquant_pattern_configs)
    installed.add("flaky", "flaky", dist="fxquant-flaky")
    messages = []
    for _ in range(2):
        with pytest.raises(PluginError) as caught:
            registry.get_backend_config("flaky")
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert calls == ["flaky"]


def test_an_unknown_hook_name_is_refused_with_the_plugin_named(
    installed: Installed, registry: Registry
) -> None:
    installed.module("typo", fxquant_patern_configs=lambda backend: [])
    installed.add("typo", "typo", dist="fxquant-typo")
    with pytest.raises(PluginError, match=r"^fxquant-typo 1.0 .* was refused in hook registration"):
        registry.get_backend_config("typo")


def test_unknown_backend_is_a_key_error_listing_installed_and_the_closest(
    installed: Installed, registry: Registry
) -> None:
    installed.add("x86", "not_a_module_x86", dist="fxquant-x86")
    with pytest.raises(KeyError) as caught:
        registry.get_backend_config("x68")
    assert isinstance(caught.value, UnknownBackendError)
    assert str(caught.value) == (
        "unknown backend 'x68'; did you mean 'x86'? installed: reference, x86; "
        f"{install_hint()}; see `fxquant backends`"
    )


def test_unknown_backend_that_the_checkout_has_names_the_command_that_installs_it(
    installed: Installed, registry: Registry
) -> None:
    # from a clone, `pip install fxquant-x86` fails (no index has it) and so does
    # `pip install plugins/x86` alone (it needs the local onednn): the hint names both folders
    root = checkout_root()
    if root is None:
        pytest.skip("fxquant runs from an installed wheel, not a checkout")
    with pytest.raises(KeyError) as caught:
        registry.get_backend_config("x86")
    command = install_command("x86")
    assert f"to install it: {command};" in str(caught.value)
    assert command.split()[-2:] == [str(root / "plugins/onednn"), str(root / "plugins/x86")]


def test_a_hook_asking_for_its_own_backend_is_an_error_not_a_deadlock(
    installed: Installed, registry: Registry
) -> None:
    installed.module(
        "selfish",
        fxquant_pattern_configs=lambda backend: registry.get_backend_config(backend).configs,
    )
    installed.add("selfish", "selfish", dist="fxquant-selfish")
    with pytest.raises(PluginError) as caught:
        registry.get_backend_config("selfish")
    assert str(caught.value.__cause__) == (
        "backend 'selfish' was asked for while it is being assembled "
        "(one of its hooks asks for its own backend)"
    )


# --- compatibility and environment controls ------------------------------------------------------


def test_a_plugin_whose_requires_dist_excludes_us_is_incompatible_and_never_imported(
    installed: Installed, registry: Registry
) -> None:
    installed.add(
        "old", "never_imported_old", dist="fxquant-old", requires=["fxquant<0.1", "torch"]
    )
    with pytest.raises(UnknownBackendError) as caught:
        registry.get_backend_config("old")
    assert str(caught.value) == (
        "backend 'old' is not available: fxquant-old 1.0 is incompatible "
        "(requires fxquant<0.1, installed fxquant is 0.1.0)"
    )
    assert "never_imported_old" not in sys.modules
    assert registry.report("old").status == "incompatible"
    report = registry.report("old")
    assert report.status is PluginStatus.INCOMPATIBLE
    assert [p.status for p in report.plugins] == [PluginStatus.INCOMPATIBLE]


def test_a_plugin_status_outside_the_enum_names_every_valid_status() -> None:
    with pytest.raises(ValueError, match=r"^PluginInfo status 'broken' is not one of ok, failed, "):
        PluginInfo("b", "fxquant-b", "1.0", "b = b.plugin", status="broken")  # type: ignore[arg-type]
    info = PluginInfo("b", "fxquant-b", "1.0", "b = b.plugin", status="ok")  # type: ignore[arg-type]
    assert info.status is PluginStatus.OK


def test_a_plugin_built_for_another_plugin_api_is_refused(
    installed: Installed, registry: Registry
) -> None:
    module = installed.module("future", fxquant_pattern_configs=lambda backend: [])
    module.fxquant_plugin_api = (2, 3)  # type: ignore[attr-defined]
    installed.add("future", "future", dist="fxquant-future", version="9.0")
    with pytest.raises(PluginAPIVersionError) as caught:
        registry.get_backend_config("future")
    assert str(caught.value) == (
        "fxquant-future 9.0 (entry point 'future = future') targets fxquant plugin API 2, 3, "
        "but this fxquant offers 1; install a version of the plugin built for it, or a matching "
        "fxquant"
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("FXQUANT_DISABLE_PLUGIN_AUTOLOAD", "1", ["reference"]),
        ("FXQUANT_PLUGINS", "fxquant-a", ["a", "reference"]),
        ("FXQUANT_PLUGINS", "FXQUANT_A, fxquant.b", ["a", "b", "reference"]),
        ("FXQUANT_DISABLE_PLUGINS", "fxquant-a", ["b", "reference"]),
        ("FXQUANT_DISABLE_PLUGINS", "fxquant", ["a", "b", "reference"]),
    ],
)
def test_environment_controls_select_distributions_and_keep_the_builtin(
    installed: Installed, variable: str, value: str, expected: list[str]
) -> None:
    installed.patterns("a", "fxquant-a", linear)
    installed.patterns("b", "fxquant-b", linear)
    installed.monkeypatch.setenv(variable, value)
    assert Registry().list_backends() == expected


def test_a_disabled_plugin_is_reported_with_its_reason(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("a", "fxquant-a", linear)
    installed.monkeypatch.setenv("FXQUANT_DISABLE_PLUGINS", "fxquant-a")
    report = registry.report("a")
    assert (report.status, report.reason) == ("disabled", "listed in FXQUANT_DISABLE_PLUGINS")
    assert installed.imported == []


# --- caching, threads, registration --------------------------------------------------------------


def test_concurrent_first_calls_assemble_the_backend_once(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("x86", "fxquant-x86", linear)
    barrier = threading.Barrier(8)
    results: list[list[Any]] = []

    def ask() -> None:
        barrier.wait()
        results.append(patterns_of(registry, "x86"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [[linear]] * 8
    assert installed.imported == ["plugin_fxquant_x86_x86"]


def test_the_returned_backend_config_is_a_copy(installed: Installed, registry: Registry) -> None:
    installed.patterns("x86", "fxquant-x86", linear)
    first = registry.get_backend_config("x86")
    first.configs[0].set_root_module(linear)
    first.set_backend_pattern_config(config(conv))
    again = registry.get_backend_config("x86")
    assert [c.pattern for c in again.configs] == [linear]
    assert again.configs[0].root_module is None


def test_register_and_unregister_take_effect_immediately(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("x86", "fxquant-x86", linear)
    assert patterns_of(registry, "x86") == [linear]

    class Notebook:
        @hookimpl
        def fxquant_pattern_configs(self, backend: str) -> list[Any]:
            return [config(relu)]

    plugin = Notebook()
    registry.register_plugin(plugin, "x86")
    assert patterns_of(registry, "x86") == [linear, relu]
    registry.register_plugin(plugin, "scratch")
    assert registry.list_backends() == ["reference", "scratch", "x86"]
    registry.unregister_plugin(plugin)
    assert patterns_of(registry, "x86") == [linear]
    assert registry.list_backends() == ["reference", "x86"]


def test_registering_twice_and_unregistering_a_stranger_are_errors(registry: Registry) -> None:
    plugin = types.SimpleNamespace()
    registry.register_plugin(plugin, "scratch")
    with pytest.raises(ConfigError) as twice:
        registry.register_plugin(plugin, "scratch")
    assert str(twice.value) == (
        "plugin 'SimpleNamespace' (registered with register_plugin) is already registered "
        "for backend 'scratch'"
    )
    with pytest.raises(ConfigError) as stranger:
        registry.unregister_plugin(object())
    assert str(stranger.value) == (
        "plugin 'object' is not registered; only objects given to register_plugin can be "
        "unregistered (use FXQUANT_DISABLE_PLUGINS for installed ones)"
    )


def test_register_plugin_checks_the_hooks_at_once(registry: Registry) -> None:
    class Typo:
        @hookimpl
        def fxquant_pattern_configs(self, backend: str, extra: int) -> None:
            return None

    with pytest.raises(PluginError) as caught:
        registry.register_plugin(Typo(), "scratch")
    # worded as for an entry point pluggy refuses: the plugin, the step, the backend, pluggy's words
    assert str(caught.value).startswith(
        "plugin 'Typo' (registered with register_plugin) was refused in hook registration for "
        "backend 'scratch': PluginValidationError: "
    )
    assert "extra" in str(caught.value)
    assert registry.list_backends() == ["reference"]


def test_refresh_rescans_entry_points(installed: Installed, registry: Registry) -> None:
    assert registry.list_backends() == ["reference"]
    installed.patterns("late", "fxquant-late", linear)
    assert registry.list_backends() == ["reference"]
    registry.refresh()
    assert registry.list_backends() == ["late", "reference"]
    assert patterns_of(registry, "late") == [linear]


def test_the_extension_warning_words_a_record_missing_plugin_info_fields() -> None:
    """A record without PluginInfo's fields (an older loader's) still gives the warning."""
    record = types.SimpleNamespace(backend="x86", reason="ImportError: no")
    text = extension_skipped_warning(record)
    assert text.startswith(f"backend 'x86' loaded without {record!r}, which extends it")
    assert "failed: ImportError: no; switch it off with FXQUANT_DISABLE_PLUGINS=?," in text
