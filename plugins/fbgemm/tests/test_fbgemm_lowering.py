"""The fbgemm plugin passes fxquant's shared backend checks, and each kernel is within one step.

The checks live in :mod:`fxquant.testing`, shared with the other quint8 engine (qnnpack).
"""

from __future__ import annotations

import pytest
import torch
from fxquant import testing
from fxquant.kernels.quantized_engine import (
    EngineScope,
    QuantizedConv,
    QuantizedLinear,
    TensorQParams,
)
from fxquant.testing import Case, Sizes
from fxquant_fbgemm import plugin
from hypothesis import given, settings
from hypothesis import strategies as st

torch.set_num_threads(1)  # the test machine has 2 shared cores

BACKEND = "fbgemm"
CASES = testing.LOWERING_CASES  # fbgemm has every kernel, fp16 linear included
CHECKS = [
    *testing.lowering_checks((QuantizedConv, QuantizedLinear), CASES),
    *testing.backend_checks(
        plugin, "fxquant-fbgemm 0.1.0", ["fbgemm_linear", "fbgemm_conv2d", "fbgemm_ops"]
    ),
]


@pytest.mark.parametrize("check", CHECKS, ids=str)
def test_backend_passes_the_shared_check(check: testing.NamedCheck) -> None:
    check(BACKEND)


@pytest.mark.parametrize("case", CASES, ids=str)
@settings(max_examples=3, deadline=None)
@given(sizes=st.tuples(*(st.integers(*bounds) for bounds in testing.SIZE_BOUNDS)))
def test_lowered_op_is_within_one_step_of_the_reference_model(case: Case, sizes: Sizes) -> None:
    testing.check_lowering(BACKEND, case, sizes)


def test_float_boundary_quantize_matches_the_engine_kernel_bit_for_bit() -> None:
    # their relative cost is a benchmark figure (bench/bench_fbgemm.py), not a test
    x = torch.randn(1, 256)
    qparams = TensorQParams(0.02, 128)
    with EngineScope(BACKEND):
        kernel = qparams.quantize(x)
    boundary = torch.ops.fxquant.quantize_per_tensor.default(x, 0.02, 128, 0, 255, torch.uint8)
    assert torch.equal(boundary, kernel)
