from __future__ import annotations

import json
import operator
import sys
from typing import Any

import fxquant.nn.intrinsic as nni
import fxquant.nn.intrinsic.qat as nniqat
import fxquant.nn.qat as nnqat
import fxquant.nn.reference as nnref
import pytest
import torch
from fxquant.config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    MatchAllNode,
    ObservationType,
    QConfig,
    QConfigMapping,
    serialize,
)
from fxquant.errors import ConfigError, UnsafeNameError
from fxquant.nn import fusers
from fxquant.numerics.observer import MinMaxObserver, default_weight_observer
from hypothesis import given
from hypothesis import strategies as st

from tests.config import fake_plugin
from tests.config.fake_plugin import TinyObserver
from tests.config.strategies import backend_configs

QUINT8 = getattr(torch, "quint8", torch.uint8)
QINT8 = getattr(torch, "qint8", torch.int8)
DIFFERENT = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT


def tutorial_backend_config() -> BackendConfig:
    """Seed 004's BackendConfig with fxquant's modules and fuser."""
    constrained = DTypeWithConstraints(
        dtype=QUINT8,
        quant_min_lower_bound=0,
        quant_max_upper_bound=255,
        scale_min_lower_bound=2**-12,
    )
    int8 = DTypeConfig(constrained, constrained, QINT8, torch.float)
    linear = (
        BackendPatternConfig()
        .set_pattern(torch.nn.Linear)
        .set_observation_type(DIFFERENT)
        .add_dtype_config(int8)
        .set_root_module(torch.nn.Linear)
        .set_qat_module(nnqat.Linear)
        .set_reference_quantized_module(nnref.Linear)
    )
    conv_relu = (
        BackendPatternConfig()
        .set_pattern((torch.nn.Conv2d, torch.nn.ReLU))
        .set_fused_module(nni.ConvReLU2d)
        .set_fuser_method(fusers.fuse_conv_relu)
    )
    fused_conv_relu = (
        BackendPatternConfig()
        .set_pattern(nni.ConvReLU2d)
        .set_observation_type(DIFFERENT)
        .add_dtype_config(int8)
        .set_root_module(torch.nn.Conv2d)
        .set_qat_module(nniqat.ConvReLU2d)
        .set_reference_quantized_module(nnref.Conv2d)
    )
    return BackendConfig("my_backend").set_backend_pattern_configs(
        [linear, conv_relu, fused_conv_relu]
    )


def tutorial_qconfig_mapping() -> QConfigMapping:
    activation = MinMaxObserver.with_args(quant_min=0, quant_max=127, eps=2**-12)
    qconfig = QConfig(activation=activation, weight=default_weight_observer)
    mapping = QConfigMapping()
    for object_type in (torch.nn.Linear, torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU):
        mapping.set_object_type(object_type, qconfig)
    return mapping


# ---------------------------------------------------------------- round trips


def test_tutorial_backend_config_round_trips_through_json() -> None:
    backend = tutorial_backend_config()
    rebuilt = BackendConfig.from_json(backend.to_json())
    assert rebuilt.to_dict() == backend.to_dict()


def test_tutorial_qconfig_mapping_round_trips_through_json() -> None:
    mapping = tutorial_qconfig_mapping()
    rebuilt = QConfigMapping.from_json(mapping.to_json())
    assert rebuilt.to_dict() == mapping.to_dict()
    assert rebuilt.qconfig_for("conv", torch.nn.Conv2d).activation().quant_max == 127


def test_patterns_and_functions_are_written_by_qualified_name() -> None:
    config = (
        BackendPatternConfig((operator.add, "relu"))
        .add_dtype_config(DTypeConfig(QUINT8, torch.float32, is_dynamic=True))
        .set_fuser_method(fusers.fuse_conv_relu)
    )
    data = json.loads(BackendConfig("b").set_backend_pattern_config(config).to_json())
    assert data["configs"][0] == {
        "observation_type": "OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT",
        "dtype_configs": [
            {
                "input_dtype": {
                    "dtype": "torch.quint8" if QUINT8 is not torch.uint8 else "torch.uint8"
                },
                "output_dtype": {"dtype": "torch.float32"},
                "is_dynamic": True,
            }
        ],
        "pattern": [{"module": "operator", "name": "add"}, {"method": "relu"}],
        "fuser_method": {"module": "fxquant.nn.fusers", "name": "fuse_conv_relu"},
    }


def test_torch_builtins_get_the_names_users_write() -> None:
    config = BackendPatternConfig()._set_pattern_complex_format(
        (torch.add, torch.nn.functional.linear, MatchAllNode)
    )
    data = json.loads(BackendConfig().set_backend_pattern_config(config).to_json())
    assert data["configs"][0]["pattern_complex_format"] == [
        {"module": "torch", "name": "add"},
        {"module": "torch.nn.functional", "name": "linear"},
        {"module": "fxquant.config.pattern", "name": "MatchAllNode"},
    ]


