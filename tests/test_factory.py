from __future__ import annotations

import pytest
import torch
from fxquant.errors import ConfigTypeError
from fxquant.factory import ModuleFactory, factory_parts
from fxquant.numerics.observer import MinMaxObserver


def test_with_args_builds_the_class_with_bound_and_override_arguments() -> None:
    make = MinMaxObserver.with_args(quant_min=0, quant_max=127)
    assert make().quant_max == 127
    assert make.with_args(quant_max=255)().quant_max == 255
    assert make(quant_max=63).quant_max == 63


def test_factories_built_the_same_way_are_equal_and_hash_alike() -> None:
    a = MinMaxObserver.with_args(quant_max=127, eps=2**-12)
    b = MinMaxObserver.with_args(eps=2**-12, quant_max=127)
    assert a == b
    assert hash(a) == hash(b)
    assert a != MinMaxObserver.with_args(quant_max=255, eps=2**-12)


def test_quantized_and_plain_dtype_spellings_make_equal_factories() -> None:
    quint8 = getattr(torch, "quint8", None)
    if quint8 is None:
        pytest.skip("this torch has no quint8")
    assert MinMaxObserver.with_args(dtype=quint8) == MinMaxObserver.with_args(dtype=torch.uint8)
    assert MinMaxObserver.with_args(dtype=torch.int8) != MinMaxObserver.with_args(dtype=torch.uint8)


def test_tensor_arguments_compare_by_value() -> None:
    a = ModuleFactory(torch.nn.Identity, {"t": torch.ones(3)})
    assert a == ModuleFactory(torch.nn.Identity, {"t": torch.ones(3)})
    assert a != ModuleFactory(torch.nn.Identity, {"t": torch.zeros(3)})


def test_a_factory_does_not_see_later_changes_to_the_callers_dict() -> None:
    kwargs = {"quant_min": 0, "quant_max": 127}
    make = ModuleFactory(MinMaxObserver, kwargs)
    kwargs["quant_max"] = 3
    assert make().quant_max == 127


def test_factory_parts_splits_classes_and_factories_and_rejects_instances() -> None:
    assert factory_parts(MinMaxObserver) == (MinMaxObserver, {})
    assert factory_parts(MinMaxObserver.with_args(quant_max=127)) == (
        MinMaxObserver,
        {"quant_max": 127},
    )
    with pytest.raises(ConfigTypeError, match=r"expected a module class or a \.with_args"):
        factory_parts(MinMaxObserver())


def test_a_non_callable_class_is_refused() -> None:
    with pytest.raises(ConfigTypeError, match="ModuleFactory cls must be callable, got 3"):
        ModuleFactory(3)  # type: ignore[arg-type]
