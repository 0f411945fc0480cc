from __future__ import annotations

import importlib
import operator
from typing import Any

import pytest
import torch
from fxquant.config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    MatchAllNode,
    ObservationType,
)
from fxquant.errors import ConfigError, ConfigTypeError
from hypothesis import given

from tests import oracle
from tests.config import fake_plugin
from tests.config.strategies import backend_configs, dtype_configs, pattern_configs

Conv, BN, ReLU = torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU
QUINT8 = getattr(torch, "quint8", torch.uint8)
QINT8 = getattr(torch, "qint8", torch.int8)
DIFFERENT = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
SHARE = ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT


def int8_config() -> DTypeConfig:
    return DTypeConfig(QUINT8, QUINT8, QINT8, torch.float)


# ---------------------------------------------------------------- ObservationType, dtypes


def test_observation_type_has_the_three_seed_values() -> None:
    assert [t.name for t in ObservationType] == [
        "OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT",
        "OUTPUT_SHARE_OBSERVER_WITH_INPUT",
        "INPUT_OUTPUT_NOT_OBSERVED",
    ]


def test_dtype_with_constraints_has_the_seven_fields() -> None:
    c = DTypeWithConstraints(QUINT8, 0, 255, 2**-12, 1.0, 1 / 256, 0)
    assert (c.quant_min_lower_bound, c.quant_max_upper_bound) == (0, 255)
    assert (c.scale_min_lower_bound, c.scale_max_upper_bound) == (2**-12, 1.0)
    assert (c.scale_exact_match, c.zero_point_exact_match) == (1 / 256, 0)


def test_quantized_and_plain_dtypes_are_the_same_constraint() -> None:
    a = DTypeWithConstraints(QUINT8, quant_min_lower_bound=0)
    b = DTypeWithConstraints(torch.uint8, quant_min_lower_bound=0)
    assert a == b
    assert hash(a) == hash(b)
    assert DTypeConfig(QUINT8, weight_dtype=QINT8) == DTypeConfig(
        torch.uint8, weight_dtype=torch.int8
    )


def test_quant_min_bound_above_quant_max_bound_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        DTypeWithConstraints(torch.uint8, quant_min_lower_bound=10, quant_max_upper_bound=5)
    assert str(info.value) == (
        "quant_min_lower_bound=10 is greater than quant_max_upper_bound=5; "
        "the lower bound must not exceed the upper bound"
    )


def test_scale_min_bound_above_scale_max_bound_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"scale_min_lower_bound=2\.0 is greater than"):
        DTypeWithConstraints(torch.uint8, scale_min_lower_bound=2.0, scale_max_upper_bound=1.0)


def test_constraint_of_wrong_type_names_the_field_and_value() -> None:
    with pytest.raises(ConfigTypeError) as info:
        DTypeWithConstraints(torch.uint8, quant_min_lower_bound="0")
    assert str(info.value) == (
        "quant_min_lower_bound must be int or float or None, got '0' of type str"
    )
    with pytest.raises(ConfigTypeError, match="zero_point_exact_match must be int"):
        DTypeWithConstraints(torch.uint8, zero_point_exact_match=True)


def test_constraints_without_a_dtype_are_rejected() -> None:
    with pytest.raises(ConfigError, match="but dtype is None"):
        DTypeWithConstraints(quant_min_lower_bound=0)


def test_dtype_config_exposes_plain_dtypes_and_constraints() -> None:
    constrained = DTypeWithConstraints(QUINT8, 0, 255, 2**-12)
    config = DTypeConfig(constrained, constrained, QINT8, torch.float)
    assert config.input_dtype is QUINT8
    assert config.weight_dtype is QINT8
    assert config.input_dtype_with_constraints is constrained
    assert config.weight_dtype_with_constraints == DTypeWithConstraints(QINT8)
    assert config.bias_dtype is torch.float32


def test_dtype_config_rejects_a_string_dtype() -> None:
    with pytest.raises(ConfigTypeError) as info:
        DTypeConfig(input_dtype="quint8")
    assert str(info.value) == (
        "input_dtype must be a torch.dtype, a DTypeWithConstraints or None, "
        "got 'quint8' of type str"
    )


