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


@given(
    dtype_range=RANGES,
    exponent=st.integers(-23, 3),
    zero_point=st.integers(-128, 255),
    halves=st.lists(st.integers(-700, 700), min_size=1, max_size=64),
    nudge=st.sampled_from([0.0, 2.0**-24, -(2.0**-24), 2.0**-22, -(2.0**-22)]),
)
def test_boundary_quantize_rounds_values_on_a_half_step_to_even_as_the_reference_does(
    dtype_range: tuple[torch.dtype, int, int],
    exponent: int,
    zero_point: int,
    halves: list[int],
    nudge: float,
) -> None:
    """An SE gate of 0.5 times a dequantized value lands exactly on half steps (an untrained
    DeepLabV3-MobileNetV3: a quarter of one conv's inputs); rounding them all up shifted the
    conv reading them 5 steps from its reference."""
    dtype, low, high = dtype_range
    zero_point = min(max(zero_point, low), high)
    scale = 2.0**exponent  # x / scale is then exact: every value sits on its half step
    # on a half step, or within float32 rounding of one (an SE gate of 0.5 plus a few ulps)
    x = ((torch.tensor(halves, dtype=torch.float64) + 0.5) * (1 + nudge)).float() * scale
    fast = boundary.quantize_per_tensor(x, scale, zero_point, low, high, dtype)
    assert fast.tolist() == qdq.quantize_per_tensor(x, scale, zero_point, low, high, dtype).tolist()
