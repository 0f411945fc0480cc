from __future__ import annotations

import operator

import pytest
import torch
from fxquant.config.pattern import (
    MatchAllNode,
    complex_to_simple,
    op_kind,
    pattern_str,
    simple_to_complex,
    validate_complex,
    validate_simple,
)
from fxquant.errors import ConfigError, ConfigTypeError
from hypothesis import given

from tests import oracle
from tests.config.strategies import chains, complex_patterns, simple_patterns

Conv, BN, ReLU = torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU


def test_simple_tuples_convert_to_reversed_nested_tuples() -> None:
    assert simple_to_complex(torch.nn.Linear) is torch.nn.Linear
    assert simple_to_complex((Conv, ReLU)) == (ReLU, Conv)
    assert simple_to_complex((Conv, BN, ReLU)) == (ReLU, (BN, Conv))


def test_plain_chains_convert_back_to_simple_and_branches_do_not() -> None:
    assert complex_to_simple((ReLU, (BN, Conv))) == (Conv, BN, ReLU)
    assert complex_to_simple(ReLU) is ReLU
    assert complex_to_simple((operator.add, Conv, MatchAllNode)) is None
    assert complex_to_simple((ReLU, (ReLU, (BN, Conv)))) is None  # 4 ops: too long


@given(simple_patterns)
def test_simple_to_complex_to_simple_is_identity(pattern: object) -> None:
    assert complex_to_simple(simple_to_complex(pattern)) == pattern


@given(chains)
def test_chain_complex_to_simple_to_complex_is_identity(pattern: object) -> None:
    assert simple_to_complex(complex_to_simple(pattern)) == pattern


@given(complex_patterns)
def test_complex_patterns_are_stable_under_validation_and_conversion(pattern: object) -> None:
    normal = validate_complex(pattern)
    assert validate_complex(normal) == normal
    hash(normal)
    simple = complex_to_simple(normal)
    if simple is not None:
        assert simple_to_complex(simple) == normal


def test_simple_tuple_longer_than_three_is_rejected_naming_the_pattern() -> None:
    with pytest.raises(ConfigError) as info:
        validate_simple((Conv, BN, ReLU, torch.nn.Dropout))
    assert str(info.value) == (
        "pattern (Conv2d, BatchNorm2d, ReLU, Dropout) has 4 ops; the simple format takes one "
        "op or a tuple of 2 or 3 ops in execution order; write longer or branching patterns "
        "with _set_pattern_complex_format"
    )


def test_one_element_simple_tuple_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"pattern \(Conv2d\) has 1 ops"):
        validate_simple((Conv,))


def test_nested_tuple_in_simple_format_points_to_complex_format() -> None:
    with pytest.raises(ConfigError, match=r"nests a tuple.*_set_pattern_complex_format"):
        validate_simple((ReLU, (BN, Conv)))


def test_op_of_wrong_kind_names_the_value_and_the_choices() -> None:
    with pytest.raises(ConfigTypeError) as info:
        validate_simple((Conv, 3))
    assert str(info.value) == (
        "pattern op 3 of type int is not a module class, a function, a method name or "
        "MatchAllNode; e.g. torch.nn.Linear, torch.add, 'relu'"
    )


def test_non_module_class_is_not_an_op() -> None:
    with pytest.raises(ConfigTypeError, match="pattern op <class 'int'>"):
        op_kind(int)


def test_complex_pattern_must_start_with_an_op() -> None:
    with pytest.raises(ConfigError, match="must start with an op"):
        validate_complex(((BN, Conv), ReLU))
    with pytest.raises(ConfigError, match=r"complex pattern \(\) must start"):
        validate_complex(())


def test_complex_format_normalizes_lists_and_single_op_tuples() -> None:
    assert validate_complex([ReLU, [BN, Conv]]) == (ReLU, (BN, Conv))
    assert validate_complex((ReLU,)) is ReLU


def test_op_kinds() -> None:
    assert [op_kind(op) for op in (Conv, torch.add, "relu", MatchAllNode)] == [
        "module",
        "function",
        "method",
        "match_all",
    ]


def test_pattern_str_renders_classes_functions_and_methods() -> None:
    assert pattern_str((Conv, BN, ReLU)) == "(Conv2d, BatchNorm2d, ReLU)"
    assert pattern_str((operator.add, MatchAllNode, (BN, Conv))) == (
        "(operator.add, MatchAllNode, (BatchNorm2d, Conv2d))"
    )
    assert pattern_str((torch.add, torch.nn.functional.linear, "relu")) == (
        "(torch.add, F.linear, 'relu')"
    )


def test_torch_ao_match_all_node_becomes_fxquants() -> None:
    ao = oracle.load()
    with oracle.quiet():
        ao_match_all = ao.utils.MatchAllNode
    assert validate_complex((operator.add, Conv, ao_match_all)) == (
        operator.add,
        Conv,
        MatchAllNode,
    )
