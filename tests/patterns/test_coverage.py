"""The reference backend covers every pattern of torch.ao's native backend config."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from fxquant.config.pattern import pattern_str
from fxquant.nn import reference as fx_reference
from fxquant.patterns import reference_pattern_configs
from fxquant.tools.testing import ao_normalized_pattern
from fxquant.tools.testing import ao_op_as_fxquant as to_fxquant

from tests import oracle
from tests.patterns.helpers import by_pattern, dtype_config_covers


@pytest.fixture(scope="module")
def native_configs() -> list[Any]:
    ao = oracle.load()
    with oracle.quiet():
        backend_config = ao.backend_config.get_native_backend_config()
    return list(backend_config.configs)


@pytest.fixture(scope="module")
def reference() -> dict[Any, Any]:
    return by_pattern(reference_pattern_configs())


def _missing(native_configs: list[Any], reference: dict[Any, Any]) -> list[str]:
    return [
        pattern_str(ao_normalized_pattern(c))
        for c in native_configs
        if ao_normalized_pattern(c) not in reference
    ]


def test_every_native_pattern_is_in_the_reference_backend(
    native_configs: list[Any], reference: dict[Any, Any]
) -> None:
    missing = _missing(native_configs, reference)
    assert not missing, (
        f"{len(missing)} of {len(native_configs)} native patterns missing: {missing}"
    )
    assert len(native_configs) == 194, f"torch.ao native has {len(native_configs)} patterns"
    assert len(reference) >= len(native_configs)


def _lacks_counterpart(cls: type | None) -> bool:
    # fxquant.nn.reference names the recurrent modules of fxquant.nn.recurrent (#20):
    # a recurrent class missing there would be a torch.ao reference without counterpart
    recurrent = {"GRUCell", "LSTMCell", "RNNCell", "LSTM", "GRU"}
    return cls is not None and cls.__name__ in recurrent and not hasattr(fx_reference, cls.__name__)


def _differences(ours: Any, theirs: Any) -> list[str]:
    found = []
    if ours.observation_type.name != theirs.observation_type.name:
        found.append(f"observation_type {ours.observation_type} != {theirs.observation_type}")
    ours_by_args = {k: v.name for k, v in ours._num_tensor_args_to_observation_type.items()}
    theirs_by_args = {k: v.name for k, v in theirs._num_tensor_args_to_observation_type.items()}
    if ours_by_args != theirs_by_args:
        found.append(f"num_tensor_args_to_observation_type {ours_by_args} != {theirs_by_args}")
    if ours._input_type_to_index != theirs._input_type_to_index:
        found.append(f"input_type_to_index {ours._input_type_to_index}")
    for field in ("root_module", "qat_module", "reference_quantized_module", "fused_module"):
        if _lacks_counterpart(getattr(theirs, field)):
            continue
        expected = to_fxquant(getattr(theirs, field))
        # torch.ao's duplicate ConvReLU configs drop some fields; ours keep them all
        if expected is not None and getattr(ours, field) is not expected:
            found.append(f"{field} {getattr(ours, field)} != {expected}")
    if (ours.fuser_method is None) != (theirs.fuser_method is None):
        found.append(f"fuser_method {ours.fuser_method} vs {theirs.fuser_method}")
    for dtype_config in theirs.dtype_configs:
        if not any(dtype_config_covers(mine, dtype_config) for mine in ours.dtype_configs):
            found.append(f"no dtype config covers {dtype_config}")
    return found


def test_native_patterns_keep_observation_types_modules_and_dtypes(
    native_configs: list[Any], reference: dict[Any, Any]
) -> None:
    problems = {}
    for theirs in native_configs:
        key = ao_normalized_pattern(theirs)
        found = _differences(reference[key], theirs)
        if found:
            problems[pattern_str(key)] = found
    assert not problems, (
        f"{len(problems)} of {len(native_configs)} native patterns differ: {problems}"
    )


def test_fixed_qparams_constraints_equal_torch_ao(
    ao: ModuleType, native_configs: list[Any], reference: dict[Any, Any]
) -> None:
    exact = [
        c
        for c in native_configs
        if c.dtype_configs[0].output_dtype_with_constraints.scale_exact_match
    ]
    assert len(exact) == 13
    for theirs in exact:
        ours = reference[ao_normalized_pattern(theirs)]
        want = theirs.dtype_configs[0].output_dtype_with_constraints
        got = [
            d.output_dtype_with_constraints
            for d in ours.dtype_configs
            if d.output_dtype_with_constraints.scale_exact_match
        ]
        assert [(g.scale_exact_match, g.zero_point_exact_match) for g in got] == [
            (want.scale_exact_match, want.zero_point_exact_match)
        ], pattern_str(ao_normalized_pattern(theirs))
