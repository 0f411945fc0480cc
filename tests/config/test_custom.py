from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from fxquant.config import (
    BackendConfig,
    ConvertCustomConfig,
    FuseCustomConfig,
    PrepareCustomConfig,
    QConfigMapping,
    QuantType,
)
from fxquant.errors import ConfigError, ConfigTypeError

from tests import oracle


class ObservedLSTM(torch.nn.LSTM):
    pass


class QuantizedLSTM(torch.nn.LSTM):
    pass


def full_prepare_config() -> PrepareCustomConfig:
    inputs = (torch.ones(1, 3),)
    return (
        PrepareCustomConfig()
        .set_standalone_module_name("sub", QConfigMapping(), inputs, None, BackendConfig("b"))
        .set_standalone_module_class(
            torch.nn.GRU, None, inputs, PrepareCustomConfig().set_preserved_attributes(["x"]), None
        )
        .set_float_to_observed_mapping(torch.nn.LSTM, ObservedLSTM)
        .set_non_traceable_module_names(["decoder"])
        .set_non_traceable_module_classes([torch.nn.Transformer])
        .set_input_quantized_indexes([0])
        .set_output_quantized_indexes([0, 1])
        .set_preserved_attributes(["vocab"])
    )


def test_prepare_custom_config_dict_uses_torch_ao_keys() -> None:
    data = full_prepare_config().to_dict()
    inputs = data["standalone_module_name"][0][2]
    assert data == {
        "standalone_module_name": [
            ("sub", QConfigMapping().to_dict(), inputs, None, BackendConfig("b"))
        ],
        "standalone_module_class": [
            (torch.nn.GRU, None, inputs, {"preserved_attributes": ["x"]}, None)
        ],
        "float_to_observed_custom_module_class": {"static": {torch.nn.LSTM: ObservedLSTM}},
        "non_traceable_module_name": ["decoder"],
        "non_traceable_module_class": [torch.nn.Transformer],
        "input_quantized_idxs": [0],
        "output_quantized_idxs": [0, 1],
        "preserved_attributes": ["vocab"],
    }


def test_prepare_custom_config_round_trips_through_its_dict() -> None:
    config = full_prepare_config()
    assert PrepareCustomConfig.from_dict(config.to_dict()) == config


def test_torch_aos_quant_type_is_taken_by_its_member_name(ao: Any) -> None:
    with oracle.quiet():
        theirs = importlib.import_module("torch.ao.quantization.quant_type").QuantType
    config = ConvertCustomConfig().set_observed_to_quantized_mapping(
        torch.nn.LSTM, torch.nn.LSTM, theirs.DYNAMIC
    )
    assert list(config.observed_to_quantized_mapping) == [QuantType.DYNAMIC]  # theirs is 0


def test_prepare_custom_config_dict_matches_torch_ao(ao: Any) -> None:
    with oracle.quiet():
        custom_config = importlib.import_module("torch.ao.quantization.fx.custom_config")
        theirs = (
            custom_config.PrepareCustomConfig()
            .set_float_to_observed_mapping(torch.nn.LSTM, ObservedLSTM)
            .set_non_traceable_module_names(["decoder"])
            .set_input_quantized_indexes([0])
            .set_preserved_attributes(["vocab"])
            .to_dict()
        )
    mine = (
        PrepareCustomConfig()
        .set_float_to_observed_mapping(torch.nn.LSTM, ObservedLSTM)
        .set_non_traceable_module_names(["decoder"])
        .set_input_quantized_indexes([0])
        .set_preserved_attributes(["vocab"])
    )
    assert mine.to_dict() == theirs
    assert PrepareCustomConfig.from_dict(theirs) == mine


def test_float_to_observed_mapping_is_static_only() -> None:
    config = PrepareCustomConfig()
    with pytest.raises(ConfigError) as info:
        config.set_float_to_observed_mapping(torch.nn.LSTM, ObservedLSTM, QuantType.DYNAMIC)
    assert str(info.value) == (
        "set_float_to_observed_mapping supports quant_type=QuantType.STATIC only, got "
        "<QuantType.DYNAMIC: 'dynamic'>; custom modules for QAT or dynamic quantization "
        "are not supported"
    )
    assert config.float_to_observed_mapping == {}


