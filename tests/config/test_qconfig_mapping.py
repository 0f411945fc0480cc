from __future__ import annotations

import copy
import importlib
import pickle
import re
from types import ModuleType
from typing import Any

import pytest
import torch
from fxquant.config import QConfig, QConfigMapping
from fxquant.errors import ConfigError, ConfigTypeError
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests import oracle
from tests.config.fake_plugin import TinyObserver


def make_qconfig(tag: int) -> QConfig:
    return QConfig(activation=TinyObserver.with_args(tag=tag), weight=TinyObserver)


Q1, Q2, Q3, Q4, Q5 = (make_qconfig(i) for i in range(1, 6))
Linear = torch.nn.Linear
linear_fn = torch.nn.functional.linear


def test_each_level_overrides_the_ones_below_it() -> None:
    mapping = QConfigMapping().set_global(Q1)
    assert mapping.qconfig_for("a.fc", Linear, 0) is Q1
    mapping.set_object_type(Linear, Q2)
    assert mapping.qconfig_for("a.fc", Linear, 0) is Q2
    mapping.set_module_name_regex(r"a\..*", Q3)
    assert mapping.qconfig_for("a.fc", Linear, 0) is Q3
    mapping.set_module_name("a", Q4)
    assert mapping.qconfig_for("a.fc", Linear, 0) is Q4
    mapping.set_module_name_object_type_order("a", Linear, 0, Q5)  # the first Linear `a` calls
    assert mapping.qconfig_for("a.fc", Linear, 0) is Q5
    assert mapping.qconfig_for("a.fc", Linear, 1) is Q4
    assert mapping.qconfig_for("a.fc", Linear) is Q4


def test_an_order_entry_counts_a_module_in_its_parent_and_a_call_in_its_module() -> None:
    """Seed 003: `("", nn.Conv2d, 3)` is the fourth Conv2d the root calls directly."""
    conv = torch.nn.Conv2d
    mapping = (
        QConfigMapping()
        .set_module_name_object_type_order("", conv, 3, Q1)
        .set_module_name_object_type_order("block", torch.add, 0, Q2)
    )
    assert mapping.qconfig_for("conv3", conv, 3) is Q1
    assert mapping.qconfig_for("block.conv3", conv, 3) is None  # called by `block`, not the root
    assert mapping.qconfig_for("block", torch.add, 0) is Q2
    assert mapping.qconfig_for("block.add", torch.add, 0) is None


def test_regexes_match_in_registration_order_as_seed_003_says() -> None:
    mapping = (
        QConfigMapping()
        .set_module_name_regex("foo.*bar.*conv[0-9]+", Q1)
        .set_module_name_regex("foo.*bar.*", Q2)
        .set_module_name_regex("foo.*", Q3)
    )
    assert mapping.qconfig_for("foo.bar.conv0") is Q1
    assert mapping.qconfig_for("foo.bar.linear") is Q2
    assert mapping.qconfig_for("foo.baz.relu") is Q3


def test_overriding_a_regex_keeps_its_original_position() -> None:
    mapping = QConfigMapping().set_module_name_regex("foo.*", Q1).set_module_name_regex("f.*", Q2)
    mapping.set_module_name_regex("foo.*", Q3)
    assert list(mapping.module_name_regex_qconfigs) == ["foo.*", "f.*"]
    assert mapping.qconfig_for("foo.x") is Q3


def test_module_name_applies_to_submodules_nearest_first() -> None:
    mapping = QConfigMapping().set_module_name("a", Q1).set_module_name("a.b", Q2)
    assert mapping.qconfig_for("a.b.c", Linear) is Q2
    assert mapping.qconfig_for("a.x", Linear) is Q1
    assert mapping.qconfig_for("ab", Linear) is None


def test_none_is_an_answer_not_a_miss() -> None:
    mapping = QConfigMapping().set_global(Q1).set_object_type("relu", None)
    assert mapping.qconfig_for("", "relu", 0) is None
    assert mapping.qconfig_for("", "add", 0) is Q1


def test_to_dict_uses_torch_ao_keys_and_tuples() -> None:
    mapping = (
        QConfigMapping()
        .set_global(Q1)
        .set_object_type(Linear, Q2)
        .set_module_name_regex("foo.*", Q3)
        .set_module_name("m", None)
        .set_module_name_object_type_order("foo.bar", linear_fn, 0, Q4)
    )
    assert mapping.to_dict() == {
        "": Q1,
        "object_type": [(Linear, Q2)],
        "module_name_regex": [("foo.*", Q3)],
        "module_name": [("m", None)],
        "module_name_object_type_order": [("foo.bar", linear_fn, 0, Q4)],
    }
    assert QConfigMapping.from_dict(mapping.to_dict()) == mapping


