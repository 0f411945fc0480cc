"""The executorch backend's patterns, constraints and default mappings (no export here)."""

from __future__ import annotations

import operator
import subprocess
import sys
import warnings

import fxquant
import pytest
import torch
from fxquant.numerics.observer import PerChannelMinMaxObserver
from fxquant.tools import testing
from fxquant.tools.export import DEQUANTIZE_OPS, QUANTIZE_OPS
from fxquant_executorch import plugin
from fxquant_executorch.patterns import pattern_configs
from torch import nn

BACKEND = "executorch"


def test_backend_has_every_pattern_of_torch_ao_executorch_config() -> None:
    with warnings.catch_warnings(action="ignore"):  # torch.ao warns that it is deprecated
        pytest.importorskip("torch.ao.quantization.backend_config.utils")  # needed first
        ao = pytest.importorskip("torch.ao.quantization.backend_config")
    configs = ao.get_executorch_backend_config().configs
    testing.check_covers_ao_patterns(BACKEND, configs, at_least=84)


@pytest.mark.parametrize(
    "check",
    [
        testing.NamedCheck(
            "listed_by_cli",
            lambda b: testing.check_listed_by_cli(b, "fxquant-executorch 0.1.0"),
        ),
        testing.NamedCheck(
            "hooks_answer_only_for_their_backend",
            lambda b: testing.check_hooks_answer_only_for(plugin, b, other="x86"),
        ),
    ],
    ids=str,
)
def test_backend_passes_the_shared_check(check: testing.NamedCheck) -> None:
    check(BACKEND)


def test_show_names_the_runtime_and_xnnpack_constraints() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fxquant", "show", BACKEND],
        capture_output=True,
        text=True,
        check=True,
    )
    runs_on = next(line for line in result.stdout.splitlines() if line.startswith("| Runs On"))
    assert "ExecuTorch XNNPACK" in runs_on
    assert "qint8" in result.stdout or "int8" in result.stdout


def test_default_mapping_is_xnnpacks_int8_asymmetric_activations_and_symmetric_weights() -> None:
    for is_qat in (False, True):
        qconfig = fxquant.get_default_qconfig_mapping(BACKEND, is_qat=is_qat).global_qconfig
        activation, weight = qconfig.activation(), qconfig.weight()
        assert (activation.dtype, activation.quant_min, activation.quant_max) == (
            torch.int8,
            -128,
            127,
        )
        assert activation.qscheme == torch.per_tensor_affine
        assert (weight.dtype, weight.quant_min, weight.quant_max) == (torch.int8, -127, 127)
        assert weight.qscheme == torch.per_channel_symmetric
    observer = fxquant.get_default_qconfig_mapping(BACKEND).global_qconfig.activation()
    observer(torch.full((16,), 1e-7))  # a tiny range: the scale must stay >= 2**-12
    assert float(observer.calculate_qparams()[0]) >= 2**-12


def test_xnnpack_delegates_1d_and_2d_convs_only() -> None:
    patterns = {c.pattern for c in pattern_configs()}
    assert {nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d, nn.ConvTranspose2d} <= patterns
    assert not {nn.Conv3d, nn.ConvTranspose3d} & patterns


def test_ops_that_move_values_share_their_input_grid() -> None:
    # pytorch/executorch#21829: a slice_copy whose output scale differs from its input's makes
    # the whole method fail to load; prepare must never give such ops their own observer
    shared = fxquant.ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT
    by_pattern = {c.pattern: c for c in pattern_configs()}
    for op in (operator.getitem, torch.narrow, "view", "permute", nn.MaxPool2d, torch.cat):
        assert by_pattern[op].observation_type == shared, op


class SliceBetweenConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x)[:, 2:6])


def _step_qparams(gm: torch.fx.GraphModule, node_name: str) -> list[tuple[float, int]]:
    node = next(n for n in gm.graph.nodes if n.name == node_name)
    before = node.args[0]
    after = next(iter(node.users))
    return [(float(step.args[1]), int(step.args[2])) for step in (before, after)]


def test_a_slice_keeps_its_input_scale_and_zero_point(quantize) -> None:
    x = torch.randn(2, 3, 8, 8)
    converted = quantize(SliceBetweenConvs().eval(), [x])
    entries = {e.node: e for e in fxquant.explain(converted, show=False).entries()}
    assert entries["getitem"].status == "reference"
    before, after = _step_qparams(converted, "getitem")
    assert before == after


def test_affine_weights_are_refused_at_prepare_with_the_reason() -> None:
    # XNNPACK ignores a weight zero point: an affine weight would be wrong, not slow
    base = fxquant.get_default_qconfig_mapping(BACKEND).global_qconfig
    affine = fxquant.QConfig(
        activation=base.activation,
        weight=PerChannelMinMaxObserver.with_args(
            dtype=torch.int8,
            quant_min=-127,
            quant_max=127,
            qscheme=torch.per_channel_affine,
            eps=2**-12,
        ),
    )
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    prepared = fxquant.prepare_fx(
        model,
        fxquant.QConfigMapping().set_global(affine),
        (torch.randn(2, 4),),
        backend_config=fxquant.get_backend_config(BACKEND),
    )
    (entry,) = [e for e in fxquant.explain(prepared, show=False).entries() if e.op == "call_module"]
    assert entry.status == "skipped"
    assert (entry.reason.code, entry.reason.field) == ("zero_point", "zero_point_exact_match")
    assert "per_channel_affine" in entry.reason.words
    # an nn.Sequential's forward is torch's: no line of the user's to show (the prepare_fx
    # call would mislead); the node's module path names the layer
    assert entry.source is None
    assert entry.node == "_0"


def test_uint8_activations_are_refused_with_the_backend_dtype() -> None:
    mapping = fxquant.get_default_qconfig_mapping("reference")  # uint8 activations
    prepared = fxquant.prepare_fx(
        nn.Sequential(nn.Linear(4, 4)).eval(),
        mapping,
        (torch.randn(2, 4),),
        backend_config=fxquant.get_backend_config(BACKEND),
    )
    (entry,) = [e for e in fxquant.explain(prepared, show=False).entries() if e.op == "call_module"]
    assert entry.status == "skipped"
    assert entry.reason.code == "dtype_mismatch"
    assert "int8" in entry.reason.words


def test_convert_keeps_the_reference_form_for_the_exporter_without_complaints(quantize) -> None:
    converted = quantize(SliceBetweenConvs().eval(), [torch.randn(2, 3, 8, 8)])
    targets = {n.target for n in converted.graph.nodes if n.op == "call_function"}
    assert targets & QUANTIZE_OPS
    assert targets & DEQUANTIZE_OPS
    entries = fxquant.explain(converted, show=False).entries()
    assert not [e for e in entries if e.reason and e.reason.code == "no_lowering_kernel"]
    # strict mode has nothing to refuse: the reference form is the exporter's input
    prepared = fxquant.prepare_fx(
        SliceBetweenConvs().eval(),
        fxquant.get_default_qconfig_mapping(BACKEND),
        (torch.randn(2, 3, 8, 8),),
        backend_config=fxquant.get_backend_config(BACKEND),
    )
    prepared(torch.randn(2, 3, 8, 8))
    fxquant.convert_fx(prepared, strict=True)


def test_elu_stays_float_by_default_since_xnnpack_has_none(quantize) -> None:
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.ELU()).eval()
    converted = quantize(model, [torch.randn(1, 3, 4, 4)])
    (elu,) = [e for e in fxquant.explain(converted, show=False).entries() if e.op == "call_module"][
        1:
    ]
    assert elu.status == "float"
    assert elu.reason.code == "qconfig_none"
