"""The fbgemm plugin passes fxquant's shared backend checks, and each kernel is within one step.

The checks live in :mod:`fxquant.tools.testing`, shared with the other quint8 engine (qnnpack);
the kernel modules' own tests are fxquant-quantized-engine's.
"""

from __future__ import annotations

import dataclasses

import fxquant
import pytest
import torch
from fxquant.tools import testing
from fxquant.tools.testing import Case, Sizes
from fxquant_fbgemm import plugin
from fxquant_quantized_engine import QuantizedConv, QuantizedLinear, transformer_ops_int8
from hypothesis import given, settings
from hypothesis import strategies as st

torch.set_num_threads(1)  # the test machine has 2 shared cores

BACKEND = "fbgemm"


def int8_case(case: Case) -> Case:
    """``case`` with a transformer's ops int8 too (the default mapping keeps adds, LayerNorm,
    softmax, GELU and matmuls float, #23), so their kernels stay tested."""
    if case.mapping is not None:
        return case
    return dataclasses.replace(
        case, mapping=lambda b: transformer_ops_int8(fxquant.get_default_qconfig_mapping(b))
    )


CASES = [int8_case(c) for c in testing.LOWERING_CASES]  # every kernel, fp16 linear included
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


def test_transposed_conv_with_eight_channels_is_within_one_step() -> None:
    # FBGEMM's transposed conv kernel is wrong from 8 -> 8 channels on (torch 2.13): the
    # backend replays it in float instead; this size was found by the hypothesis test above
    case = next(c for c in CASES if c.name == "conv_transpose2d")
    for sizes in ((1, 8, 8, 4), (2, 16, 16, 5)):
        testing.check_lowering(BACKEND, case, sizes)