def test_dtype_config_rejects_non_bool_is_dynamic() -> None:
    with pytest.raises(ConfigTypeError, match="is_dynamic must be True, False or None, got 1"):
        DTypeConfig(is_dynamic=1)  # type: ignore[arg-type]  # the wrong type is the test


def test_dtype_config_to_dict_leaves_out_unset_entries() -> None:
    config = DTypeConfig(QUINT8, torch.float32, is_dynamic=True)
    assert config.to_dict() == {
        "input_dtype": DTypeWithConstraints(QUINT8),
        "output_dtype": DTypeWithConstraints(torch.float32),
        "is_dynamic": True,
    }


def test_dtype_config_from_dict_lists_the_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        DTypeConfig.from_dict({"bias_type": torch.float})
    assert str(info.value) == (
        "DTypeConfig.from_dict got unknown key(s) 'bias_type'; valid keys: 'input_dtype', "
        "'output_dtype', 'weight_dtype', 'bias_dtype', 'is_dynamic'"
    )


@given(dtype_configs)
def test_dtype_config_round_trips_through_its_dict(config: DTypeConfig) -> None:
    assert DTypeConfig.from_dict(config.to_dict()) == config


# ---------------------------------------------------------------- BackendPatternConfig


def test_every_setter_sets_its_attribute() -> None:
    config = (
        BackendPatternConfig()
        .set_pattern((Conv, ReLU))
        .set_observation_type(SHARE)
        .add_dtype_config(int8_config())
        .set_root_module(Conv)
        .set_qat_module(fake_plugin.FusedConvReLU)
        .set_reference_quantized_module(torch.nn.Linear)
        .set_fused_module(fake_plugin.FusedConvReLU)
        .set_fuser_method(fake_plugin.fuse_conv_relu)
        ._set_root_node_getter(fake_plugin.root_node_getter)
        ._set_extra_inputs_getter(fake_plugin.extra_inputs_getter)
        ._set_num_tensor_args_to_observation_type({1: SHARE, 2: DIFFERENT})
        ._set_input_type_to_index({"weight": 1, "bias": 2})
    )
    assert config.to_dict() == {
        "observation_type": SHARE,
        "dtype_configs": [int8_config().to_dict()],
        "pattern": (Conv, ReLU),
        "root_module": Conv,
        "qat_module": fake_plugin.FusedConvReLU,
        "reference_quantized_module_for_root": torch.nn.Linear,
        "fused_module": fake_plugin.FusedConvReLU,
        "fuser_method": fake_plugin.fuse_conv_relu,
        "root_node_getter": fake_plugin.root_node_getter,
        "extra_inputs_getter": fake_plugin.extra_inputs_getter,
        "num_tensor_args_to_observation_type": {1: SHARE, 2: DIFFERENT},
        "input_type_to_index": {"weight": 1, "bias": 2},
    }
    assert config.normalized_pattern == (ReLU, Conv)


def test_default_config_has_different_observers_and_no_dtypes() -> None:
    config = BackendPatternConfig(torch.nn.Linear)
    assert config.to_dict() == {
        "observation_type": DIFFERENT,
        "dtype_configs": [],
        "pattern": torch.nn.Linear,
    }


def test_set_dtype_configs_replaces_previous_ones() -> None:
    config = BackendPatternConfig("relu").add_dtype_config(DTypeConfig(torch.float16))
    config.set_dtype_configs([int8_config()])
    assert config.dtype_configs == [int8_config()]


def test_complex_pattern_has_no_simple_pattern() -> None:
    config = BackendPatternConfig()._set_pattern_complex_format(
        (operator.add, (BN, Conv), MatchAllNode)
    )
    assert config.pattern is None
    assert config.normalized_pattern == (operator.add, (BN, Conv), MatchAllNode)


def test_only_one_pattern_format_can_be_set() -> None:
    config = BackendPatternConfig((Conv, ReLU))
    with pytest.raises(ConfigError) as info:
        config._set_pattern_complex_format((ReLU, Conv))
    assert str(info.value) == (
        "cannot set pattern_complex_format (ReLU, Conv2d): this config already has pattern "
        "(Conv2d, ReLU); only one of 'pattern' or 'pattern_complex_format' can be set"
    )
    other = BackendPatternConfig()._set_pattern_complex_format((ReLU, Conv))
    with pytest.raises(ConfigError, match="only one of 'pattern' or 'pattern_complex_format'"):
        other.set_pattern(ReLU)


