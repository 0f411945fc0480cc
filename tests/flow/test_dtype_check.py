from __future__ import annotations

import pytest
import torch
from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.config.qconfig import QConfig
from fxquant.flow.dtype_check import QConfigProbe, select_dtype_config
from fxquant.numerics.observer import FixedQParamsObserver, MinMaxObserver, default_weight_observer


def probe(**kwargs: object) -> QConfigProbe:
    return QConfigProbe.of(
        QConfig(activation=MinMaxObserver.with_args(**kwargs), weight=default_weight_observer)
    )


def config(act: object, **extra: object) -> BackendPatternConfig:
    dtype = DTypeConfig(input_dtype=act, output_dtype=act, **extra)  # type: ignore[arg-type]
    return BackendPatternConfig(torch.nn.ReLU).add_dtype_config(dtype)


def test_quint8_qconfig_is_accepted_by_a_uint8_config() -> None:
    chosen = select_dtype_config(config(torch.uint8), probe(dtype=torch.quint8), "relu")
    assert isinstance(chosen, DTypeConfig)


@pytest.mark.parametrize(
    ("constraint", "kwargs", "code", "field"),
    [
        (
            DTypeWithConstraints(torch.quint8, quant_max_upper_bound=127),
            {},
            "quant_range",
            "quant_max_upper_bound",
        ),
        (
            DTypeWithConstraints(torch.quint8, quant_min_lower_bound=1),
            {},
            "quant_range",
            "quant_min_lower_bound",
        ),
        (
            DTypeWithConstraints(torch.quint8, scale_min_lower_bound=1e-3),
            {},
            "scale_min",
            "scale_min_lower_bound",
        ),
        (DTypeWithConstraints(torch.qint8), {}, "dtype_mismatch", "activation_dtype"),
    ],
)
def test_failed_constraint_names_its_field_and_bound(
    constraint: DTypeWithConstraints, kwargs: dict[str, object], code: str, field: str
) -> None:
    reason = select_dtype_config(config(constraint), probe(**kwargs), "relu")
    assert not isinstance(reason, DTypeConfig)
    assert (reason.code, reason.field) == (code, field)


def test_fixed_qparams_must_match_exactly() -> None:
    grid = DTypeWithConstraints(
        torch.quint8, 0, 255, scale_exact_match=1 / 256, zero_point_exact_match=0
    )
    wrong = QConfig(
        activation=FixedQParamsObserver.with_args(scale=2 / 256, zero_point=128),
        weight=default_weight_observer,
    )
    reason = select_dtype_config(config(grid), QConfigProbe.of(wrong), "sigmoid")
    assert not isinstance(reason, DTypeConfig)
    assert reason.code == "fixed_qparams"
    plain = select_dtype_config(config(grid), probe(), "sigmoid")
    assert not isinstance(plain, DTypeConfig)
    assert "not a FixedQParamsObserver" in plain.words


def test_static_qconfig_is_refused_by_a_dynamic_config() -> None:
    reason = select_dtype_config(config(torch.uint8, is_dynamic=True), probe(), "linear")
    assert not isinstance(reason, DTypeConfig)
    assert reason.code == "is_dynamic"


@pytest.mark.parametrize(
    ("dtype", "qscheme", "quant_range", "zero_point", "accepted"),
    [
        (torch.int8, torch.per_tensor_symmetric, (-128, 127), 0, True),
        (torch.int8, torch.per_tensor_affine, (-128, 127), 0, False),
        (torch.uint8, torch.per_tensor_symmetric, (0, 255), 128, True),
        (torch.uint8, torch.per_tensor_symmetric, (0, 255), 0, False),
    ],
)
def test_zero_point_alone_asks_for_symmetric_quantization(
    dtype: torch.dtype,
    qscheme: torch.qscheme,
    quant_range: tuple[int, int],
    zero_point: int,
    accepted: bool,
) -> None:
    constraint = DTypeWithConstraints(dtype, zero_point_exact_match=zero_point)
    low, high = quant_range
    found = select_dtype_config(
        config(constraint),
        probe(dtype=dtype, qscheme=qscheme, quant_min=low, quant_max=high),
        "relu",
    )
    if accepted:
        assert isinstance(found, DTypeConfig)
        return
    assert not isinstance(found, DTypeConfig)
    assert (found.code, found.field, found.bound) == ("zero_point", "zero_point_exact_match", 0)
    assert "use a *_symmetric qscheme" in found.words


def test_a_symmetric_weight_constraint_refuses_affine_per_channel_weights() -> None:
    from fxquant.numerics.observer import PerChannelMinMaxObserver

    weight = DTypeWithConstraints(torch.int8, zero_point_exact_match=0)
    dtype = DTypeConfig(torch.uint8, torch.uint8, weight, torch.float)
    linear = BackendPatternConfig(torch.nn.Linear).add_dtype_config(dtype)
    affine = QConfig(
        activation=MinMaxObserver,
        weight=PerChannelMinMaxObserver.with_args(
            dtype=torch.int8, qscheme=torch.per_channel_affine
        ),
    )
    reason = select_dtype_config(linear, QConfigProbe.of(affine), "fc")
    assert not isinstance(reason, DTypeConfig)
    assert reason.words == (
        "fc: the backend needs weight zero point 0 (symmetric quantization) but the qconfig "
        "weight observer has qscheme per_channel_affine; use a *_symmetric qscheme"
    )
    symmetric = QConfig(
        activation=MinMaxObserver,
        weight=PerChannelMinMaxObserver.with_args(
            dtype=torch.int8, qscheme=torch.per_channel_symmetric
        ),
    )
    assert isinstance(select_dtype_config(linear, QConfigProbe.of(symmetric), "fc"), DTypeConfig)
