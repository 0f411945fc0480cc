"""The kernel modules on their own: engine switch, zero-copy views, chaining, absorbed steps.

Moved here from fxquant-fbgemm's tests with the kernels, and run on both engines.
"""

from __future__ import annotations

import copy
import io
import subprocess
import sys

import pytest
import torch
from fxquant.lowering import Dequantize, QParams, Quantize
from fxquant.nn import reference
from fxquant_quantized_engine import (
    EngineScope,
    IntegerClamp,
    QuantizedLinear,
    TensorQParams,
    as_quint8,
    as_uint8,
)

ENGINES = ("fbgemm", "qnnpack")
Q = TensorQParams(0.05, 64)


@pytest.mark.parametrize("engine", ENGINES)
def test_float_boundary_quantize_matches_the_engine_kernel_bit_for_bit(engine: str) -> None:
    # their relative cost is a benchmark figure (plugins/fbgemm/bench), not a test
    x = torch.randn(1, 256)
    qparams = TensorQParams(0.02, 128)
    with EngineScope(engine):
        kernel = qparams.quantize(x)
    boundary = torch.ops.fxquant.quantize_per_tensor.default(x, 0.02, 128, 0, 255, torch.uint8)
    assert torch.equal(boundary, kernel)


def _fail_inside(engine: str) -> None:
    with EngineScope(engine):
        assert torch.backends.quantized.engine == engine
        msg = "inside"
        raise RuntimeError(msg)


def test_the_engine_scope_restores_the_engine_when_the_block_raises() -> None:
    before = torch.backends.quantized.engine
    other = "qnnpack" if before != "qnnpack" else "fbgemm"
    with pytest.raises(RuntimeError, match="inside"):
        _fail_inside(other)
    assert torch.backends.quantized.engine == before


def test_views_share_the_integers_storage_both_ways() -> None:
    values = torch.tensor([0, 10, 255], dtype=torch.uint8)
    with EngineScope("fbgemm"):
        quantized = as_quint8(values, 0.5, 10)
    assert quantized.dequantize().tolist() == [-5.0, 0.0, 122.5]
    back = as_uint8(quantized)
    back[0] = 7
    assert values[0] == 7  # one storage: no copy on either view


def _linear(engine: str, features: int, x: TensorQParams, out: TensorQParams) -> QuantizedLinear:
    torch.manual_seed(0)
    qparams = {
        "qscheme": torch.per_tensor_affine,
        "dtype": torch.int8,
        "scale": 0.02,
        "zero_point": 0,
    }
    ref = reference.Linear.from_float(torch.nn.Linear(features, features), qparams)
    return QuantizedLinear(engine, ref, x, out)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_kernel_fed_by_a_kernel_matches_one_fed_by_plain_integers(engine: str) -> None:
    # the second kernel takes the quint8 result the first one's output holds
    first, second = _linear(engine, 16, Q, Q), _linear(engine, 16, Q, Q)
    x = torch.randint(0, 256, (4, 16), dtype=torch.uint8)
    chained = first(x)
    assert torch.equal(second(chained), second(chained.clone()))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_copied_saved_or_resized_kernel_output_is_read_from_its_own_memory(engine: str) -> None:
    first, second = _linear(engine, 16, Q, Q), _linear(engine, 16, Q, Q)
    out = first(torch.randint(0, 256, (4, 16), dtype=torch.uint8))
    copied = copy.deepcopy(out).zero_()
    assert torch.equal(second(copied), second(torch.zeros_like(out)))
    buffer = io.BytesIO()
    torch.save(out, buffer)  # a plain uint8 tensor: loads with weights_only
    buffer.seek(0)
    assert torch.equal(torch.load(buffer), out)
    out.resize_(2, 16)
    assert torch.equal(second(out), second(out.clone()))


@pytest.mark.parametrize("engine", ENGINES)
def test_absorbed_clamp_and_dequantize_give_what_the_steps_gave(engine: str) -> None:
    x = torch.randint(0, 256, (4, 16), dtype=torch.uint8)
    kernel = _linear(engine, 16, Q, Q)
    clamp = IntegerClamp(Q.zero_point, Q.zero_point + 40)
    expected = clamp(kernel(x))
    fused = copy.deepcopy(kernel)
    assert fused.absorb(clamp)
    assert torch.equal(fused(x), expected)
    assert fused.absorb(Dequantize(QParams(torch.uint8, 0, 255, Q.scale, Q.zero_point)))
    assert torch.equal(fused(x), (expected.float() - Q.zero_point) * Q.scale)
    assert not fused.absorb(clamp)  # floats now: nothing more to take on the integers


@pytest.mark.parametrize("engine", ENGINES)
def test_absorbed_input_quantize_is_within_one_step_of_the_boundary_step(engine: str) -> None:
    x = torch.randn(8, 16) * 3
    kernel = _linear(engine, 16, Q, Q)
    boundary = torch.ops.fxquant.quantize_per_tensor.default(
        x, Q.scale, Q.zero_point, 0, 255, torch.uint8
    )
    expected = kernel(boundary)
    assert not kernel.absorb_input(Quantize(QParams(torch.uint8, 0, 255, 0.5, 0)))
    assert kernel.absorb_input(Quantize(QParams(torch.uint8, 0, 255, Q.scale, Q.zero_point)))
    assert (kernel(x).int() - expected.int()).abs().max() <= 1


_FIRST_KERNEL_CALL = """
import torch
from fxquant_quantized_engine import QuantizedBinary, QuantizedCat, TensorQParams
q = TensorQParams(0.1, 0)
ten = torch.full((2,), 10, dtype=torch.uint8)
kernel = {kernel}
print(kernel(ten, ten).tolist())
"""


@pytest.mark.parametrize(
    "kernel",
    [
        'QuantizedBinary("fbgemm", "add", (q, q), TensorQParams(0.2, 0))',
        "QuantizedCat('qnnpack', (q, q), q, dim=0)",
    ],
)
def test_the_first_kernel_call_of_a_process_warns_nothing(kernel: str) -> None:
    # torch warns once per process on the first quint8 tensor: binding a kernel makes one
    code = _FIRST_KERNEL_CALL.format(kernel=kernel)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[10, 10")