def test_from_dict_sets_the_pattern_before_any_other_field() -> None:
    # torch.ao's order: the pattern keys first, so a dict with both formats and a bad
    # observation type is refused for its patterns, pattern first
    data = {"observation_type": "shared", "pattern_complex_format": (ReLU, Conv)}
    with pytest.raises(ConfigError) as info:
        BackendPatternConfig.from_dict({**data, "pattern": (Conv, ReLU)})
    assert str(info.value).startswith(
        "cannot set pattern_complex_format (ReLU, Conv2d): this config already has pattern "
    )


def test_observation_type_must_be_the_enum() -> None:
    with pytest.raises(ConfigTypeError) as info:
        BackendPatternConfig("relu").set_observation_type(0)  # type: ignore[arg-type]  # tested
    assert str(info.value) == (
        "observation_type must be an ObservationType, got 0; choose one of "
        "ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT, "
        "ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT, "
        "ObservationType.INPUT_OUTPUT_NOT_OBSERVED"
    )


def test_fuser_must_be_callable() -> None:
    with pytest.raises(ConfigTypeError) as info:
        BackendPatternConfig((Conv, ReLU)).set_fuser_method("fuse_conv_relu")  # type: ignore[arg-type]
    assert str(info.value) == (
        "fuser_method must be a function or None, got 'fuse_conv_relu' of type str"
    )


def test_module_instance_is_rejected_where_a_class_is_expected() -> None:
    with pytest.raises(ConfigTypeError) as info:
        BackendPatternConfig(Conv).set_root_module(torch.nn.ReLU())  # type: ignore[arg-type]
    assert str(info.value) == (
        "root_module must be a torch.nn.Module subclass (the class, not an instance) or None, "
        "got ReLU() of type ReLU"
    )


def test_input_type_to_index_rejects_negative_indexes() -> None:
    with pytest.raises(ConfigError, match=r"input_type_to_index\['weight'\] must be an argument"):
        BackendPatternConfig("x")._set_input_type_to_index({"weight": -1})


BAD_CALLS: list[tuple[str, Any]] = [
    ("set_pattern", (Conv, BN, ReLU, ReLU)),
    ("set_pattern", 3),
    ("_set_pattern_complex_format", ()),
    ("set_observation_type", "OUTPUT_SHARE_OBSERVER_WITH_INPUT"),
    ("add_dtype_config", torch.uint8),
    ("set_dtype_configs", [int8_config(), "int8"]),
    ("set_dtype_configs", int8_config()),
    ("set_root_module", torch.nn.Linear(1, 1)),
    ("set_qat_module", "Linear"),
    ("set_reference_quantized_module", int),
    ("set_fused_module", 1),
    ("set_fuser_method", 1),
    ("_set_root_node_getter", 1),
    ("_set_extra_inputs_getter", "f"),
    ("_set_num_tensor_args_to_observation_type", {1: SHARE, "2": SHARE}),
    ("_set_num_tensor_args_to_observation_type", {1: 1}),
    ("_set_input_type_to_index", {"weight": "1"}),
    ("_set_input_type_to_index", [("weight", 1)]),
]


@pytest.mark.parametrize(("setter", "value"), BAD_CALLS)
def test_failed_setter_leaves_the_config_unchanged(setter: str, value: Any) -> None:
    config = (
        BackendPatternConfig((Conv, ReLU))
        .add_dtype_config(int8_config())
        .set_fuser_method(fake_plugin.fuse_conv_relu)
        ._set_num_tensor_args_to_observation_type({2: SHARE})
    )
    before = config.to_dict()
    with pytest.raises((ConfigError, ConfigTypeError)):
        getattr(config, setter)(value)
    assert config.to_dict() == before


