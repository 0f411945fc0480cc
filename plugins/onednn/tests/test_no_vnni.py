"""oneDNN on CPUs without VNNI (AVX2): never a silently wrong result.

There oneDNN adds pairs of uint8 x int8 products in int16 with saturation
(``fxquant.lowering.kernels.cpu``): the default mappings quantize weights to 7 bits, the
rules decline 8-bit weights with a reason, and dynamic linears with 8-bit inputs
run as two exact 7-bit GEMMs. ``FXQUANT_CPU_VNNI=0`` makes any CPU answer "no
VNNI" (the workarounds are exact everywhere); the first tests hold the detection
to what this machine's kernel computes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import fxquant
import fxquant.numerics.observer
import pytest
import torch
from fxquant.config.defaults import default_dynamic_qconfig
from fxquant.lowering.kernels import cpu
from fxquant_onednn.modules import DynamicQLinear
from fxquant_onednn.qconfig import dynamic_qconfig
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

_ONEDNN = torch.ops.onednn


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_vnni(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.ENV_VAR, "0")


def gemm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's u8 x s8 linear with unit scales and a float output: the exact sum if unsaturated."""
    rows = weight.shape[0]
    packed = _ONEDNN.qlinear_prepack(weight, list(x.shape))
    ones, zeros = torch.ones(rows), torch.zeros(rows, dtype=torch.int64)
    result: torch.Tensor = _ONEDNN.qlinear_pointwise(
        x, 1.0, 0, packed, ones, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )
    return result


def test_the_detected_capability_is_what_this_cpu_kernel_computes() -> None:
    # the worst pair: 255 * 127 twice overflows int16 unless products are added in int32
    x = torch.full((2, 64), 255, dtype=torch.uint8)
    weight = torch.full((4, 64), 127, dtype=torch.int8)
    exact = bool(gemm(x, weight).eq(255 * 127 * 64).all())
    assert exact == cpu.has_vnni(), torch.cpu.get_capabilities()


@settings(deadline=None, max_examples=25)
@given(
    seed=st.integers(0, 2**16),
    features=st.tuples(st.integers(1, 96), st.integers(1, 16)),
    bound=st.integers(1, cpu.WEIGHT_BOUND),
)
def test_weights_within_the_bound_are_exact_for_every_uint8_input(
    seed: int, features: tuple[int, int], bound: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    inputs, outputs = features
    x = torch.randint(0, 256, (3, inputs), generator=generator, dtype=torch.uint8)
    x[0] = 255  # the largest products
    weight = torch.randint(-bound, bound + 1, (outputs, inputs), generator=generator)
    weight[0] = bound
    expected = x.double() @ weight.double().t()
    assert torch.equal(gemm(x, weight.to(torch.int8)).double(), expected)


def test_the_environment_variable_overrides_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.ENV_VAR, "1")
    assert cpu.has_vnni()
    monkeypatch.setenv(cpu.ENV_VAR, "0")
    assert not cpu.has_vnni()
    monkeypatch.setenv(cpu.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=r"FXQUANT_CPU_VNNI must be 1 or 0.*'maybe'"):
        cpu.has_vnni()


@pytest.mark.parametrize("backend", ["x86", "onednn"])
@pytest.mark.parametrize("is_qat", [False, True])
def test_default_weights_are_seven_bits_without_vnni_and_eight_with_it(
    backend: str, is_qat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for vnni, weight_range in (("0", (-63, 63)), ("1", (-128, 127))):
        monkeypatch.setenv(cpu.ENV_VAR, vnni)
        qconfig = fxquant.get_default_qconfig_mapping(backend, is_qat=is_qat).global_qconfig
        weight, activation = qconfig.weight(), qconfig.activation()
        assert (weight.quant_min, weight.quant_max) == weight_range
        assert (activation.quant_min, activation.quant_max) == (0, 255)
    monkeypatch.setenv(cpu.ENV_VAR, "0")
    assert dynamic_qconfig().weight().quant_max == 63


class ConvLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def convert(
    model: nn.Module, mapping: Any, calibration: torch.Tensor, backend: str
) -> tuple[fx.GraphModule, fx.GraphModule]:
    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_fx(model.eval(), mapping, (calibration,), backend_config=config)
    with torch.no_grad():
        prepared(calibration)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared), backend_config=config)
    return fxquant.convert_fx(prepared, backend_config=config), reference


def statuses(model: fx.GraphModule) -> dict[str, Any]:
    return {e.node: e for e in fxquant.explain(model, show=False).entries()}