@given(backend_configs)
def test_generated_backend_configs_round_trip_through_json(backend: BackendConfig) -> None:
    with fake_plugin.installed():
        rebuilt = BackendConfig.from_json(backend.to_json())
    assert rebuilt.to_dict() == backend.to_dict()


kwarg_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.sampled_from([torch.uint8, torch.int8, torch.float16, QUINT8, QINT8])
    | st.sampled_from([torch.per_tensor_affine, torch.per_channel_symmetric])
    | st.just(TinyObserver),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2).map(
            lambda kw: TinyObserver.with_args(**kw)
        )
    ),
    max_leaves=5,
)
constructors = st.just(TinyObserver) | st.dictionaries(
    st.sampled_from(["dtype", "quant_min", "eps", "qscheme", "observer"]), kwarg_values, max_size=4
).map(lambda kw: TinyObserver.with_args(**kw))
qconfigs = st.none() | st.builds(QConfig, activation=constructors, weight=constructors)


@st.composite
def mappings(draw: st.DrawFn) -> QConfigMapping:
    mapping = QConfigMapping().set_global(draw(qconfigs))
    object_types = st.sampled_from([torch.nn.Linear, torch.add, operator.mul, "relu"])
    for object_type in draw(st.lists(object_types, max_size=2)):
        mapping.set_object_type(object_type, draw(qconfigs))
    for regex in draw(st.lists(st.sampled_from(["a.*", "b$"]), max_size=2)):
        mapping.set_module_name_regex(regex, draw(qconfigs))
    for name in draw(st.lists(st.sampled_from(["a", "a.b"]), max_size=2)):
        mapping.set_module_name(name, draw(qconfigs))
    if draw(st.booleans()):
        mapping.set_module_name_object_type_order("a", draw(object_types), 1, draw(qconfigs))
    return mapping


@given(mappings())
def test_generated_qconfig_mappings_round_trip_through_json(mapping: QConfigMapping) -> None:
    with fake_plugin.installed():
        rebuilt = QConfigMapping.from_json(mapping.to_json())
    assert rebuilt.to_dict() == mapping.to_dict()


def test_observer_class_and_factory_without_kwargs_stay_distinct() -> None:
    qconfig = QConfig(activation=TinyObserver, weight=TinyObserver.with_args())
    with fake_plugin.installed():
        text = QConfigMapping().set_global(qconfig).to_json()
        rebuilt = QConfigMapping.from_json(text).global_qconfig
    assert rebuilt == qconfig
    assert rebuilt is not None
    assert rebuilt.activation is TinyObserver


# ---------------------------------------------------------------- names that are refused


def backend_json(**entries: Any) -> str:
    return json.dumps({"name": "b", "configs": [{"pattern": {"method": "relu"}, **entries}]})


def test_function_outside_fxquant_is_refused_before_import() -> None:
    assert "antigravity" not in sys.modules
    text = backend_json(fuser_method={"module": "antigravity", "name": "geohash"})
    with fake_plugin.installed(), pytest.raises(UnsafeNameError) as info:
        BackendConfig.from_json(text)
    assert str(info.value) == (
        "configs[0].fuser_method: 'antigravity.geohash' is outside the modules trusted for "
        "a fuser function (fxquant, tests)"
    )
    assert "antigravity" not in sys.modules


def test_torch_functions_are_not_trusted_as_fusers() -> None:
    text = backend_json(root_node_getter={"module": "torch", "name": "load"})
    with pytest.raises(UnsafeNameError, match=r"configs\[0\]\.root_node_getter: 'torch\.load'"):
        BackendConfig.from_json(text)


def test_re_exported_function_is_refused() -> None:
    # fxquant.config.serialize imports importlib; its import_module is not fxquant's
    ref = {"module": "fxquant.config.serialize", "name": "importlib.import_module"}
    with pytest.raises(UnsafeNameError) as info:
        BackendConfig.from_json(backend_json(fuser_method=ref))
    # refused from the name alone (#18): serialize is no module fusers are read from
    assert str(info.value) == (
        "configs[0].fuser_method: 'fxquant.config.serialize.importlib.import_module' is not "
        "in a module fxquant reads a fuser function from "
        "(fxquant.nn.fusers, fxquant.patterns.conv_add)"
    )


def test_dunder_names_are_refused() -> None:
    ref = {"module": "fxquant", "name": "__builtins__"}
    with pytest.raises(UnsafeNameError, match="not a plain dotted name"):
        BackendConfig.from_json(backend_json(extra_inputs_getter=ref))


def test_non_function_in_a_plugin_is_refused() -> None:
    ref = {"module": "tests.config.fake_plugin", "name": "NOT_A_FUNCTION"}
    with fake_plugin.installed(), pytest.raises(UnsafeNameError, match="fuser_method: 3 is not"):
        BackendConfig.from_json(backend_json(fuser_method=ref))