def test_pattern_config_from_dict_lists_the_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        BackendPatternConfig.from_dict({"pattern": ReLU, "reference_quantized_module": Conv})
    assert str(info.value) == (
        "BackendPatternConfig.from_dict got unknown key(s) 'reference_quantized_module'; "
        "valid keys: 'pattern', 'pattern_complex_format', 'observation_type', "
        "'dtype_configs', 'root_module', 'qat_module', 'reference_quantized_module_for_root', "
        "'fused_module', 'fuser_method', 'root_node_getter', 'extra_inputs_getter', "
        "'num_tensor_args_to_observation_type', 'input_type_to_index'"
    )


def test_config_without_pattern_has_no_normalized_pattern() -> None:
    with pytest.raises(ConfigError, match="has no pattern; call set_pattern"):
        BackendPatternConfig().normalized_pattern  # the property raises


@given(pattern_configs())
def test_pattern_config_round_trips_through_its_dict(config: BackendPatternConfig) -> None:
    rebuilt = BackendPatternConfig.from_dict(config.to_dict())
    assert rebuilt.to_dict() == config.to_dict()
    assert rebuilt.normalized_pattern == config.normalized_pattern


def test_copy_is_independent() -> None:
    config = BackendPatternConfig("relu").add_dtype_config(int8_config())
    copy = config.copy()
    copy.add_dtype_config(DTypeConfig(torch.float16))._set_input_type_to_index({"weight": 1})
    assert len(config.dtype_configs) == 1
    assert config._input_type_to_index == {}


# ---------------------------------------------------------------- BackendConfig


def test_setting_a_pattern_again_overrides_it_in_place() -> None:
    first = BackendPatternConfig((Conv, ReLU))
    linear = BackendPatternConfig(torch.nn.Linear)
    replacement = BackendPatternConfig()._set_pattern_complex_format((ReLU, Conv))
    backend = BackendConfig("b").set_backend_pattern_configs([first, linear])
    backend.set_backend_pattern_config(replacement)
    assert backend.configs == [replacement, linear]
    assert backend.configs[0] is replacement


def test_configs_is_a_copy() -> None:
    backend = BackendConfig("b").set_backend_pattern_config(BackendPatternConfig("relu"))
    backend.configs.clear()
    assert len(backend.configs) == 1
    assert list(backend.configs_by_pattern) == ["relu"]


def test_backend_config_repr_names_the_backend_and_lists_its_configs() -> None:
    relu = BackendPatternConfig(torch.nn.ReLU).add_dtype_config(DTypeConfig(torch.quint8))
    backend = BackendConfig("b").set_backend_pattern_configs([relu, BackendPatternConfig("add")])
    assert repr(backend) == (
        f"BackendConfig(name='b', configs=[{relu!r}, BackendPatternConfig({{'observation_type': "
        "<ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT: 0>, 'dtype_configs': [], "
        "'pattern': 'add'})])"
    )


def test_set_backend_pattern_configs_is_all_or_nothing() -> None:
    backend = BackendConfig("b")
    with pytest.raises(ConfigError, match="has no pattern"):
        backend.set_backend_pattern_configs([BackendPatternConfig("relu"), BackendPatternConfig()])
    assert backend.configs == []


def test_backend_config_rejects_non_configs_and_non_str_names() -> None:
    with pytest.raises(ConfigTypeError, match="config must be a BackendPatternConfig, got 'relu'"):
        BackendConfig().set_backend_pattern_config("relu")  # type: ignore[arg-type]  # tested
    with pytest.raises(ConfigTypeError, match="BackendConfig name must be a str, got 3"):
        BackendConfig().set_name(3)  # type: ignore[arg-type]  # tested


def test_backend_config_from_dict_lists_the_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        BackendConfig.from_dict({"name": "b", "config": []})
    assert str(info.value) == (
        "BackendConfig.from_dict got unknown key(s) 'config'; valid keys: 'name', 'configs'"
    )


@given(backend_configs)
def test_backend_config_round_trips_through_its_dict(backend: BackendConfig) -> None:
    assert BackendConfig.from_dict(backend.to_dict()).to_dict() == backend.to_dict()


# ---------------------------------------------------------------- torch.ao as oracle


