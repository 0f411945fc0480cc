"""The float32 boundary quantize of lowered models stays within one step of the reference op."""

from __future__ import annotations

import torch
from fxquant.lowering.kernels import boundary
from fxquant.numerics import qdq
from hypothesis import given
from hypothesis import strategies as st

RANGES = st.sampled_from([(torch.uint8, 0, 255), (torch.uint8, 0, 127), (torch.int8, -128, 127)])


@given(
    dtype_range=RANGES,
    scale=st.floats(1e-4, 10.0),
    zero_point=st.integers(-128, 255),
    seed=st.integers(0, 2**16),
)
def test_boundary_quantize_is_within_one_step_of_the_reference_op(
    dtype_range: tuple[torch.dtype, int, int], scale: float, zero_point: int, seed: int
) -> None:
    dtype, low, high = dtype_range
    zero_point = min(max(zero_point, low), high)
    x = torch.randn(512, generator=torch.Generator().manual_seed(seed)) * scale * 200
    fast = boundary.quantize_per_tensor(x, scale, zero_point, low, high, dtype)
    exact = qdq.quantize_per_tensor(x, scale, zero_point, low, high, dtype)
    assert fast.dtype == exact.dtype
    assert int((fast.int() - exact.int()).abs().max()) <= 1


def test_boundary_quantize_rounds_halves_up_where_the_reference_rounds_to_even() -> None:
    x = torch.tensor([0.75, 1.0, 500.0, -500.0])  # 0.75 / 0.5 + 3 = 4.5 exactly
    fast = boundary.quantize_per_tensor(x, 0.5, 3, 0, 255, torch.uint8)
    assert fast.tolist() == [5, 5, 255, 0]
    assert qdq.quantize_per_tensor(x, 0.5, 3, 0, 255, torch.uint8).tolist() == [4, 5, 255, 0]
