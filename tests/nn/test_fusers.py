from __future__ import annotations

import inspect

import pytest
import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.nn import fusers
from fxquant.nn import intrinsic as nni
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
CONV_T = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def _trained_bn(bn: nn.Module, seed: int) -> nn.Module:
    """Give ``bn`` non-trivial statistics and affine parameters, then put it in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    channels = bn.num_features
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(channels, generator=gen))
        bn.running_var.copy_(torch.rand(channels, generator=gen) * 2 + 0.1)
        bn.weight.copy_(torch.randn(channels, generator=gen))
        bn.bias.copy_(torch.randn(channels, generator=gen))
    return bn.eval()


@given(
    dim=st.sampled_from([1, 2, 3]),
    transposed=st.booleans(),
    groups=st.sampled_from([1, 2]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_folded_conv_equals_conv_then_bn_in_eval(
    dim: int, transposed: bool, groups: int, bias: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    cls = CONV_T[dim] if transposed else CONV[dim]
    conv = cls(4, 6, 3, groups=groups, bias=bias).eval()
    bn = _trained_bn(BN[dim](6), seed)
    x = torch.randn(2, 4, *([4] * dim))
    folded = fusers.fold_bn_into_conv(conv, bn, transpose=transposed)
    assert type(folded) is cls
    torch.testing.assert_close(folded(x), bn(conv(x)), rtol=1e-4, atol=1e-4)


def test_folding_leaves_the_original_conv_untouched() -> None:
    conv = nn.Conv2d(2, 3, 3)
    weight = conv.weight.detach().clone()
    fusers.fold_bn_into_conv(conv, _trained_bn(nn.BatchNorm2d(3), 0))
    assert torch.equal(conv.weight, weight)


def test_folded_linear_equals_linear_then_bn() -> None:
    linear, bn = nn.Linear(5, 4), _trained_bn(nn.BatchNorm1d(4), 1)
    x = torch.randn(8, 5)
    fused = fusers.fuse_linear_bn(False, linear, bn)
    assert type(fused) is nn.Linear
    torch.testing.assert_close(fused(x), bn(linear(x)))


def test_ptq_conv_bn_fusion_returns_a_plain_folded_conv() -> None:
    conv, bn = nn.Conv2d(2, 3, 3).eval(), _trained_bn(nn.BatchNorm2d(3), 2)
    fused = fusers.fuse_conv_bn(False, conv, bn)
    assert type(fused) is nn.Conv2d
    x = torch.randn(1, 2, 5, 5)
    torch.testing.assert_close(fused(x), bn(conv(x)))


def test_qat_conv_bn_fusion_keeps_both_modules() -> None:
    conv, bn = nn.Conv1d(2, 3, 3), nn.BatchNorm1d(3)
    fused = fusers.fuse_conv_bn(True, conv, bn)
    assert type(fused) is nni.ConvBn1d
    assert fused[0] is conv
    assert fused[1] is bn


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_ptq_conv_bn_relu_fusion_folds_then_wraps_with_relu(dim: int) -> None:
    conv, bn = CONV[dim](2, 3, 1).eval(), _trained_bn(BN[dim](3), dim)
    relu = nn.ReLU()
    fused = fusers.fuse_conv_bn_relu(False, conv, bn, relu)
    assert type(fused).__name__ == f"ConvReLU{dim}d"
    x = torch.randn(2, 2, *([3] * dim))
    torch.testing.assert_close(fused(x), relu(bn(conv(x))))


def test_qat_conv_bn_relu_fusion_keeps_three_modules() -> None:
    parts = (nn.Conv3d(2, 3, 1), nn.BatchNorm3d(3), nn.ReLU())
    fused = fusers.fuse_conv_bn_relu(True, *parts)
    assert type(fused) is nni.ConvBnReLU3d
    assert tuple(fused) == parts


def test_qat_linear_bn_fusion_keeps_both_modules() -> None:
    fused = fusers.fuse_linear_bn(True, nn.Linear(2, 3), nn.BatchNorm1d(3))
    assert type(fused) is nni.LinearBn1d


def test_ptq_fusion_of_training_bn_says_to_call_eval() -> None:
    conv, bn = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)
    with pytest.raises(ConfigError, match=r"training mode.*call model\.eval\(\)"):
        fusers.fuse_conv_bn(False, conv, bn)
    with pytest.raises(ConfigError, match=r"call model\.eval\(\)"):
        fusers.fuse_linear_bn(False, nn.Linear(2, 3), nn.BatchNorm1d(3))


def test_channel_mismatch_is_reported_with_both_counts() -> None:
    with pytest.raises(ConfigError, match=r"out_channels \(3\) must equal bn\.num_features \(4\)"):
        fusers.fuse_conv_bn(True, nn.Conv2d(2, 3, 3), nn.BatchNorm2d(4))
    with pytest.raises(ConfigError, match=r"out_features \(3\) must equal bn\.num_features \(5\)"):
        fusers.fuse_linear_bn(False, nn.Linear(2, 3), nn.BatchNorm1d(5).eval())


def test_bn_of_another_dimension_is_a_type_error() -> None:
    with pytest.raises(ConfigTypeError, match=r"'bn' must be a torch\.nn\.BatchNorm2d"):
        fusers.fuse_conv_bn(False, nn.Conv2d(2, 3, 3).eval(), nn.BatchNorm1d(3).eval())


def test_qat_fusion_needs_affine_bn_with_running_stats() -> None:
    with pytest.raises(ConfigError, match="affine=True and track_running_stats=True"):
        fusers.fuse_conv_bn(True, nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, affine=False))


def test_bn_without_running_stats_cannot_be_folded() -> None:
    bn = nn.BatchNorm2d(3, track_running_stats=False).eval()
    with pytest.raises(ConfigError, match="no running statistics"):
        fusers.fuse_conv_bn(False, nn.Conv2d(2, 3, 3).eval(), bn)


def test_bn_without_affine_folds_with_unit_scale() -> None:
    conv = nn.Conv2d(2, 3, 1).eval()
    bn = nn.BatchNorm2d(3, affine=False).eval()
    bn.running_mean.fill_(0.5)
    x = torch.randn(1, 2, 3, 3)
    torch.testing.assert_close(fusers.fuse_conv_bn(False, conv, bn)(x), bn(conv(x)))


def test_convtranspose_bn_is_folded_for_ptq_and_refused_for_qat() -> None:
    convt, bn = nn.ConvTranspose2d(2, 3, 3).eval(), _trained_bn(nn.BatchNorm2d(3), 3)
    x = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(fusers.fuse_convtranspose_bn(False, convt, bn)(x), bn(convt(x)))
    with pytest.raises(ConfigError, match="cannot be fused for QAT"):
        fusers.fuse_convtranspose_bn(True, convt, bn)
    with pytest.raises(ConfigTypeError, match=r"'convt' must be a torch\.nn\.ConvTranspose"):
        fusers.fuse_convtranspose_bn(False, nn.Conv2d(2, 3, 3), bn)  # type: ignore[arg-type]


@pytest.mark.parametrize("is_qat", [False, True])
def test_relu_fusers_wrap_modules_unchanged(is_qat: bool) -> None:
    conv, linear, bn, relu = nn.Conv2d(1, 1, 1), nn.Linear(1, 1), nn.BatchNorm3d(1), nn.ReLU()
    assert tuple(fusers.fuse_conv_relu(is_qat, conv, relu)) == (conv, relu)
    assert type(fusers.fuse_conv_relu(is_qat, conv, relu)) is nni.ConvReLU2d
    assert type(fusers.fuse_linear_relu(is_qat, linear, relu)) is nni.LinearReLU
    assert type(fusers.fuse_bn_relu(is_qat, bn, relu)) is nni.BNReLU3d


def test_unsupported_module_lists_the_choices() -> None:
    with pytest.raises(
        ConfigTypeError, match=r"expected one of torch\.nn\.BatchNorm2d, torch\.nn\.BatchNorm3d"
    ):
        fusers.fuse_bn_relu(False, nn.BatchNorm1d(2), nn.ReLU())  # type: ignore[arg-type]
    with pytest.raises(ConfigTypeError, match="cannot fuse"):
        fusers.fuse_conv_relu(False, nn.Linear(1, 1), nn.ReLU())  # type: ignore[arg-type]


def test_sequential_fuser_builds_the_given_container() -> None:
    fuser = fusers.sequential_fuser(nni.ConvReLU1d)
    conv, relu = nn.Conv1d(1, 1, 1), nn.ReLU()
    fused = fuser(True, conv, relu)
    assert type(fused) is nni.ConvReLU1d
    assert fuser.__name__ == "fuse_to_ConvReLU1d"


def test_bn_scale_and_shift_reproduce_eval_bn() -> None:
    bn = _trained_bn(nn.BatchNorm1d(4), 5)
    scale, shift = fusers.bn_scale_and_shift(bn)
    x = torch.randn(6, 4)
    torch.testing.assert_close(x * scale + shift, bn(x))


@pytest.mark.parametrize("relu", [torch.relu, torch.nn.functional.relu])
def test_functional_relu_is_replaced_by_a_relu_module(relu) -> None:
    fused = fusers.fuse_conv_relu(False, nn.Conv2d(1, 1, 1), relu)
    assert type(fused[1]) is nn.ReLU
    conv, bn = nn.Conv1d(1, 2, 1).eval(), _trained_bn(nn.BatchNorm1d(2), 6)
    fused = fusers.fuse_conv_bn_relu(False, conv, bn, relu)
    x = torch.randn(2, 1, 4)
    torch.testing.assert_close(fused(x), torch.relu(bn(conv(x))))


def test_a_relu_of_the_wrong_type_is_named() -> None:
    with pytest.raises(
        ConfigTypeError, match=r"fuse_linear_relu argument 'relu' must be a torch\.nn\.ReLU"
    ):
        fusers.fuse_linear_relu(False, nn.Linear(1, 1), nn.Sigmoid())  # type: ignore[arg-type]


@pytest.mark.parametrize("frozen", [True, False])
def test_folding_keeps_whether_the_layer_trains(frozen: bool) -> None:
    # a user who froze a backbone before fusing expects the folded copy frozen too
    conv, bn = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3).eval()
    linear, bn1 = nn.Linear(4, 3), nn.BatchNorm1d(3).eval()
    for layer in (conv, linear):
        layer.requires_grad_(not frozen)
    for folded in (fusers.fold_bn_into_conv(conv, bn), fusers.fold_bn_into_linear(linear, bn1)):
        assert [p.requires_grad for p in folded.parameters()] == [not frozen, not frozen]


def test_fusers_exports_only_its_functions() -> None:
    """``from fxquant.nn.fusers import *`` gives the fold / fuse functions, not their tables."""
    assert [n for n in fusers.__all__ if not inspect.isfunction(getattr(fusers, n))] == []
