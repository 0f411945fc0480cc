"""Int8 in, float out linear (#23): each engine's kernel computes what the reference model does.

The reference: the input quantized with its static qparams (clamped to their range), the
int8 weight dequantized, a float32 linear (+ relu). The kernels (fbgemm's fused
fp32-output linear, QNNPACK's dynamic linear given the static range) must agree within
what one step of one input moves the output (an input may round a half step the other way).
"""

from __future__ import annotations

import pytest
import torch
from fxquant.lowering import QParams, Quantize
from fxquant.nn import reference
from fxquant_quantized_engine import QuantizedLinear, TensorQParams
from fxquant_quantized_engine.float_output import float_output_reason
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

torch.set_num_threads(1)  # the test machine has 2 shared cores

ENGINES = ("fbgemm", "qnnpack")


def _reference_linear(features: int, outputs: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    linear = nn.Linear(features, outputs)
    scales = linear.weight.detach().abs().amax(1) / 63  # 7 bits: exact on FBGEMM without VNNI
    qparams = {
        "qscheme": torch.per_channel_affine,
        "dtype": torch.int8,
        "scale": scales,
        "zero_point": torch.zeros(outputs, dtype=torch.long),
        "axis": 0,
        "quant_min": -63,
        "quant_max": 63,
    }
    return reference.Linear.from_float(linear, qparams)


def _expected(ref: nn.Module, x: torch.Tensor, q: TensorQParams, relu: bool) -> torch.Tensor:
    integers = torch.clamp(torch.round(x / q.scale) + q.zero_point, q.quant_min, q.quant_max)
    with torch.no_grad():
        y = ref((integers - q.zero_point) * q.scale)
    return torch.relu(y) if relu else y


def _one_input_step(ref: nn.Module, q: TensorQParams) -> float:
    return q.scale * float(ref.get_weight().detach().abs().max()) * 1.001 + 1e-5


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=12, deadline=None)
@given(
    rows=st.integers(1, 40),
    features=st.integers(1, 70),
    outputs=st.integers(1, 40),
    zero_point=st.integers(0, 255),
    relu=st.booleans(),
    leading=st.sampled_from([(), (3,)]),
    seed=st.integers(0, 2**16),
)
def test_float_output_linear_equals_the_reference(  # noqa: PLR0913, PLR0917  # hypothesis' draws
    engine: str,
    rows: int,
    features: int,
    outputs: int,
    zero_point: int,
    relu: bool,
    leading: tuple[int, ...],
    seed: int,
) -> None:
    ref = _reference_linear(features, outputs, seed)
    q = TensorQParams(0.03, zero_point)
    x = torch.randn(*leading, rows, features) * 4  # beyond the range too: clamped as the reference
    kernel = QuantizedLinear(engine, ref, q, None, relu=relu)
    assert kernel.absorb_input(Quantize(QParams(torch.uint8, 0, 255, q.scale, q.zero_point)))
    got, want = kernel(x), _expected(ref, x, q, relu)
    assert got.dtype == torch.float32
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= _one_input_step(ref, q)


@pytest.mark.parametrize("engine", ENGINES)
def test_float_output_linear_takes_integer_inputs_exactly(engine: str) -> None:
    ref = _reference_linear(24, 8, 0)
    q = TensorQParams(0.05, 100)
    integers = torch.randint(0, 256, (5, 24), dtype=torch.uint8)
    got = QuantizedLinear(engine, ref, q, None)(integers)
    with torch.no_grad():
        want = ref((integers.float() - q.zero_point) * q.scale)
    assert torch.allclose(got, want, atol=1e-4)


def test_fbgemm_clamps_a_seven_bit_input_range_as_the_reference_does() -> None:
    ref = _reference_linear(16, 4, 1)
    q = TensorQParams(0.02, 60, 0, 127)  # fbgemm's 7-bit activations
    x = torch.linspace(-5, 5, 64).reshape(4, 16)  # far beyond 0..127's range on both sides
    kernel = QuantizedLinear("fbgemm", ref, q, None)
    assert kernel.absorb_input(Quantize(QParams(torch.uint8, 0, 127, q.scale, q.zero_point)))
    got = kernel(x)
    assert float((got - _expected(ref, x, q, relu=False)).abs().max()) <= _one_input_step(ref, q)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_quantized_consumer_makes_it_a_uint8_output_kernel(engine: str) -> None:
    ref = _reference_linear(16, 8, 2)
    q, out = TensorQParams(0.05, 128), TensorQParams(0.1, 10)
    kernel = QuantizedLinear(engine, ref, q, None)
    assert kernel.absorb(Quantize(QParams(torch.uint8, 0, 255, out.scale, out.zero_point)))
    integers = torch.randint(0, 256, (6, 16), dtype=torch.uint8)
    got = kernel(integers)
    with torch.no_grad():
        want = torch.clamp(torch.round(ref((integers.float() - 128) * 0.05) / 0.1) + 10, 0, 255)
    assert got.dtype == torch.uint8
    assert float((got.float() - want).abs().max()) <= 1


def test_qnnpack_names_the_input_range_it_cannot_reproduce() -> None:
    assert float_output_reason("qnnpack", TensorQParams(0.1, 0, 0, 255)) is None
    reason = float_output_reason("qnnpack", TensorQParams(0.1, 0, 0, 127))
    assert reason is not None
    assert "needs inputs in 0..255, not 0..127" in reason


@pytest.mark.parametrize("engine", ENGINES)
def test_float_output_linear_takes_an_input_that_requires_grad(engine: str) -> None:
    # before: qnnpack failed with "clamp(): functions with out=... arguments don't support
    # automatic differentiation" on the output of an unquantized BatchNorm or LayerNorm,
    # called outside torch.no_grad()
    ref = _reference_linear(16, 4, 3)
    q = TensorQParams(0.03, 128)
    kernel = QuantizedLinear(engine, ref, q, None)
    assert kernel.absorb_input(Quantize(QParams(torch.uint8, 0, 255, q.scale, q.zero_point)))
    x = torch.randn(5, 16, requires_grad=True)
    got = kernel(x * 1.0)
    assert not got.requires_grad  # the int8 kernel has no gradient, on either engine
    assert float((got - _expected(ref, x.detach(), q, relu=False)).abs().max()) <= (
        _one_input_step(ref, q)
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_float_output_linear_takes_a_vector_as_nn_linear_does(engine: str) -> None:
    # before: fbgemm failed with "The dimension of input tensor should be larger than or
    # equal to 2" on nn.Linear(8, 6)(torch.randn(8)) (qnnpack, x86, onednn ran it)
    ref = _reference_linear(8, 6, 4)
    q = TensorQParams(0.03, 128)
    kernel = QuantizedLinear(engine, ref, q, None)
    assert kernel.absorb_input(Quantize(QParams(torch.uint8, 0, 255, q.scale, q.zero_point)))
    x = torch.randn(8)
    got = kernel(x)
    assert got.shape == (6,)
    assert float((got - _expected(ref, x, q, relu=False)).abs().max()) <= _one_input_step(ref, q)