def output_step(reference: fx.GraphModule) -> float:
    dequantize = [n for n in reference.graph.nodes if "dequantize" in str(n.target)][-1]
    return float(dequantize.args[1])


@pytest.mark.usefixtures("no_vnni")
@pytest.mark.parametrize("backend", ["x86", "onednn"])
def test_eight_bit_weights_are_declined_with_the_reason_and_run_as_the_reference(
    backend: str,
) -> None:
    torch.manual_seed(0)
    full = fxquant.QConfig(
        activation=fxquant.observer.MinMaxObserver,
        weight=fxquant.observer.default_per_channel_weight_observer,
    )
    mapping = fxquant.QConfigMapping().set_global(full)
    model = ConvLinear()
    lowered, reference = convert(model, mapping, torch.randn(4, 3, 8, 8), backend)
    entries = statuses(lowered)
    for node in ("conv", "fc"):
        entry = entries[node]
        assert entry.status == "reference"
        assert entry.reason is not None
        assert entry.reason.code == "no_lowering_kernel"
        words = str(entry.reason.words)
        assert "oneDNN's u8 x s8 kernel saturates on CPUs without VNNI" in words, words
        assert "quant_min=-63, quant_max=63" in words
    x = torch.randn(2, 3, 8, 8) * 3
    with torch.no_grad():
        # conv + relu fuse, so the mean between the two reference nodes is lowered: an
        # integer mean, at most one step of its output grid off the reference's float one,
        # which the fc scales by at most its largest row of absolute weights
        bound = output_step(reference) * model.fc.weight.abs().sum(1).max().item()
        assert (lowered(x) - reference(x)).abs().max().item() <= bound * 1.01


@pytest.mark.usefixtures("no_vnni")
@pytest.mark.parametrize("backend", ["x86", "onednn"])
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_the_default_mapping_lowers_within_one_step_even_beyond_the_calibrated_range(
    backend: str, scale: float
) -> None:
    # inputs 4x the calibration data: uint8 values up to 255 reach the kernels, which 7-bit
    # activations (reduce_range) would have let overflow; 7-bit weights keep them exact
    torch.manual_seed(0)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    mapping.set_object_type(nn.Linear, mapping.global_qconfig)  # a static fc too
    lowered, reference = convert(ConvLinear(), mapping, torch.randn(8, 3, 8, 8), backend)
    entries = statuses(lowered)
    assert (entries["conv"].status, entries["fc"].status) == ("lowered", "lowered")
    x = torch.randn(4, 3, 8, 8) * scale
    with torch.no_grad():
        difference = float((lowered(x) - reference(x)).abs().max())
    assert difference <= output_step(reference) * 1.001 + 1e-6


SEVEN_BIT_DYNAMIC = fxquant.QConfig(
    activation=fxquant.observer.PlaceholderObserver.with_args(
        dtype=torch.uint8, quant_min=0, quant_max=127, is_dynamic=True
    ),
    weight=fxquant.observer.default_per_channel_weight_observer,  # -128..127
)


@pytest.mark.usefixtures("no_vnni")
@pytest.mark.parametrize(
    ("qconfig", "split", "quant_max"),
    # seven-bit weights asked for: parametrize runs outside the no_vnni fixture, on the host's CPU
    [(default_dynamic_qconfig, True, 255), (dynamic_qconfig(seven_bit_weights=True), False, 255),
     (SEVEN_BIT_DYNAMIC, False, 127)],
    ids=["eight_bit", "seven_bit_weights", "seven_bit_activations"],
)  # fmt: skip
def test_a_dynamic_linear_runs_exactly_as_two_seven_bit_gemms_or_one(
    qconfig: fxquant.QConfig, split: bool, quant_max: int
) -> None:
    torch.manual_seed(0)
    mapping = fxquant.QConfigMapping().set_object_type(nn.Linear, qconfig)
    model = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 8))
    lowered, reference = convert(model, mapping, torch.randn(4, 64), "x86")
    kernels = [m for m in lowered.modules() if isinstance(m, DynamicQLinear)]
    assert [k.split for k in kernels] == [split, split]
    # qparams chosen over the observer's range, as the reference's choose_qparams step does
    assert [k.quant_max for k in kernels] == [quant_max, quant_max]
    x = torch.randn(16, 64) * 5
    with torch.no_grad():
        assert torch.allclose(lowered(x), reference(x), rtol=1e-4, atol=1e-4)
