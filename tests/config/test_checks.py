"""Config numbers are range-checked where they come in (#18 item 4)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from fxquant.config import BackendConfig, DTypeWithConstraints
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.numerics.fake_quantize import FakeQuantize
from fxquant.numerics.observer import (
    FixedQParamsObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)
from hypothesis import given
from hypothesis import strategies as st

NOT_FINITE = [math.nan, math.inf, -math.inf]
UNIFORM = [MinMaxObserver, MovingAverageMinMaxObserver, HistogramObserver]
MOVING = [MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver]


@pytest.mark.parametrize("cls", [*UNIFORM, PerChannelMinMaxObserver])
@pytest.mark.parametrize("eps", [*NOT_FINITE, -1.0, 0.0])
def test_eps_must_be_finite_and_positive(cls: type, eps: float) -> None:
    with pytest.raises(ConfigError) as info:
        cls(eps=eps)
    assert str(info.value) == f"{cls.__name__} eps={eps!r}: expected a finite number > 0"


@given(eps=st.floats(min_value=1e-30, max_value=1e3))
def test_any_finite_positive_eps_is_taken(eps: float) -> None:
    assert float(MinMaxObserver(eps=eps).eps) == pytest.approx(eps, rel=1e-6, abs=1e-37)


@pytest.mark.parametrize("cls", MOVING)
@pytest.mark.parametrize("constant", [*NOT_FINITE, 2.0, 0.0, -0.5, 1.0000001])
def test_averaging_constant_must_be_in_the_unit_interval(cls: type, constant: float) -> None:
    with pytest.raises(ConfigError, match=rf"^{cls.__name__} averaging_constant="):
        cls(averaging_constant=constant)


@given(constant=st.floats(min_value=1e-6, max_value=1.0))
def test_a_moving_average_in_range_stays_within_the_data(constant: float) -> None:
    observer = MovingAverageMinMaxObserver(averaging_constant=constant)
    for low, high in [(-1.0, 2.0), (-3.0, 1.0), (0.0, 0.5)]:
        observer(torch.tensor([low, high]))
    assert -3.0 <= float(observer.min_val) <= 0.0 <= float(observer.max_val) <= 2.0


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"quant_min": 0.5, "quant_max": 3}, ConfigTypeError, "quant_min=0.5: expected an int"),
        ({"quant_min": True, "quant_max": 3}, ConfigTypeError, "quant_min=True: expected an int"),
        ({"reduce_range": "yes"}, ConfigTypeError, "reduce_range='yes': expected True or False"),
        ({"factory_kwargs": 3}, ConfigTypeError, "factory_kwargs=3: expected a dict"),
        ({"eps": "0.1"}, ConfigTypeError, "eps='0.1': expected a finite number > 0, got str"),
    ],
)
def test_observer_arguments_of_the_wrong_type(
    kwargs: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=f"^MinMaxObserver {text}"):
        MinMaxObserver(**kwargs)


@pytest.mark.parametrize("bins", [0, -1, 10**12])
def test_histogram_bins_are_bounded(bins: int) -> None:
    with pytest.raises(ConfigError, match=rf"HistogramObserver bins={bins}: expected an integer"):
        HistogramObserver(bins=bins)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"scale": math.nan, "zero_point": 0}, "scale=nan: expected a finite number > 0"),
        ({"scale": -1.0, "zero_point": 0}, "scale=-1.0: expected a finite number > 0"),
        ({"scale": 0.1, "zero_point": 300}, "zero_point=300: expected an integer in"),
    ],
)
def test_fixed_qparams_are_checked(kwargs: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigError, match=f"^FixedQParamsObserver {text}"):
        FixedQParamsObserver(**kwargs)


def test_fake_quantize_passes_checked_arguments_to_its_observer() -> None:
    with pytest.raises(ConfigError, match=r"MovingAverageMinMaxObserver averaging_constant=2\.0"):
        FakeQuantize(averaging_constant=2.0)
    with pytest.raises(ConfigTypeError, match=r"FakeQuantize quant_min=0\.0: expected an int"):
        FakeQuantize(quant_min=0.0, quant_max=255)


@pytest.mark.parametrize(
    "field",
    [
        "quant_min_lower_bound",
        "quant_max_upper_bound",
        "scale_min_lower_bound",
        "scale_exact_match",
    ],
)
@pytest.mark.parametrize("value", NOT_FINITE)
def test_dtype_constraints_refuse_non_finite_bounds(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"^DTypeWithConstraints {field}={value!r}: expected"):
        DTypeWithConstraints(torch.uint8, **{field: value})


def test_a_nan_bound_in_json_is_refused_with_its_path() -> None:
    # a NaN quant_max_upper_bound compared False both ways: the constraint was off (#18)
    text = json.dumps(
        {
            "name": "b",
            "configs": [
                {
                    "pattern": {"module": "torch.nn.modules.linear", "name": "Linear"},
                    "dtype_configs": [
                        {"input_dtype": {"dtype": "torch.uint8", "quant_max_upper_bound": math.nan}}
                    ],
                }
            ],
        }
    )
    with pytest.raises(ConfigError) as info:
        BackendConfig.from_json(text)
    assert str(info.value) == (
        "configs[0].dtype_configs[0].input_dtype: DTypeWithConstraints quant_max_upper_bound=nan: "
        "expected a finite number"
    )


@pytest.mark.parametrize("eps", [-1.0, math.nan])
def test_a_bad_eps_never_reaches_a_model(eps: float) -> None:
    # before #18: eps=-1 gave an error of 0.50, eps=nan all-NaN outputs
    import fxquant

    observer = {"module": "fxquant.observer", "name": "MinMaxObserver", "kwargs": {"eps": 1.0}}
    text = json.dumps({"": {"activation": observer, "weight": observer}})
    text = text.replace('"eps": 1.0', f'"eps": {json.dumps(eps)}', 1)
    with pytest.raises(ConfigError, match=r'^\[""\]\.activation\.kwargs: MinMaxObserver eps='):
        fxquant.QConfigMapping.from_json(text)
