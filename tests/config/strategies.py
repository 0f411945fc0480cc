"""Hypothesis strategies for configs, shared by the config tests."""

from __future__ import annotations

import operator
from typing import Any

import torch
from fxquant.config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
)
from fxquant.config.pattern import MatchAllNode, simple_to_complex
from hypothesis import strategies as st

from tests.config import fake_plugin

OPS: list[Any] = [
    torch.nn.Conv2d,
    torch.nn.ReLU,
    torch.nn.BatchNorm2d,
    torch.nn.Linear,
    torch.add,
    torch.cat,
    operator.add,
    operator.mul,
    torch.nn.functional.relu,
    torch.nn.functional.linear,
    torch.nn.functional.max_pool2d,
    "relu",
    "reshape",
]
ops = st.sampled_from(OPS)
simple_patterns = ops | st.tuples(ops, ops) | st.tuples(ops, ops, ops)


def _complex(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.builds(
        lambda head, args: (head, *args), ops, st.lists(children, min_size=1, max_size=3)
    )


complex_patterns = st.recursive(ops | st.just(MatchAllNode), _complex, max_leaves=6)
chains = st.lists(ops, min_size=1, max_size=3).map(
    lambda xs: simple_to_complex(xs[0] if len(xs) == 1 else tuple(xs))
)

QUANTIZED = [torch.uint8, torch.int8, torch.int32] + [
    d for d in (getattr(torch, n, None) for n in ("quint8", "qint8", "qint32")) if d is not None
]
dtypes = st.sampled_from([*QUANTIZED, torch.float16, torch.float32])
small = st.integers(-300, 300)


@st.composite
def constrained(draw: st.DrawFn) -> DTypeWithConstraints:
    low, high = sorted([draw(small), draw(small)])
    scale_low = draw(st.none() | st.floats(2**-20, 1.0))
    return DTypeWithConstraints(
        dtype=draw(dtypes),
        quant_min_lower_bound=draw(st.none() | st.just(low)),
        quant_max_upper_bound=draw(st.none() | st.just(high)),
        scale_min_lower_bound=scale_low,
        scale_max_upper_bound=draw(st.none() | st.floats(2.0, 10.0)),
        scale_exact_match=draw(st.none() | st.floats(2**-10, 1.0)),
        zero_point_exact_match=draw(st.none() | small),
    )


dtype_or_constrained = st.none() | dtypes | constrained()
dtype_configs = st.builds(
    DTypeConfig,
    input_dtype=dtype_or_constrained,
    output_dtype=dtype_or_constrained,
    weight_dtype=dtype_or_constrained,
    bias_dtype=st.none() | st.sampled_from([torch.float32, torch.float16]),
    is_dynamic=st.none() | st.booleans(),
)
observation_types = st.sampled_from(list(ObservationType))
module_classes = st.sampled_from(
    [torch.nn.Linear, torch.nn.Conv2d, fake_plugin.FusedConvReLU, fake_plugin.TinyObserver]
)
functions = st.sampled_from(
    [fake_plugin.fuse_conv_relu, fake_plugin.root_node_getter, fake_plugin.extra_inputs_getter]
)


@st.composite
def pattern_configs(draw: st.DrawFn) -> BackendPatternConfig:
    config = BackendPatternConfig()
    if draw(st.booleans()):
        config.set_pattern(draw(simple_patterns))
    else:
        config._set_pattern_complex_format(draw(complex_patterns))
    config.set_observation_type(draw(observation_types))
    config.set_dtype_configs(draw(st.lists(dtype_configs, max_size=3)))
    optional_modules = st.none() | module_classes
    config.set_root_module(draw(optional_modules)).set_qat_module(draw(optional_modules))
    config.set_reference_quantized_module(draw(optional_modules))
    config.set_fused_module(draw(optional_modules))
    config.set_fuser_method(draw(st.none() | functions))
    config._set_root_node_getter(draw(st.none() | functions))
    config._set_extra_inputs_getter(draw(st.none() | functions))
    config._set_num_tensor_args_to_observation_type(
        draw(st.dictionaries(st.integers(0, 3), observation_types, max_size=3))
    )
    config._set_input_type_to_index(
        draw(st.dictionaries(st.sampled_from(["weight", "bias", "input"]), st.integers(0, 4)))
    )
    return config


backend_configs = st.builds(
    lambda name, configs: BackendConfig(name).set_backend_pattern_configs(configs),
    st.text(max_size=8),
    st.lists(pattern_configs(), max_size=5),
)
