"""A backend made of this library alone lowers every op within one step, on both engines."""

from __future__ import annotations

import dataclasses

import fxquant
import pytest
from fxquant.tools import testing
from fxquant_quantized_engine import QuantizedConv, QuantizedLinear, transformer_ops_int8


def int8_case(case: testing.Case) -> testing.Case:
    """``case`` with a transformer's ops int8 too (the default mapping keeps adds, LayerNorm,
    softmax, GELU and matmuls float, #23), so their kernels stay tested."""
    if case.mapping is not None:
        return case
    return dataclasses.replace(
        case, mapping=lambda b: transformer_ops_int8(fxquant.get_default_qconfig_mapping(b))
    )


SIZES = (2, 4, 5, 6)  # batch, in channels, out channels, spatial size
# the lowering checks but the fresh-process one: a registered plugin lives in this process only
CHECKS = [
    c
    for c in testing.lowering_checks((QuantizedConv, QuantizedLinear), cases=[])
    if str(c) != "no_warning_in_fresh_process"
]


@pytest.mark.parametrize("case", [int8_case(c) for c in testing.LOWERING_CASES], ids=str)
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
