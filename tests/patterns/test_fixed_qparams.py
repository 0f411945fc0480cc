"""Fixed-qparams ops demand exactly the grid their output range needs."""

from __future__ import annotations

import operator

import pytest
import torch
from fxquant.config.backend import DTypeConfig, DTypeWithConstraints
from fxquant.errors import ConfigError
from fxquant.patterns import (
    RANGE_0_TO_1,
    RANGE_NEG1_TO_1,
    fixed_qparams_op_configs,
    fixed_qparams_ops,
    with_fixed_qparams,
)
from hypothesis import given
from hypothesis import strategies as st

UINT8 = DTypeConfig(input_dtype=torch.uint8, output_dtype=torch.uint8)


def test_sigmoid_grid_covers_zero_to_one_in_256_steps() -> None:
    assert (RANGE_0_TO_1.scale, RANGE_0_TO_1.zero_point) == (1.0 / 256.0, 0)
    # the largest code dequantizes just below 1: 255/256
    assert (RANGE_0_TO_1.quant_max - RANGE_0_TO_1.zero_point) * RANGE_0_TO_1.scale == 255 / 256


def test_tanh_grid_covers_minus_one_to_one_around_code_128() -> None:
    assert (RANGE_NEG1_TO_1.scale, RANGE_NEG1_TO_1.zero_point) == (2.0 / 256.0, 128)
    assert (0 - RANGE_NEG1_TO_1.zero_point) * RANGE_NEG1_TO_1.scale == -1.0


def test_each_op_gets_its_grid_as_exact_constraints() -> None:
    expected = {
        torch.nn.Sigmoid: (1 / 256, 0),
        torch.sigmoid: (1 / 256, 0),
        "sigmoid_": (1 / 256, 0),
        torch.nn.Hardsigmoid: (1 / 256, 0),
        torch.nn.functional.hardsigmoid: (1 / 256, 0),
        "hardsigmoid": (1 / 256, 0),
        torch.nn.Softmax: (1 / 256, 0),
        torch.nn.Tanh: (2 / 256, 128),
        torch.tanh: (2 / 256, 128),
        "tanh_": (2 / 256, 128),
    }
    configs = {c.pattern: c for c in fixed_qparams_op_configs([UINT8])}
    assert len(configs) == len(fixed_qparams_ops()) == 13
    for op, (scale, zero_point) in expected.items():
        [dtype_config] = configs[op].dtype_configs
        for side in (
            dtype_config.input_dtype_with_constraints,
            dtype_config.output_dtype_with_constraints,
        ):
            assert side == DTypeWithConstraints(
                torch.uint8, 0, 255, scale_exact_match=scale, zero_point_exact_match=zero_point
            ), op


_DTYPES = st.sampled_from([None, torch.uint8, torch.int8, torch.float16, torch.float])


@given(
    input_dtype=_DTYPES,
    output_dtype=_DTYPES,
    weight_dtype=_DTYPES,
    is_dynamic=st.sampled_from([None, False, True]),
)
def test_only_uint8_activations_are_constrained(
    input_dtype: torch.dtype | None,
    output_dtype: torch.dtype | None,
    weight_dtype: torch.dtype | None,
    is_dynamic: bool | None,
) -> None:
    original = DTypeConfig(input_dtype, output_dtype, weight_dtype, torch.float, is_dynamic)
    [fixed] = with_fixed_qparams([original], RANGE_NEG1_TO_1)
    for side, dtype in (("input", input_dtype), ("output", output_dtype)):
        got = getattr(fixed, f"{side}_dtype_with_constraints")
        want = (
            RANGE_NEG1_TO_1.constraints()
            if dtype is torch.uint8
            else getattr(original, f"{side}_dtype_with_constraints")
        )
        assert got == want
    assert operator.attrgetter("weight_dtype_with_constraints", "bias_dtype", "is_dynamic")(
        fixed
    ) == operator.attrgetter("weight_dtype_with_constraints", "bias_dtype", "is_dynamic")(original)


def test_scale_bounds_on_a_fixed_qparams_activation_are_refused() -> None:
    bounded = DTypeWithConstraints(torch.quint8, scale_min_lower_bound=2**-12)
    config = DTypeConfig(input_dtype=bounded, output_dtype=bounded)
    with pytest.raises(ConfigError, match=r"scale_min_lower_bound=0\.000244140625 in the input of"):
        with_fixed_qparams([config], RANGE_0_TO_1)


def test_scale_bounds_on_other_dtypes_are_left_alone() -> None:
    bounded = DTypeWithConstraints(torch.int8, scale_min_lower_bound=2**-12)
    config = DTypeConfig(input_dtype=bounded, output_dtype=bounded)
    assert with_fixed_qparams([config], RANGE_0_TO_1) == [config]