def test_from_dict_lists_the_valid_keys_under_strict() -> None:
    with pytest.raises(ConfigError) as info:
        QConfigMapping.from_dict({"global": Q1}, strict=True)
    assert str(info.value) == (
        "QConfigMapping.from_dict: unknown key(s) 'global' at QConfigMapping.from_dict['global']; "
        "valid keys: '', 'object_type', 'module_name_regex', 'module_name', "
        "'module_name_object_type_order'"
    )


def test_from_dict_rejects_entries_of_the_wrong_length() -> None:
    with pytest.raises(ConfigError, match=r"module_name\[0\] must be a tuple of 2 items"):
        QConfigMapping.from_dict({"module_name": [("a", "b", Q1)]})


def test_regex_that_does_not_compile_is_rejected() -> None:
    mapping = QConfigMapping()
    with pytest.raises(ConfigError) as info:
        mapping.set_module_name_regex("foo[", Q1)
    assert str(info.value).startswith("module_name_regex 'foo[' is not a valid regular expression")
    assert mapping.module_name_regex_qconfigs == {}


def test_a_lookup_compiles_each_regex_once_even_when_res_cache_is_emptied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # re's own cache holds 512 patterns for the whole process: a model's other regexes
    # evicted the mapping's, and every node's lookup compiled them again
    compiled: list[str] = []
    real_compile = re.compile

    def counting_compile(pattern: str, flags: int = 0) -> re.Pattern[str]:
        compiled.append(pattern)
        return real_compile(pattern, flags)

    monkeypatch.setattr(re, "compile", counting_compile)
    mapping = QConfigMapping().set_module_name_regex("enc.*", Q1).set_module_name_regex("x", Q2)
    mapping.module_name_regex_qconfigs["dec.*"] = Q3  # the attribute is public, as in torch.ao
    for _ in range(3):
        re.purge()
        assert mapping.qconfig_for("enc.fc", Linear) is Q1
        assert mapping.qconfig_for("dec.fc", Linear) is Q3
        assert mapping.qconfig_for("head", Linear) is None
    assert sorted(compiled) == ["dec.*", "enc.*", "x"]


def test_a_regex_assigned_directly_is_still_checked_at_lookup() -> None:
    mapping = QConfigMapping()
    mapping.module_name_regex_qconfigs = {"foo[": Q1}
    with pytest.raises(ConfigError, match="module_name_regex 'foo\\[' is not a valid regular"):
        mapping.qconfig_for("foo", Linear)
    mapping.module_name_regex_qconfigs = {3: Q1}  # type: ignore[dict-item]
    with pytest.raises(ConfigTypeError, match="module_name_regex must be a str, got 3"):
        mapping.qconfig_for("foo", Linear)


# pickle.dumps(mapping, protocol=4) on fxquant before the compiled regexes were kept with
# the mapping: the pickle holds the five levels, as it did then
_PICKLED = (
    b"\x80\x04\x95\xde\x00\x00\x00\x00\x00\x00\x00\x8c\x1efxquant.config.qconfig_mapping"
    b"\x94\x8c\x0eQConfigMapping\x94\x93\x94)\x81\x94}\x94(\x8c\x0eglobal_qconfig\x94N"
    b"\x8c\x14object_type_qconfigs\x94}\x94\x8c\x1amodule_name_regex_qconfigs\x94}\x94"
    b"\x8c\x05enc.*\x94Ns\x8c\x14module_name_qconfigs\x94}\x94\x8c\x04head\x94Ns"
    b"\x8c&module_name_object_type_order_qconfigs\x94}\x94ub."
)


def test_pickles_and_copies_hold_the_levels_only_and_look_up_alike() -> None:
    mapping = QConfigMapping().set_module_name_regex("enc.*", None).set_module_name("head", None)
    mapping.set_global(Q1)
    assert mapping.qconfig_for("enc.fc", Linear) is None  # compiles and keeps "enc.*"
    mapping.set_global(None)
    assert pickle.dumps(mapping, protocol=4) == _PICKLED
    assert copy.copy(mapping).qconfig_for("enc.fc", Linear) is None
    for other in (pickle.loads(_PICKLED), copy.deepcopy(mapping)):
        assert other == mapping
        other.set_global(Q2).set_module_name_regex("dec.*", Q3)
        assert other.qconfig_for("enc.fc", Linear) is None
        assert other.qconfig_for("dec.fc", Linear) is Q3
        assert other.qconfig_for("body", Linear) is Q2
    assert mapping.qconfig_for("dec.fc", Linear) is None  # a copy's entries stay its own


