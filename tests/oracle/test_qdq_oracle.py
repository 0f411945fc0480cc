"""fxquant.numerics.qdq against torch's quantized tensors: bit-identical integers and floats.

torch's ``quantize_per_tensor``/``quantize_per_channel`` create ``quint8``
tensors, which torch 2.13 deprecates: every call is wrapped in
``oracle.quiet()`` and the file skips when torch no longer has them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fxquant.numerics import qdq
from hypothesis import given
from hypothesis import strategies as st

from tests import oracle

torch.set_num_threads(1)

if getattr(torch, "quint8", None) is None:
    pytest.skip("this torch has no quantized dtypes to compare with", allow_module_level=True)

# (plain dtype, torch's quantized dtype, zero-point range drawn)
DTYPES = [
    (torch.uint8, "quint8", (0, 255)),
    (torch.int8, "qint8", (-128, 127)),
    (torch.int32, "qint32", (-1000, 1000)),
]


@st.composite
def float_tensor(draw: Any, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if shape is None:
        shape = (draw(st.integers(1, 300)),)
    seed = draw(st.integers(0, 2**31 - 1))
    magnitude = 10.0 ** draw(st.integers(-6, 6))
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen) * magnitude


def scale_for(x: torch.Tensor, fraction: float) -> float:
    return max(float(x.abs().max()), 1e-12) * fraction


@given(
    x=float_tensor(),
    fraction=st.floats(1e-4, 0.5),
    dtype_index=st.integers(0, len(DTYPES) - 1),
    data=st.data(),
)
def test_quantize_per_tensor_is_bit_identical_to_torch(
    x: torch.Tensor, fraction: float, dtype_index: int, data: Any
):
    plain, name, (zp_low, zp_high) = DTYPES[dtype_index]
    zero_point = data.draw(st.integers(zp_low, zp_high))
    scale = scale_for(x, fraction)
    low, high = {torch.uint8: (0, 255), torch.int8: (-128, 127)}.get(plain, (-(2**31), 2**31 - 1))
    with oracle.quiet():
        ref = torch.quantize_per_tensor(x, scale, zero_point, getattr(torch, name))
        want_int = ref.int_repr()
        want_float = ref.dequantize()
    got = qdq.quantize_per_tensor(x, scale, zero_point, low, high, plain)
    assert got.dtype == plain
    assert torch.equal(got, want_int)
    back = qdq.dequantize_per_tensor(got, scale, zero_point, low, high, plain)
    assert torch.equal(back, want_float)


@given(
    x=float_tensor(),
    fraction=st.floats(1e-4, 0.5),
    zero_point=st.integers(0, 255),
)
def test_tensor_overload_equals_float_overload(x: torch.Tensor, fraction: float, zero_point: int):
    scale = scale_for(x, fraction)
    with oracle.quiet():
        want = torch.quantize_per_tensor(x, scale, zero_point, torch.quint8).int_repr()
    got = qdq.quantize_per_tensor(
        x, torch.tensor(scale, dtype=torch.float64), torch.tensor(zero_point), 0, 255, torch.uint8
    )
    assert torch.equal(got, want)


@st.composite
def channel_case(draw: Any) -> tuple[torch.Tensor, int]:
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    axis = draw(st.integers(0, len(shape) - 1))
    return draw(float_tensor(shape)), axis


@given(case=channel_case(), dtype_index=st.integers(0, len(DTYPES) - 1), data=st.data())
def test_quantize_per_channel_is_bit_identical_to_torch(
    case: tuple[torch.Tensor, int], dtype_index: int, data: Any
):
    x, axis = case
    plain, name, (zp_low, zp_high) = DTYPES[dtype_index]
    channels = x.shape[axis]
    fractions = data.draw(st.lists(st.floats(1e-4, 0.5), min_size=channels, max_size=channels))
    zps = data.draw(st.lists(st.integers(zp_low, zp_high), min_size=channels, max_size=channels))
    peak = max(float(x.abs().max()), 1e-12)
    scales = torch.tensor(fractions, dtype=torch.float64) * peak
    zero_points = torch.tensor(zps, dtype=torch.int64)
    low, high = {torch.uint8: (0, 255), torch.int8: (-128, 127)}.get(plain, (-(2**31), 2**31 - 1))
    with oracle.quiet():
        ref = torch.quantize_per_channel(x, scales, zero_points, axis, getattr(torch, name))
        want_int = ref.int_repr()
        want_float = ref.dequantize()
    # fxquant takes the float32 scales observers produce
    scales32 = scales.to(torch.float32)
    with oracle.quiet():
        ref32 = torch.quantize_per_channel(
            x, scales32.double(), zero_points, axis, getattr(torch, name)
        )
    got = qdq.quantize_per_channel(x, scales32, zero_points, axis, low, high, plain)
    assert torch.equal(got, ref32.int_repr())
    got64 = qdq.quantize_per_channel(x, scales, zero_points, axis, low, high, plain)
    assert torch.equal(got64, want_int)
    back = qdq.dequantize_per_channel(got64, scales, zero_points, axis, low, high, plain)
    assert torch.equal(back, want_float)


@given(x=float_tensor(), reduce_range=st.booleans(), signed=st.booleans())
def test_choose_qparams_per_tensor_matches_torch_dynamic_quantization(
    x: torch.Tensor, reduce_range: bool, signed: bool
):
    dtype, low, high = (torch.int8, -128, 127) if signed else (torch.uint8, 0, 255)
    if reduce_range:
        low, high = low // 2, high // 2
    with oracle.quiet():
        ref = torch.quantize_per_tensor_dynamic(
            x, torch.qint8 if signed else torch.quint8, reduce_range
        )
    scale, zero_point = qdq.choose_qparams_per_tensor(x, low, high, dtype)
    assert float(scale) == ref.q_scale()
    assert int(zero_point) == ref.q_zero_point()


@given(x=float_tensor((3, 17)), axis=st.integers(0, 1))
def test_float_zero_points_match_torch_float_qparams(x: torch.Tensor, axis: int):
    rows = x.movedim(axis, 0).reshape(x.shape[axis], -1)
    low, high = rows.min(dim=1).values, rows.max(dim=1).values
    scales = (high - low) / 255
    scales = torch.where(scales > 1e-7, scales, torch.ones_like(scales))
    zero_points = -1 * low / scales
    with oracle.quiet():
        ref = torch.quantize_per_channel(x, scales, zero_points, axis, torch.quint8)
        want_int, want_float = ref.int_repr(), ref.dequantize()
    got = qdq.quantize_per_channel(x, scales, zero_points, axis, 0, 255, torch.uint8)
    assert torch.equal(got, want_int)
    back = qdq.dequantize_per_channel(got, scales, zero_points, axis, 0, 255, torch.uint8)
    assert torch.equal(back, want_float)


def _decomposed() -> Any:
    """torch.ops.quantized_decomposed (defined by a torch.ao module), or skip."""
    import importlib

    with oracle.quiet():
        try:
            importlib.import_module("torch.ao.quantization.fx._decomposed")
        except ImportError:
            pytest.skip("torch.ao no longer defines the quantized_decomposed ops")
    return torch.ops.quantized_decomposed


@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 8),
    width=st.integers(1, 96),
    magnitude=st.integers(-5, 5),
    offset=st.floats(-2, 2),
)
def test_per_token_ops_equal_quantized_decomposed(
    seed: int, rows: int, width: int, magnitude: int, offset: float
) -> None:
    """The per-token ops (#23) compute what the ops of the same name ExecuTorch exports do."""
    decomposed = _decomposed()
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(2, rows, width, generator=gen) + offset) * 10.0**magnitude
    with oracle.quiet():
        want_scales, want_zps = decomposed.choose_qparams_per_token_asymmetric(x, torch.int8)
        want_q = decomposed.quantize_per_token(x, want_scales, want_zps, -128, 127, torch.int8)
        want = decomposed.dequantize_per_token(
            want_q, want_scales, want_zps, -128, 127, torch.int8, torch.float32
        )
    scales, zps = qdq.choose_qparams_per_token_asymmetric(x, torch.int8)
    assert torch.equal(scales, want_scales)
    assert torch.equal(zps, want_zps)
    q = qdq.quantize_per_token(x, scales, zps, -128, 127, torch.int8)
    # torch.ao divides in float64 where XNNPACK (and fxquant) multiply by a float32 inverse:
    # a value on a rounding tie may land one step apart, nothing more
    assert int((q.int() - want_q.int()).abs().max()) <= 1
    assert float((q != want_q).float().mean()) <= 0.01
    assert torch.equal(qdq.dequantize_per_token(want_q, scales, zps, -128, 127, torch.int8), want)