def test_example_inputs_must_be_a_tuple() -> None:
    with pytest.raises(
        ConfigTypeError, match=r"example_inputs must be a tuple.*wrap a single input"
    ):
        PrepareCustomConfig().set_standalone_module_name("sub", None, torch.ones(1), None, None)


BAD_PREPARE_CALLS: list[tuple[str, tuple[Any, ...]]] = [
    ("set_standalone_module_name", (1, None, (), None, None)),
    ("set_standalone_module_name", ("m", "qconfig", (), None, None)),
    ("set_standalone_module_class", ("GRU", None, (), None, None)),
    ("set_standalone_module_class", (torch.nn.GRU, None, (), None, "fbgemm")),
    ("set_float_to_observed_mapping", (torch.nn.LSTM, torch.nn.ReLU())),
    ("set_float_to_observed_mapping", (torch.nn.LSTM, ObservedLSTM, "fast")),
    ("set_non_traceable_module_names", ("decoder",)),
    ("set_non_traceable_module_names", ([1],)),
    ("set_non_traceable_module_classes", ([int],)),
    ("set_input_quantized_indexes", ([-1],)),
    ("set_output_quantized_indexes", ([0.5],)),
    ("set_preserved_attributes", ([None],)),
]


@pytest.mark.parametrize(("setter", "args"), BAD_PREPARE_CALLS)
def test_failed_prepare_setter_leaves_the_config_unchanged(
    setter: str, args: tuple[Any, ...]
) -> None:
    config = full_prepare_config()
    before = config.to_dict()
    with pytest.raises((ConfigError, ConfigTypeError)):
        getattr(config, setter)(*args)
    assert config.to_dict() == before


def test_index_errors_name_the_position() -> None:
    with pytest.raises(ConfigError) as info:
        PrepareCustomConfig().set_input_quantized_indexes([0, -2])
    assert str(info.value) == (
        "indexes[1] must be >= 0 (a position in the model's inputs/outputs), got -2"
    )


def test_custom_configs_reject_unknown_dict_keys_under_strict() -> None:
    with pytest.raises(ConfigError) as info:
        FuseCustomConfig.from_dict({"preserved_attribute": ["a"]}, strict=True)
    assert str(info.value) == (
        "FuseCustomConfig.from_dict: unknown key(s) 'preserved_attribute' at "
        "FuseCustomConfig.from_dict['preserved_attribute']; valid keys: 'preserved_attributes'"
    )
    with pytest.raises(ConfigError, match="valid keys: 'standalone_module_name', "):
        PrepareCustomConfig.from_dict({"input_quantized_indexes": [0]}, strict=True)
    with pytest.raises(
        ConfigError, match="valid keys: 'observed_to_quantized_custom_module_class'"
    ):
        ConvertCustomConfig.from_dict({"observed_to_quantized": {}}, strict=True)


def test_convert_custom_config_keeps_one_mapping_per_quant_type() -> None:
    config = (
        ConvertCustomConfig()
        .set_observed_to_quantized_mapping(ObservedLSTM, QuantizedLSTM)
        .set_observed_to_quantized_mapping(torch.nn.LSTM, QuantizedLSTM, "dynamic")
        .set_preserved_attributes(["attr"])
    )
    assert config.to_dict() == {
        "observed_to_quantized_custom_module_class": {
            "static": {ObservedLSTM: QuantizedLSTM},
            "dynamic": {torch.nn.LSTM: QuantizedLSTM},
        },
        "preserved_attributes": ["attr"],
    }
    assert ConvertCustomConfig.from_dict(config.to_dict()) == config


def test_convert_custom_config_rejects_unknown_quant_type() -> None:
    with pytest.raises(ConfigTypeError) as info:
        ConvertCustomConfig().set_observed_to_quantized_mapping(ObservedLSTM, QuantizedLSTM, "int8")
    assert str(info.value) == (
        "quant_type must be a QuantType or one of 'dynamic', 'static', 'qat', 'weight_only', "
        "got 'int8'"
    )


def test_fuse_custom_config_round_trips() -> None:
    config = FuseCustomConfig().set_preserved_attributes(["a", "b"])
    assert config.to_dict() == {"preserved_attributes": ["a", "b"]}
    assert FuseCustomConfig.from_dict(config.to_dict()) == config
    assert FuseCustomConfig().to_dict() == {}
