"""The qnnpack backend: installed as a plugin, its patterns, constraints and default mappings."""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
import warnings
from typing import Any

import fxquant
import pytest
import torch
from fxquant.config.pattern import MatchAllNode, simple_to_complex, validate_complex
from fxquant_qnnpack import plugin
from torch import nn

BACKEND = "qnnpack"
AO_CONFIG = "get_qnnpack_backend_config"

# torch.ao module prefix -> the fxquant module with the class of the same name
_AO_TO_FXQUANT = (
    ("torch.ao.nn.intrinsic.qat", "fxquant.nn.intrinsic.qat"),
    ("torch.ao.nn.intrinsic", "fxquant.nn.intrinsic"),
    ("torch.ao.nn.qat", "fxquant.nn.qat"),
    ("torch.ao.nn.quantized.reference", "fxquant.nn.reference"),
)


def _to_fxquant(op: Any) -> Any:
    if isinstance(op, tuple):
        return tuple(_to_fxquant(part) for part in op)
    if isinstance(op, type) and op.__name__ == "MatchAllNode":
        return MatchAllNode
    if isinstance(op, type):
        for prefix, target in _AO_TO_FXQUANT:
            if op.__module__.startswith(prefix):
                return getattr(importlib.import_module(target), op.__name__)
    return op


def _ao_patterns() -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("torch.ao.quantization")
        importlib.import_module("torch.ao.quantization.backend_config.utils")  # needed first
        backend_config = importlib.import_module("torch.ao.quantization.backend_config")
        configs = getattr(backend_config, AO_CONFIG)().configs
    return [
        validate_complex(_to_fxquant(c._pattern_complex_format))
        if c._pattern_complex_format is not None
        else simple_to_complex(_to_fxquant(c.pattern))
        for c in configs
    ]


def test_backend_has_every_pattern_of_torch_ao_config_for_the_same_target() -> None:
    theirs = _ao_patterns()
    ours = {c.normalized_pattern for c in fxquant.get_backend_config(BACKEND).configs}
    missing = [p for p in theirs if p not in ours]
    assert not missing, f"{len(missing)} of {len(theirs)} torch.ao patterns missing: {missing}"
    assert len(ours) >= len(set(theirs)) >= 190


def test_fxquant_backends_lists_the_installed_plugin() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fxquant", "backends"], capture_output=True, text=True, check=True
    )
    (row,) = [line for line in result.stdout.splitlines() if line.startswith(f"| {BACKEND} ")]
    assert "| ok " in row
    assert f"fxquant-{BACKEND} 0.1.0" in row


def test_hooks_answer_only_for_their_backend() -> None:
    assert plugin.fxquant_pattern_configs("x86") is None
    assert plugin.fxquant_lowering_kernels("x86") is None
    assert plugin.fxquant_default_qconfig_mapping("x86", False) is None
    names = {rule.name for rule in plugin.fxquant_lowering_kernels(BACKEND) or []}
    assert {f"{BACKEND}_linear", f"{BACKEND}_conv2d", f"{BACKEND}_ops"} <= names


class Net(nn.Module):
    """Most op families at once: every one must accept the default mapping."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4, 3)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = torch.sigmoid(self.dw(y)) * y + torch.tanh(y)
        y = nn.functional.hardswish(self.up(y)).mean((2, 3))
        return self.softmax(self.fc(self.norm(y)))


@pytest.mark.parametrize("is_qat", [False, True])
def test_default_mapping_quantizes_every_op_and_lowers_it(is_qat: bool) -> None:
    torch.manual_seed(0)
    model = Net().train(is_qat)
    x = torch.randn(2, 3, 10, 10)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND, is_qat=is_qat)
    prepare = fxquant.prepare_qat_fx if is_qat else fxquant.prepare_fx
    prepared = prepare(model, mapping, (x,), backend_config=fxquant.get_backend_config(BACKEND))
    prepared(x)
    lowered = fxquant.convert_fx(prepared.eval())
    statuses = {e.node: e.status for e in fxquant.explain(lowered).entries()}
    assert set(statuses.values()) == {"lowered", "float"}, fxquant.explain(lowered)


def test_fixed_qparams_ops_run_on_their_exact_grids() -> None:
    model = nn.Sequential(nn.Sigmoid()).eval()
    x = torch.randn(4, 8) * 4
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    prepared = fxquant.prepare_fx(
        model, mapping, (x,), backend_config=fxquant.get_backend_config(BACKEND)
    )
    prepared(x)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    lowered = fxquant.convert_fx(prepared)
    dequantize = torch.ops.fxquant.dequantize_per_tensor.default
    (node,) = [n for n in lowered.graph.nodes if n.target == dequantize]
    assert node.args[1:3] == (1 / 256, 0)
    # quint8 sigmoid lands on the same grid: the integers are exact, not requantized
    assert torch.equal(lowered(x), reference(x))


def test_activations_use_the_full_range_and_no_scale_below_the_kernel_bound() -> None:
    qconfig = fxquant.get_default_qconfig_mapping(BACKEND).global_qconfig
    observer = qconfig.activation()
    observer(torch.full((10,), 1e-6))  # a tiny range: the scale must stay >= 2**-12
    scale, _ = observer.calculate_qparams()
    assert (observer.quant_min, observer.quant_max) == (0, 255)
    assert float(scale) >= 2**-12
    weight = qconfig.weight()
    assert (weight.quant_min, weight.quant_max, weight.qscheme) == (
        -127,
        127,
        torch.per_channel_symmetric,
    )


def test_backend_refuses_qconfigs_outside_the_kernel_constraints() -> None:
    from fxquant.observer import MinMaxObserver

    model = nn.Sequential(nn.Linear(4, 4)).eval()
    x = torch.randn(2, 4)
    tiny_scale = fxquant.QConfig(
        activation=MinMaxObserver.with_args(eps=2**-20),
        weight=fxquant.get_default_qconfig_mapping(BACKEND).global_qconfig.weight,
    )
    mapping = fxquant.QConfigMapping().set_global(tiny_scale)
    prepared = fxquant.prepare_fx(
        model, mapping, (x,), backend_config=fxquant.get_backend_config(BACKEND)
    )
    (entry,) = [e for e in fxquant.explain(prepared).entries() if e.op == "call_module"]
    assert entry.status == "skipped"
    assert entry.reason.field == "scale_min_lower_bound"
