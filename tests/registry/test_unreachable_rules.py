"""A lowering rule whose pattern cannot occur in a reference model is refused (#22).

docs/plugins.md once showed ``LoweringRule(torch.nn.Linear, ...)``: it registered,
never matched (the reference model holds ``fxquant.nn.reference.Linear``), and
``fxquant check`` skipped it with nothing failed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fxquant.errors import PluginError
from fxquant.lowering import LoweringRule
from fxquant.nn import intrinsic, qat, reference
from fxquant.registry.manager import Registry
from fxquant.tools.cli import main
from torch import nn

from tests.registry.conftest import Installed, config


def linear_configs() -> list[Any]:
    """Linear -> reference.Linear, qat.Linear, and the (Linear, ReLU) fusion."""
    return [
        config(nn.Linear)
        .set_root_module(nn.Linear)
        .set_qat_module(qat.Linear)
        .set_reference_quantized_module(reference.Linear),
        config((nn.Linear, nn.ReLU)).set_fused_module(intrinsic.LinearReLU),
        config(intrinsic.LinearReLU)
        .set_root_module(nn.Linear)
        .set_reference_quantized_module(reference.Linear),
    ]


def install_rule(installed: Installed, *rules: LoweringRule) -> None:
    installed.module(
        "plugin_chip",
        fxquant_pattern_configs=lambda backend: linear_configs() if backend == "chip" else None,
        fxquant_lowering_kernels=lambda backend: list(rules) if backend == "chip" else None,
    )
    installed.add("chip", "plugin_chip", dist="fxquant-chip", version="0.3")


def never(match: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("pattern", "named", "instead"),
    [
        (nn.Linear, "torch.nn.Linear", "fxquant.nn.reference.Linear"),
        (qat.Linear, "fxquant.nn.qat.Linear", "fxquant.nn.reference.Linear"),
        ((nn.Linear, nn.ReLU), "(Linear, ReLU)", "fxquant.nn.intrinsic.LinearReLU"),
    ],
    ids=["float-weighted-module", "qat-module", "fusion-pattern"],
)
def test_a_rule_that_can_never_match_is_refused_naming_plugin_rule_and_the_pattern_to_write(
    installed: Installed, registry: Registry, pattern: Any, named: str, instead: str
) -> None:
    install_rule(installed, LoweringRule(pattern, build=never, name="qlinear"))
    with pytest.raises(PluginError) as caught:
        registry.get_backend_config("chip")
    message = str(caught.value)
    assert message.startswith("fxquant-chip 0.3 (entry point 'chip = plugin_chip') returned ")
    assert "lowering rule 'qlinear' whose pattern" in message
    assert f"can never occur in a reference model: {named} is not there once converted" in message
    assert f"write {instead}" in message
    assert message.endswith("in hook fxquant_lowering_kernels for backend 'chip'")


def test_rules_on_the_reference_forms_and_float_rules_are_accepted(
    installed: Installed, registry: Registry
) -> None:
    install_rule(
        installed,
        LoweringRule(reference.Linear, build=never, name="qlinear"),
        LoweringRule(intrinsic.LinearReLU, build=never, name="qlinear_relu"),
        # a float rule matches ops left float: an unquantized nn.Linear is one
        LoweringRule(nn.Linear, build=never, name="float_linear", quantized=False),
    )
    registry.get_backend_config("chip")
    assert [r.name for r in registry.assembled("chip").lowering_rules] == [
        "qlinear",
        "qlinear_relu",
        "float_linear",
    ]


def test_a_half_precision_only_linear_keeps_nn_linear_reachable(
    installed: Installed, registry: Registry
) -> None:
    # a float32 weight is not quantized: convert keeps the nn.Linear, so a rule may name it
    fp32_weight = config(nn.Linear).set_reference_quantized_module(reference.Linear)
    fp32_weight.set_dtype_configs([{"input_dtype": torch.float16, "weight_dtype": torch.float}])
    installed.module(
        "plugin_chip",
        fxquant_pattern_configs=lambda backend: [fp32_weight],
        fxquant_lowering_kernels=lambda backend: [LoweringRule(nn.Linear, build=never, name="f")],
    )
    installed.add("chip", "plugin_chip", dist="fxquant-chip")
    registry.get_backend_config("chip")


@pytest.fixture
def process_registry(installed: Installed, monkeypatch: pytest.MonkeyPatch) -> Installed:
    import fxquant.registry

    monkeypatch.setattr(fxquant.registry, "_registry", Registry())
    return installed


def test_fxquant_check_fails_a_backend_with_a_rule_that_can_never_match(
    process_registry: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    install_rule(process_registry, LoweringRule(nn.Linear, build=never, name="qlinear"))
    code = main(["check", "chip"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert "lowering rule 'qlinear' whose pattern Linear can never occur" in err
    assert main(["show", "chip"]) == 1
    assert "write fxquant.nn.reference.Linear" in capsys.readouterr().err


def test_fxquant_show_names_each_patterns_kernel_through_its_reference_form(
    process_registry: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    install_rule(
        process_registry,
        LoweringRule(reference.Linear, build=never, name="qlinear"),
        LoweringRule(intrinsic.LinearReLU, build=never, name="qlinear_relu"),
    )
    assert main(["show", "chip"]) == 0
    table = capsys.readouterr().out.split("\n\n")[-1].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {
        cells[0]: dict(zip(header, cells, strict=True))
        for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])
    }
    assert rows["Linear"]["kernel"] == "qlinear"  # becomes reference.Linear
    assert rows["(Linear, ReLU)"]["kernel"] == "qlinear_relu"  # fused into LinearReLU
    assert rows["intrinsic.LinearReLU"]["kernel"] == "qlinear_relu"


def test_fxquant_check_fails_an_extension_with_a_rule_that_can_never_match(
    process_registry: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    # an extension's failure is only a warning for users of the backend (#22); the check
    # holds every plugin that contributes to it to the contract, so there it fails
    install_rule(process_registry)
    process_registry.module(
        "plugin_chip_extra",
        fxquant_lowering_kernels=lambda backend: (
            [LoweringRule(nn.Linear, build=never, name="extra_qlinear")]
            if backend == "chip"
            else None
        ),
    )
    process_registry.add("chip", "plugin_chip_extra", dist="acme-chip-extra", version="1.0")
    code = main(["check", "chip"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert "lowering rule 'extra_qlinear' whose pattern Linear can never occur" in err