def test_a_mapping_built_without_init_looks_its_regexes_up() -> None:
    # torch.ao's five attributes are public: a subclass that sets them itself, or a copy made
    # with __new__, has no cache from __init__ and still resolves
    class Mine(QConfigMapping):
        def __init__(self) -> None:
            self.global_qconfig = Q2
            self.object_type_qconfigs = {}
            self.module_name_regex_qconfigs = {"enc.*": Q1}
            self.module_name_qconfigs = {}
            self.module_name_object_type_order_qconfigs = {}

    bare = QConfigMapping.__new__(QConfigMapping)
    vars(bare).update(vars(Mine()))
    for mapping in (Mine(), bare):
        assert mapping.qconfig_for("enc.fc", Linear) is Q1
        assert mapping.qconfig_for("body", Linear) is Q2


def test_object_type_must_be_a_class_function_or_method_name() -> None:
    with pytest.raises(ConfigTypeError) as info:
        QConfigMapping().set_object_type(torch.nn.ReLU(), Q1)
    assert str(info.value) == (
        "object_type must be a module class, a function or a method name, got ReLU() of type "
        "ReLU; e.g. torch.nn.Linear, torch.add, 'relu'"
    )


def test_qconfig_must_be_a_qconfig_or_none() -> None:
    with pytest.raises(ConfigTypeError) as info:
        QConfigMapping().set_object_type(Linear, "int8")  # type: ignore[arg-type]  # tested
    assert str(info.value) == (
        "qconfig must be a fxquant.QConfig or None (None leaves the match in float), "
        "got 'int8' of type str"
    )


BAD_CALLS: list[tuple[str, tuple[Any, ...]]] = [
    ("set_global", (1,)),
    ("set_object_type", (3, Q1)),
    ("set_object_type", ("not a method", Q1)),
    ("set_object_type", (torch.nn.ReLU(), Q1)),
    ("set_object_type", (int, Q1)),
    ("set_module_name_regex", (1, Q1)),
    ("set_module_name", (None, Q1)),
    ("set_module_name", ("m", object())),
    ("set_module_name_object_type_order", ("m", Linear, -1, Q1)),
    ("set_module_name_object_type_order", ("m", Linear, True, Q1)),
    ("set_module_name_object_type_order", (1, Linear, 0, Q1)),
]


@pytest.mark.parametrize(("setter", "args"), BAD_CALLS)
def test_failed_setter_leaves_the_mapping_unchanged(setter: str, args: tuple[Any, ...]) -> None:
    mapping = QConfigMapping().set_global(Q1).set_module_name("m", Q2)
    before = mapping.to_dict()
    with pytest.raises((ConfigError, ConfigTypeError)):
        getattr(mapping, setter)(*args)
    assert mapping.to_dict() == before


names = st.sampled_from(["", "a", "a.b", "a.b.c", "b", "b.a", "ab"])
object_types = st.sampled_from([Linear, torch.nn.ReLU, linear_fn, torch.add, "relu"])
regexes = st.sampled_from(["a.*", "b", r"a\.b", ".*c$", "", "x"])
qconfigs = st.none() | st.sampled_from([Q1, Q2, Q3, Q4, Q5])


@st.composite
def mappings(draw: st.DrawFn) -> QConfigMapping:
    mapping = QConfigMapping()
    if draw(st.booleans()):
        mapping.set_global(draw(qconfigs))
    for object_type in draw(st.lists(object_types, max_size=3)):
        mapping.set_object_type(object_type, draw(qconfigs))
    for regex in draw(st.lists(regexes, max_size=3)):
        mapping.set_module_name_regex(regex, draw(qconfigs))
    for name in draw(st.lists(names, max_size=3)):
        mapping.set_module_name(name, draw(qconfigs))
    for name, object_type, index in draw(
        st.lists(st.tuples(names, object_types, st.integers(0, 2)), max_size=3)
    ):
        mapping.set_module_name_object_type_order(name, object_type, index, draw(qconfigs))
    return mapping


