"""The oneDNN conv + add fusions: getters pick the conv, fusers build the fused module."""

from __future__ import annotations

import operator

import pytest
import torch
from fxquant.config.backend import BackendConfig, DTypeConfig
from fxquant.config.pattern import MatchAllNode
from fxquant.errors import ConfigError
from fxquant.nn import intrinsic
from fxquant.patterns import conv_add_configs, getters
from fxquant.patterns.conv_add import fuse_conv_add_left, fuse_conv_add_relu_right
from torch import nn

INT8 = DTypeConfig(torch.uint8, torch.uint8, torch.int8, torch.float)


def test_sixteen_fusion_patterns_and_two_fused_modules() -> None:
    configs = conv_add_configs([INT8])
    patterns = {c.normalized_pattern for c in configs}
    assert len(patterns) == len(configs) == 18
    assert (operator.add, (nn.BatchNorm2d, nn.Conv2d), MatchAllNode) in patterns
    assert (nn.ReLU, (torch.add, MatchAllNode, nn.Conv2d)) in patterns
    assert BackendConfig("onednn").set_backend_pattern_configs(configs).configs == configs


@pytest.mark.parametrize(
    ("pattern", "root", "extra"),
    [
        (
            (torch.add, "conv_node", "x_node"),
            getters.conv_add_root_left,
            getters.conv_add_extra_inputs_left,
        ),
        (
            (torch.add, "x_node", ("bn_node", "conv_node")),
            getters.conv_add_root_right,
            getters.conv_add_extra_inputs_right,
        ),
        (
            ("relu_node", (torch.add, ("bn_node", "conv_node"), "x_node")),
            getters.conv_add_relu_root_left,
            getters.conv_add_relu_extra_inputs_left,
        ),
        (
            ("relu_node", (torch.add, "x_node", "conv_node")),
            getters.conv_add_relu_root_right,
            getters.conv_add_relu_extra_inputs_right,
        ),
    ],
)
def test_getters_return_the_conv_as_root_and_the_other_tensor_as_extra_input(
    pattern: tuple[object, ...], root: object, extra: object
) -> None:
    assert root(pattern) == "conv_node"  # type: ignore[operator]
    assert extra(pattern) == ["x_node"]  # type: ignore[operator]


def test_conv_bn_add_folds_the_batchnorm_and_keeps_numerics() -> None:
    torch.manual_seed(0)
    conv, bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    conv.eval(), bn.eval()
    fused = fuse_conv_add_left(False, torch.add, (bn, conv), None)
    assert isinstance(fused, intrinsic.ConvAdd2d)
    x, y = torch.randn(2, 3, 5, 5), torch.randn(2, 4, 5, 5)
    torch.testing.assert_close(fused(x, y), bn(conv(x)) + y, atol=1e-5, rtol=1e-5)


def test_conv_add_relu_keeps_the_relu() -> None:
    conv = nn.Conv2d(2, 2, 1)
    fused = fuse_conv_add_relu_right(False, nn.ReLU(), (operator.add, None, conv))
    x, y = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)
    torch.testing.assert_close(fused(x, y), torch.relu(conv(x) + y))


def test_qat_refuses_to_fold_batchnorm_into_conv_add() -> None:
    conv, bn = nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2)
    with pytest.raises(ConfigError, match=r"cannot fuse .* and add for QAT"):
        fuse_conv_add_left(True, torch.add, (bn, conv), None)