def _comparable(value: Any) -> Any:
    """torch.ao's and fxquant's records as plain data, so the two dicts compare."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_comparable(v) for v in value)
    if type(value).__name__ == "ObservationType":
        return ("ObservationType", value.name)
    if type(value).__name__ == "DTypeWithConstraints":
        names = (
            "dtype",
            "quant_min_lower_bound",
            "quant_max_upper_bound",
            "scale_min_lower_bound",
            "scale_max_upper_bound",
            "scale_exact_match",
            "zero_point_exact_match",
        )
        return ("DTypeWithConstraints", *(getattr(value, n) for n in names))
    return value


def _tutorial_config(api: Any, modules: dict[str, Any], fuser: Any) -> Any:
    """The seed tutorial's BackendConfig, built with ``api``'s classes."""
    constrained = api.DTypeWithConstraints(
        dtype=QUINT8,
        quant_min_lower_bound=0,
        quant_max_upper_bound=255,
        scale_min_lower_bound=2**-12,
    )
    int8 = api.DTypeConfig(
        input_dtype=constrained,
        output_dtype=constrained,
        weight_dtype=QINT8,
        bias_dtype=torch.float,
    )
    different = api.ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    linear = (
        api.BackendPatternConfig()
        .set_pattern(torch.nn.Linear)
        .set_observation_type(different)
        .add_dtype_config(int8)
        .set_root_module(torch.nn.Linear)
        .set_qat_module(modules["qat_linear"])
        .set_reference_quantized_module(modules["ref_linear"])
    )
    conv_relu = (
        api.BackendPatternConfig()
        .set_pattern((torch.nn.Conv2d, torch.nn.ReLU))
        .set_fused_module(modules["conv_relu"])
        .set_fuser_method(fuser)
    )
    fused_conv_relu = (
        api.BackendPatternConfig()
        .set_pattern(modules["conv_relu"])
        .set_observation_type(different)
        .add_dtype_config(int8)
        .set_root_module(torch.nn.Conv2d)
        .set_qat_module(modules["qat_conv_relu"])
        .set_reference_quantized_module(modules["ref_conv"])
    )
    return (
        api.BackendConfig("my_backend")
        .set_backend_pattern_config(linear)
        .set_backend_pattern_config(conv_relu)
        .set_backend_pattern_config(fused_conv_relu)
    )


def _ao_modules() -> dict[str, Any]:
    with oracle.quiet():
        nni = importlib.import_module("torch.ao.nn.intrinsic")
        nniqat = importlib.import_module("torch.ao.nn.intrinsic.qat")
        nnqat = importlib.import_module("torch.ao.nn.qat")
        nnref = importlib.import_module("torch.ao.nn.quantized.reference")
    return {
        "qat_linear": nnqat.Linear,
        "ref_linear": nnref.Linear,
        "conv_relu": nni.ConvReLU2d,
        "qat_conv_relu": nniqat.ConvReLU2d,
        "ref_conv": nnref.Conv2d,
    }


def test_tutorial_config_to_dict_matches_torch_ao(ao: Any) -> None:
    import fxquant.config as ours

    modules = _ao_modules()
    with oracle.quiet():
        theirs = _tutorial_config(ao.backend_config, modules, fake_plugin.fuse_conv_relu).to_dict()
    mine = _tutorial_config(ours, modules, fake_plugin.fuse_conv_relu).to_dict()
    assert _comparable(mine) == _comparable(theirs)


@pytest.mark.parametrize("getter", ["get_native_backend_config", "get_onednn_backend_config"])
def test_torch_ao_backend_configs_load_from_their_dicts(ao: Any, getter: str) -> None:
    with oracle.quiet():
        native = getattr(ao.backend_config, getter)()
        native_dict = native.to_dict()
    backend = BackendConfig.from_dict(native_dict)
    assert len(backend.configs) == len(native.configs)
    assert backend.name == native.name
    # same content, torch.ao's MatchAllNode aside (it becomes fxquant's)
    ours = _comparable(backend.to_dict())
    theirs = _comparable(native_dict)
    for mine, their in zip(ours["configs"], theirs["configs"], strict=True):
        assert mine.keys() == their.keys()
        assert mine["dtype_configs"] == their["dtype_configs"]
        assert mine.get("fuser_method") is their.get("fuser_method")