@given(mappings())
def test_mapping_round_trips_through_its_dict(mapping: QConfigMapping) -> None:
    assert QConfigMapping.from_dict(mapping.to_dict()).to_dict() == mapping.to_dict()


@given(mappings(), names, object_types, st.none() | st.integers(0, 2))
def test_qconfig_for_agrees_with_torch_ao(
    mapping: QConfigMapping, name: str, object_type: Any, index: int | None
) -> None:
    oracle.load()
    with oracle.quiet():
        utils = importlib.import_module("torch.ao.quantization.fx.qconfig_mapping_utils")
        # torch.ao's helpers read the same attribute names, so they run on our mapping
        expected = utils._maybe_adjust_qconfig_for_module_type_or_name(
            mapping, object_type, name, mapping.global_qconfig
        )
        if index is not None:
            # torch.ao counts a module among its parent's calls (_generate_node_name_to_qconfig)
            is_module = isinstance(object_type, type) and issubclass(object_type, torch.nn.Module)
            scope = name.rpartition(".")[0] if is_module else name
            expected = utils._maybe_adjust_qconfig_for_module_name_object_type_order(
                mapping, scope, object_type, index, expected
            )
    assert mapping.qconfig_for(name, object_type, index) is expected


_NN_CLASS_NAMES = sorted(
    name
    for name in dir(torch.nn)
    if isinstance(getattr(torch.nn, name), type) and issubclass(getattr(torch.nn, name), nn.Module)
)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(_NN_CLASS_NAMES))
def test_a_module_class_given_by_its_name_is_refused_with_the_class_to_pass(name: str) -> None:
    # torch.ao stores the string, which then matches no node, without a word
    expected = (
        f"object_type {name!r} is the name of a module class, and a string object type matches "
        f"method calls only (e.g. 'relu' for x.relu()): pass the class, torch.nn.{name}, not "
        f"the string {name!r}"
    )
    with pytest.raises(ConfigTypeError) as info:
        QConfigMapping().set_object_type(name, Q1)
    assert str(info.value) == expected
    with pytest.raises(ConfigTypeError, match="is the name of a module class"):
        QConfigMapping().set_module_name_object_type_order("", name, 0, Q1)
    with pytest.raises(ConfigTypeError, match=f"pass the class, torch.nn.{name},"):
        QConfigMapping.from_dict({"object_type": [(name, Q1)]})


def test_torch_aos_method_names_stay_accepted(ao: ModuleType) -> None:
    with oracle.quiet():
        names = {
            key
            for backend in ("x86", "fbgemm", "qnnpack", "onednn")
            for key in ao.get_default_qconfig_mapping(backend).object_type_qconfigs
            if isinstance(key, str)
        }
    assert names  # e.g. 'hardsigmoid', 'reshape': not all of them are torch.Tensor methods
    mapping = QConfigMapping()
    for name in sorted(names):
        mapping.set_object_type(name, Q1)
    assert set(mapping.object_type_qconfigs) == names


def test_a_function_given_by_its_name_is_refused_with_the_functions_to_pass() -> None:
    # 'conv2d' is no torch.Tensor method: the entry would match no node, without a word
    with pytest.raises(ConfigTypeError) as info:
        QConfigMapping().set_object_type("conv2d", Q1)
    assert str(info.value) == (
        "object_type 'conv2d' names no torch.Tensor method, and a string object type matches "
        "method calls only (e.g. 'relu' for x.relu(), 'add' for x.add(y)), so it would match "
        "nothing; pass the object itself: torch.nn.functional.conv2d, torch.conv2d, "
        "torch.nn.Conv2d"
    )
    with pytest.raises(ConfigTypeError, match=r"'typo_op' names no torch\.Tensor method"):
        QConfigMapping().set_module_name_object_type_order("", "typo_op", 0, Q1)
    with pytest.raises(ConfigTypeError, match=r"torch\.nn\.functional\.linear, torch\.nn\.Linear$"):
        QConfigMapping.from_dict({"object_type": [("linear", Q1)]})


_TENSOR_METHOD_NAMES = sorted(
    name for name in dir(torch.Tensor) if name.isidentifier() and not hasattr(torch.nn, name)
)


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(_TENSOR_METHOD_NAMES))
def test_every_tensor_method_name_is_accepted(name: str) -> None:
    mapping = QConfigMapping().set_object_type(name, Q1)
    assert mapping.qconfig_for("", name) is Q1
