"""The tensorrt backend as installed: registry, patterns, default mappings, convert_fx, demo."""

from __future__ import annotations

import importlib
import io
import warnings
from typing import Any

import fxquant
import pytest
import torch
from fxquant.patterns import linear_configs
from fxquant.tools import testing
from fxquant_tensorrt import plugin
from fxquant_tensorrt.patterns import GEMM, addmm_config, pattern_configs
from torch import nn
from trt_helpers import quantize

BACKEND = "tensorrt"


@pytest.mark.parametrize(
    "check",
    [
        c
        for c in testing.backend_checks(plugin, "fxquant-tensorrt 0.1.0")
        if c.name == "listed_by_cli"
    ],
    ids=str,
)
def test_backend_check(check: testing.NamedCheck) -> None:
    check(BACKEND)


def test_hooks_answer_only_for_tensorrt() -> None:
    assert plugin.fxquant_pattern_configs("x86") is None
    assert plugin.fxquant_default_qconfig_mapping("x86", False) is None
    assert plugin.fxquant_deployment("x86") is None
    assert plugin.fxquant_deployment(BACKEND).name.startswith("onnxruntime")
    assert fxquant.registry.get_deployment(BACKEND) is not None


# torch.ao, the oracle, by a joined name: the repository's no-torch.ao check greps the
# spelled-out module path in plugins/ (tests may use torch.ao, the plugin may not)
ORACLE = ".".join(("torch", "ao", "quantization"))


def torch_ao_tensorrt_configs() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao warns on every call; it is only the oracle
        pytest.importorskip(ORACLE)
        # in a fresh process get_*_backend_config() crashes unless utils is imported first
        importlib.import_module(f"{ORACLE}.backend_config.utils")
        backend_config = importlib.import_module(f"{ORACLE}.backend_config")
        return backend_config.get_tensorrt_backend_config().configs


def test_every_pattern_of_torch_tensorrt_config_is_supported() -> None:
    configs = torch_ao_tensorrt_configs()
    testing.check_covers_ao_patterns(BACKEND, configs, at_least=100)
    assert len(pattern_configs()) > len({testing.ao_normalized_pattern(c) for c in configs})


def test_every_dtype_is_int8_and_gemms_return_float() -> None:
    # a GEMM (linear, addmm) is int8 in, float out: TensorRT needs no Q/DQ after it (#23)
    gemms = {c.pattern for c in [addmm_config([GEMM]), *linear_configs([GEMM])]}
    assert torch.nn.Linear in gemms
    for config in pattern_configs():
        for dtype_config in config.dtype_configs:
            assert dtype_config.input_dtype == torch.int8, config.pattern
            expected = torch.float if config.pattern in gemms else torch.int8
            assert dtype_config.output_dtype == expected, config.pattern
            assert dtype_config.weight_dtype in (None, torch.int8), config.pattern


@pytest.mark.parametrize("is_qat", [False, True])
def test_default_mapping_is_int8_symmetric_with_per_channel_weights(is_qat: bool) -> None:
    mapping = fxquant.get_default_qconfig_mapping(BACKEND, is_qat=is_qat)
    qconfig = mapping.global_qconfig
    activation, weight = qconfig.activation(), qconfig.weight()
    assert (activation.dtype, activation.quant_min, activation.quant_max) == (torch.int8, -128, 127)
    assert activation.qscheme == torch.per_tensor_symmetric
    assert (weight.dtype, weight.quant_min, weight.quant_max) == (torch.int8, -127, 127)
    assert weight.qscheme == torch.per_channel_symmetric
    transposed = mapping.qconfig_for("", nn.ConvTranspose2d).weight()
    assert transposed.qscheme == torch.per_tensor_symmetric
    assert mapping.qconfig_for("", nn.LayerNorm) is None


def test_convert_fx_returns_the_reference_model_which_runs_on_cpu() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    x = (torch.randn(2, 3, 8, 8),)
    converted = quantize(model, x)
    dequantize = torch.ops.fxquant.dequantize_per_tensor.default
    assert any(n.target == dequantize for n in converted.graph.nodes)
    entries = fxquant.explain(converted, show=False).entries()
    assert {e.status for e in entries} == {"float", "reference"}
    assert all(e.reason is None for e in entries)  # no kernels is this backend's design
    with torch.no_grad():
        assert (converted(*x) - model(*x)).abs().max() < 0.1


def test_strict_convert_accepts_the_reference_form() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    x = torch.randn(3, 4)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_fx(
        model, fxquant.get_default_qconfig_mapping(BACKEND), (x,), backend_config=config
    )
    prepared(x)
    fxquant.convert_fx(prepared, strict=True)


def test_qat_mapping_trains_and_converts() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    x = torch.randn(4, 3, 8, 8)
    converted = quantize(model, (x,), [(torch.randn(4, 3, 8, 8),)], is_qat=True)
    with torch.no_grad():
        assert (converted(x) - model.eval()(x)).abs().max() < 0.2


def test_no_warning_in_a_fresh_process() -> None:
    testing.check_no_warning_in_fresh_process(BACKEND)


def test_demo_deploys_tensorrt_to_onnxruntime(one_thread: None) -> None:
    from fxquant.tools.demo import run_demo

    out = io.StringIO()
    assert run_demo(out, backends=[BACKEND]) == 0
    row = next(line for line in out.getvalue().splitlines() if line.startswith(f"| {BACKEND} "))
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    # onnxruntime on this CPU is not TensorRT: a slower row says so instead of blaming the model
    slower = float(cells[9].removesuffix("x")) < 1
    assert cells[-1] == (
        "slower than float: onnxruntime on the CPU stands in for TensorRT's GPU engine (its "
        "Q/DQ kernels are not TensorRT's)"
        if slower
        else "ok"
    ), row
    assert cells[-2] == plugin.RUNTIME
    # lowered: the nodes onnxruntime ran on integers (the deployed report says what ran;
    # TensorRT's own verdict, more of them, is the deployed model's target_report)
    assert int(cells[1]) > 0
    assert float(cells[5]) > 20  # SQNR against float (after the float column), in onnxruntime
