"""Lowering rules, overrides of them, and the default qconfig mapping hook."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import (
    ConfigError,
    ConfigTypeError,
    MissingDefaultQConfigError,
    PluginConflictError,
    PluginError,
)
from fxquant.registry import Deployment, LoweringRule, Override
from fxquant.registry.manager import Registry

from tests.registry.conftest import Installed

linear, relu, conv = torch.nn.Linear, torch.nn.ReLU, torch.nn.Conv2d


def build(match: object) -> object:
    return match


def mapping() -> QConfigMapping:
    return QConfigMapping().set_global(QConfig(torch.nn.Identity, torch.nn.Identity))


def kernels(installed: Installed, backend: str, dist: str, *rules: Any) -> None:
    module = f"kernels_{dist.replace('-', '_')}"
    installed.module(module, fxquant_lowering_kernels=lambda backend: list(rules))
    installed.add(backend, module, dist=dist)


def test_lowering_rule_keys_simple_and_complex_patterns_alike() -> None:
    simple = LoweringRule((conv, relu), build=build, name="qconv_relu")
    complex_ = LoweringRule((relu, conv), build=build, name="qconv_relu", complex_format=True)
    assert simple.key == complex_.key == (relu, conv)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"pattern": None, "build": build, "name": "q"},
            ConfigError,
            "LoweringRule 'q' needs a pattern, got None; pass e.g. torch.nn.Linear",
        ),
        (
            {"pattern": linear, "build": 3, "name": "q"},
            ConfigTypeError,
            "LoweringRule build must be callable, got 3 of type int; pass a function that "
            "builds the kernel",
        ),
        (
            {"pattern": linear, "build": build, "name": ""},
            ConfigError,
            "LoweringRule name must not be empty; give the kernel a short name",
        ),
        (
            {"pattern": linear, "build": build, "name": 7},
            ConfigTypeError,
            "LoweringRule name must be a str, got 7 of type int",
        ),
    ],
)
def test_lowering_rule_validates_its_fields(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        LoweringRule(**kwargs)
    assert str(caught.value) == message


def test_an_override_cannot_wrap_an_override() -> None:
    rule = LoweringRule(linear, build=build, name="q")
    with pytest.raises(ConfigTypeError, match=r"^Override wraps another Override"):
        Override(Override(rule))


def test_lowering_rules_of_two_distributions_are_merged(
    installed: Installed, registry: Registry
) -> None:
    kernels(installed, "x86", "fxquant-x86", LoweringRule(linear, build=build, name="qlinear"))
    kernels(installed, "x86", "fxquant-x86-conv", LoweringRule(conv, build=build, name="qconv"))
    rules = registry.assembled("x86").lowering_rules
    assert [r.name for r in rules] == ["qlinear", "qconv"]


def test_two_kernels_for_one_pattern_conflict_unless_overridden(
    installed: Installed, registry: Registry
) -> None:
    kernels(installed, "x86", "fxquant-x86", LoweringRule(linear, build=build, name="qlinear"))
    kernels(installed, "x86", "fxquant-x86-fast", LoweringRule(linear, build=build, name="fast"))
    with pytest.raises(
        PluginConflictError, match=r"pattern Linear is configured by both fxquant-x86 1.0"
    ):
        registry.assembled("x86")


def test_an_overriding_kernel_replaces_the_earlier_one(
    installed: Installed, registry: Registry
) -> None:
    kernels(installed, "x86", "fxquant-x86", LoweringRule(linear, build=build, name="qlinear"))
    fast = LoweringRule(linear, build=build, name="fast")
    kernels(installed, "x86", "fxquant-x86-fast", Override(fast))
    backend = registry.assembled("x86")
    assert backend.lowering_rules == (fast,)
    assert backend.kernel_origins[linear].overrides == ("fxquant-x86",)


def test_default_qconfig_mapping_comes_from_the_hook_with_is_qat(
    installed: Installed, registry: Registry
) -> None:
    asked = []
    ptq, qat = mapping(), mapping()

    def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping:
        asked.append((backend, is_qat))
        return qat if is_qat else ptq

    installed.module("qm", fxquant_default_qconfig_mapping=fxquant_default_qconfig_mapping)
    installed.add("qm", "qm", dist="fxquant-qm")
    assert registry.get_default_qconfig_mapping("qm") is ptq
    assert registry.get_default_qconfig_mapping("qm", is_qat=True) is qat
    assert asked == [("qm", False), ("qm", True)]


def test_a_backend_without_default_mapping_raises_a_clear_error(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("bare", "fxquant-bare", linear)
    with pytest.raises(MissingDefaultQConfigError) as caught:
        registry.get_default_qconfig_mapping("bare", is_qat=True)
    assert str(caught.value) == (
        "backend 'bare' has no default QAT QConfigMapping: none of its plugins implements "
        "fxquant_default_qconfig_mapping; build a QConfigMapping whose qconfigs match the dtypes "
        "shown by `fxquant show bare`"
    )


def test_two_default_mappings_conflict_and_override_wins(
    installed: Installed, registry: Registry
) -> None:
    first, second = mapping(), mapping()
    installed.module("qm_a", fxquant_default_qconfig_mapping=lambda backend, is_qat: first)
    installed.add("qm", "qm_a", dist="fxquant-a")
    installed.module("qm_b", fxquant_default_qconfig_mapping=lambda backend, is_qat: second)
    installed.add("qm", "qm_b", dist="fxquant-b")
    with pytest.raises(PluginConflictError) as caught:
        registry.get_default_qconfig_mapping("qm")
    assert str(caught.value) == (
        "backend 'qm': both fxquant-a 1.0 (entry point 'qm = qm_a') and fxquant-b 1.0 (entry "
        "point 'qm = qm_b') return a default QConfigMapping (is_qat=False); the later plugin must "
        "wrap its mapping in fxquant.registry.Override(...) to replace it"
    )
    installed.module(
        "qm_b", fxquant_default_qconfig_mapping=lambda backend, is_qat: Override(second)
    )
    registry.refresh()
    assert registry.get_default_qconfig_mapping("qm") is second


def test_a_default_mapping_of_the_wrong_type_is_a_plugin_error(
    installed: Installed, registry: Registry
) -> None:
    installed.module("qm", fxquant_default_qconfig_mapping=lambda backend, is_qat: {"": None})
    installed.add("qm", "qm", dist="fxquant-qm")
    with pytest.raises(PluginError) as caught:
        registry.get_default_qconfig_mapping("qm")
    assert str(caught.value) == (
        "fxquant-qm 1.0 (entry point 'qm = qm') returned {'': None} (expected a QConfigMapping, "
        "or None) in hook fxquant_default_qconfig_mapping for backend 'qm'"
    )


def deploy(model: object, example_inputs: object) -> object:
    return model


def test_a_deployment_reaches_the_assembled_backend(
    installed: Installed, registry: Registry
) -> None:
    deployment = Deployment("my runtime", deploy=deploy)
    installed.module("dep", fxquant_deployment=lambda backend: deployment)
    installed.add("dep", "dep", dist="fxquant-dep")
    assert registry.assembled("dep").deployment is deployment


def test_a_backend_without_deployment_runs_in_pytorch(
    installed: Installed, registry: Registry
) -> None:
    installed.patterns("bare", "fxquant-bare", linear)
    assert registry.assembled("bare").deployment is None


def test_two_deployments_conflict_and_override_wins(
    installed: Installed, registry: Registry
) -> None:
    first, second = Deployment("a", deploy=deploy), Deployment("b", deploy=deploy)
    installed.module("dep_a", fxquant_deployment=lambda backend: first)
    installed.add("dep", "dep_a", dist="fxquant-a")
    installed.module("dep_b", fxquant_deployment=lambda backend: second)
    installed.add("dep", "dep_b", dist="fxquant-b")
    with pytest.raises(PluginError) as caught:
        registry.assembled("dep")
    assert str(caught.value) == (
        "backend 'dep': both fxquant-a 1.0 (entry point 'dep = dep_a') and fxquant-b 1.0 (entry "
        "point 'dep = dep_b') return a Deployment; the later plugin must wrap its Deployment in "
        "fxquant.registry.Override(...) to replace it"
    )
    installed.module("dep_b", fxquant_deployment=lambda backend: Override(second))
    registry.refresh()
    assert registry.assembled("dep").deployment is second


def test_a_deployment_of_the_wrong_type_is_a_plugin_error(
    installed: Installed, registry: Registry
) -> None:
    installed.module("dep", fxquant_deployment=lambda backend: deploy)
    installed.add("dep", "dep", dist="fxquant-dep")
    with pytest.raises(PluginError, match=r"expected a Deployment, or None\) in hook "):
        registry.assembled("dep")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": "", "deploy": deploy}, ConfigError, "Deployment name must not be empty"),
        ({"name": 3, "deploy": deploy}, ConfigTypeError, "Deployment name must be a str, got 3"),
        ({"name": "x", "deploy": 3}, ConfigTypeError, "Deployment deploy must be callable"),
    ],
)
def test_deployment_validates_its_fields(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Deployment(**kwargs)