def test_module_class_must_be_a_module_class() -> None:
    text = backend_json(root_module={"module": "torch", "name": "add"})
    with pytest.raises(UnsafeNameError) as info:
        BackendConfig.from_json(text)
    assert str(info.value) == (
        f"configs[0].root_module: {torch.add!r} is not a torch.nn.Module subclass"
    )


def test_pattern_outside_trusted_roots_is_refused() -> None:
    text = json.dumps({"name": "b", "configs": [{"pattern": {"module": "os", "name": "system"}}]})
    with pytest.raises(UnsafeNameError, match=r"configs\[0\]\.pattern: 'os\.system' is outside"):
        BackendConfig.from_json(text)


def test_trusted_roots_per_kind_are_pinned() -> None:
    # a security allow-list derived from ALLOWED_MODULES: widening it must show up here
    with fake_plugin.installed():
        roots = {kind: serialize.trusted_roots(kind) for kind in serialize.ALLOWED_MODULES}
    ops = {"torch", "operator", "fxquant", "tests"}
    assert roots == {
        serialize.OP: ops,
        serialize.MODULE_CLASS: ops,
        serialize.FUSER: {"fxquant", "tests"},
        serialize.GETTER: {"fxquant", "tests"},
        serialize.CONSTRUCTOR: {"fxquant", "tests"},
    }


def test_observer_class_from_torch_is_refused() -> None:
    qconfig = {"activation": {"module": "torch.nn", "name": "Identity"}, "weight": None}
    with fake_plugin.installed(), pytest.raises(UnsafeNameError) as info:
        QConfigMapping.from_json(json.dumps({"": qconfig}))
    assert str(info.value) == (
        "[\"\"].activation: 'torch.nn.Identity' is outside the modules trusted for "
        "an observer class (fxquant, tests)"
    )


def test_lambda_fuser_cannot_be_written() -> None:
    config = BackendPatternConfig((torch.nn.Conv2d, torch.nn.ReLU)).set_fuser_method(
        lambda is_qat, conv, relu: conv
    )
    with pytest.raises(UnsafeNameError, match=r"^configs\[0\]\.fuser_method: <function"):
        BackendConfig().set_backend_pattern_config(config).to_json()


def test_observer_defined_outside_fxquant_cannot_be_written() -> None:
    qconfig = QConfig(activation=TinyObserver, weight=TinyObserver)
    with pytest.raises(UnsafeNameError, match=r'^\[""\]\.activation: <class'):
        QConfigMapping().set_global(qconfig).to_json()


def test_tensor_kwarg_cannot_be_written() -> None:
    qconfig = QConfig(activation=TinyObserver.with_args(scale=torch.ones(1)), weight=TinyObserver)
    with fake_plugin.installed(), pytest.raises(UnsafeNameError) as info:
        QConfigMapping().set_object_type("relu", qconfig).to_json()
    assert str(info.value).startswith("object_type[0][1].activation.kwargs.scale: tensor([1.])")


def test_unknown_json_keys_are_listed() -> None:
    with pytest.raises(ConfigError, match=r"got unknown key.*'fuser'; valid keys: 'pattern'"):
        BackendConfig.from_json(backend_json(fuser={"module": "fxquant", "name": "x"}))


def test_invalid_json_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="the text is not valid JSON"):
        QConfigMapping.from_json("{")


def test_invalid_value_in_json_names_its_config() -> None:
    text = backend_json(input_type_to_index={"weight": -1})
    with pytest.raises(ConfigError) as info:
        BackendConfig.from_json(text)
    assert str(info.value) == (
        "configs[0]: input_type_to_index['weight'] must be an argument index (int >= 0), got -1"
    )


def test_unknown_observation_type_in_json_lists_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        BackendConfig.from_json(backend_json(observation_type="SHARED"))
    assert str(info.value) == (
        "configs[0].observation_type: expected one of OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT, "
        "OUTPUT_SHARE_OBSERVER_WITH_INPUT, INPUT_OUTPUT_NOT_OBSERVED, got 'SHARED'"
    )


def test_quantized_dtype_names_read_back_as_the_same_dtype() -> None:
    text = backend_json(
        dtype_configs=[{"input_dtype": "torch.quint8", "weight_dtype": "torch.int8"}]
    )
    config = BackendConfig.from_json(text).configs[0].dtype_configs[0]
    assert config == DTypeConfig(torch.uint8, weight_dtype=QINT8)


@pytest.mark.parametrize(
    ("bias_dtype", "words"),
    [
        (3, "expected a dtype name like 'torch.uint8', got 3"),
        ("float", "expected a dtype name like 'torch.uint8', got 'float'"),
        ("torch.nope", "'torch.nope' is not a torch dtype"),
    ],
)
def test_bad_dtype_name_in_json_names_its_path(bias_dtype: object, words: str) -> None:
    text = json.dumps({"configs": [{"dtype_configs": [{"bias_dtype": bias_dtype}]}]})
    with pytest.raises(ConfigError) as info:
        BackendConfig.from_json(text)
    assert str(info.value) == f"configs[0].dtype_configs[0].bias_dtype: {words}"
