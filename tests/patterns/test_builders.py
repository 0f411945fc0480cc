"""The builders' shapes: which patterns, fusions and modules each family produces."""

from __future__ import annotations

import operator
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from fxquant.config.backend import DTypeConfig, ObservationType
from fxquant.errors import ConfigError
from fxquant.nn import fusers, intrinsic, reference
from fxquant.nn.intrinsic import qat as intrinsic_qat
from fxquant.patterns import (
    binary_op_configs,
    conv_configs,
    linear_configs,
    reference_pattern_configs,
    share_qparams_op_configs,
    tensor_info_op_configs,
)
from fxquant.patterns.conv import conv_family
from torch import nn

INT8 = DTypeConfig(torch.uint8, torch.uint8, torch.int8, torch.float)
SHARE = ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT
DIFFERENT = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT


def test_conv_configs_build_19_patterns_per_dimension() -> None:
    assert len(conv_configs([INT8], dims=(2,))) == 19
    assert len(conv_configs([INT8])) == 57
    assert len(conv_configs([INT8], dims=(1, 3), transpose=False)) == 32


def test_conv_family_rejects_4d_and_says_which_are_valid() -> None:
    with pytest.raises(ConfigError, match=r"^conv dims must be 1, 2 or 3, got 4$"):
        conv_configs([INT8], dims=(4,))


def test_conv_bn_relu_fuses_with_the_fxquant_fuser_into_the_fxquant_module() -> None:
    configs = {c.pattern: c for c in conv_configs([INT8], dims=(2,))}
    fused = configs[(nn.Conv2d, nn.BatchNorm2d, F.relu)]
    assert fused.fuser_method is fusers.fuse_conv_bn_relu
    assert fused.fused_module is intrinsic.ConvBnReLU2d
    qat_module = configs[intrinsic.ConvBnReLU2d].qat_module
    assert qat_module is intrinsic_qat.ConvBnReLU2d
    assert configs[qat_module].reference_quantized_module is reference.Conv2d
    assert configs[qat_module].root_module is nn.Conv2d


def test_every_module_in_every_reference_config_is_fxquants_or_torch_nn() -> None:
    for config in reference_pattern_configs():
        for field in ("root_module", "qat_module", "reference_quantized_module", "fused_module"):
            cls = getattr(config, field)
            if cls is not None:
                assert cls.__module__.startswith(("fxquant.", "torch.nn.")), (field, cls)
        if config.fuser_method is not None:
            assert config.fuser_method.__module__.startswith("fxquant."), config.fuser_method


def test_functional_weighted_ops_say_where_weight_and_bias_are() -> None:
    configs = {c.pattern: c for c in conv_configs([INT8]) + linear_configs([INT8])}
    for op in (F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose2d):
        assert configs[op]._input_type_to_index == {"weight": 1, "bias": 2}


def test_binary_ops_share_the_observer_only_with_one_tensor_argument() -> None:
    configs = binary_op_configs([INT8], ops=[operator.add, torch.sub])
    assert [c.pattern for c in configs[:5]] == [
        operator.add,
        (operator.add, nn.ReLU),
        (operator.add, F.relu),
        (operator.add, torch.relu),
        torch.sub,
    ]
    for config in configs:
        assert config._num_tensor_args_to_observation_type == {0: DIFFERENT, 1: SHARE, 2: DIFFERENT}


def test_binary_ops_take_a_backend_specific_observation_table() -> None:
    [config, *_] = binary_op_configs([INT8], {2: SHARE}, ops=[torch.mul])
    assert config._num_tensor_args_to_observation_type == {2: SHARE}


def test_share_qparams_ops_share_and_tensor_info_ops_are_not_observed() -> None:
    shared = {c.pattern: c.observation_type for c in share_qparams_op_configs([INT8])}
    for op in (nn.MaxPool2d, F.avg_pool2d, torch.flatten, "view", "reshape", nn.ReLU, torch.clamp):
        assert shared[op] is SHARE, op
    info = tensor_info_op_configs([INT8])
    assert [(c.pattern, c.observation_type) for c in info] == [
        ("shape", ObservationType.INPUT_OUTPUT_NOT_OBSERVED),
        ("size", ObservationType.INPUT_OUTPUT_NOT_OBSERVED),
    ]


def test_conv_family_lists_the_classes_by_dimension() -> None:
    family = conv_family(3)
    assert (family.conv, family.bn, family.func) == (nn.Conv3d, nn.BatchNorm3d, F.conv3d)
    assert family.transpose_reference is reference.ConvTranspose3d


def test_each_call_builds_fresh_configs_a_plugin_may_change() -> None:
    first, second = reference_pattern_configs(), reference_pattern_configs()
    assert first == second
    first[0].set_dtype_configs([])
    first[0].set_observation_type(SHARE)
    assert second[0].dtype_configs
    assert second[0].observation_type is DIFFERENT


_WITHOUT_QUANTIZED_DTYPES = """
import torch
for name in ("quint8", "qint8", "qint32", "quint4x2", "quint2x4"):
    delattr(torch, name)
from fxquant.patterns import reference_default_qconfig_mapping, reference_pattern_configs
configs = reference_pattern_configs()
reference_default_qconfig_mapping(is_qat=True)
embedding = next(c for c in configs if c.pattern is torch.nn.Embedding)
print(len(configs), [str(d.weight_dtype) for d in embedding.dtype_configs])
"""


def test_reference_patterns_build_on_a_torch_without_quantized_dtypes() -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", _WITHOUT_QUANTIZED_DTYPES],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # the 4-bit weight-only config is dropped; everything else is there
    assert result.stdout.split() == ["209", "['torch.uint8',", "'torch.int8']"]
