"""A backend made of this library alone lowers every op within one step, on both engines."""

from __future__ import annotations

import pytest
from fxquant import testing
from fxquant_quantized_engine import QuantizedConv, QuantizedLinear

SIZES = (2, 4, 5, 6)  # batch, in channels, out channels, spatial size
# the lowering checks but the fresh-process one: a registered plugin lives in this process only
CHECKS = [
    c
    for c in testing.lowering_checks((QuantizedConv, QuantizedLinear), cases=[])
    if str(c) != "no_warning_in_fresh_process"
]


@pytest.mark.parametrize("case", testing.LOWERING_CASES, ids=str)
def test_every_op_lowers_within_one_step_of_the_reference(backend: str, case: testing.Case) -> None:
    if case.name == "linear_fp16" and backend == "quint8_qnnpack":
        pytest.skip("QNNPACK has no fp16 GEMM: the backend offers no fp16 config")
    testing.check_lowering(backend, case, SIZES)


@pytest.mark.parametrize("check", CHECKS, ids=str)
def test_lowered_models_pass_the_shared_kernel_check(
    backend: str, check: testing.NamedCheck
) -> None:
    check(backend)


@pytest.mark.parametrize("is_qat", [False, True], ids=["ptq", "qat"])
def test_the_default_mapping_lowers_every_op_family(backend: str, is_qat: bool) -> None:
    testing.check_default_mapping_lowers_every_op(backend, is_qat=is_qat)


def test_fixed_qparams_ops_get_their_exact_grid(backend: str) -> None:
    testing.check_fixed_qparams_grid(backend)
