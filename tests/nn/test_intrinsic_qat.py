from __future__ import annotations

import copy
import importlib
import pickle

import pytest
import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.nn import intrinsic as nni
from fxquant.nn.intrinsic import qat as nniqat
from torch import nn

from tests import oracle
from tests.nn.helpers import set_fake_quant, tiny_qconfig

CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def _conv_bn(dim: int, relu: bool = False, bias: bool = True) -> nn.Module:
    conv, bn = CONV[dim](3, 4, 3, padding=1, bias=bias), BN[dim](4)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    fused = (
        getattr(nni, f"ConvBnReLU{dim}d")(conv, bn, nn.ReLU())
        if relu
        else getattr(nni, f"ConvBn{dim}d")(conv, bn)
    )
    fused.qconfig = tiny_qconfig(scale=0.02)
    return fused


def _input(dim: int) -> torch.Tensor:
    return torch.randn(4, 3, *([5] * dim)) * 2 + 0.5


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_train_forward_matches_float_conv_bn_and_updates_stats_alike(dim: int, bias: bool) -> None:
    torch.manual_seed(dim)
    fused = _conv_bn(dim, bias=bias)
    reference = copy.deepcopy(fused).train()
    module = getattr(nniqat, f"ConvBn{dim}d").from_float(fused).train()
    set_fake_quant(module, False)
    for _ in range(3):
        x = _input(dim)
        torch.testing.assert_close(module(x), reference(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(module.bn.running_mean, reference[1].running_mean)
    torch.testing.assert_close(module.bn.running_var, reference[1].running_var)
    assert module.bn.num_batches_tracked == 3


def test_fake_quant_is_applied_to_the_bn_scaled_weight() -> None:
    torch.manual_seed(0)
    module = nniqat.ConvBn2d.from_float(_conv_bn(2)).eval()
    x = _input(2)
    bn = module.bn
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    folded = module.weight * scale.reshape(-1, 1, 1, 1)
    weight = torch.fake_quantize_per_tensor_affine(folded, 0.02, 0, -128, 127)
    out = nn.functional.conv2d(x, weight, None, padding=1) / scale.reshape(1, -1, 1, 1)
    expected = bn(out + module.bias.reshape(1, -1, 1, 1))
    torch.testing.assert_close(module(x), expected)


def test_gradients_reach_conv_weight_and_bn_parameters() -> None:
    module = nniqat.ConvBnReLU2d.from_float(_conv_bn(2, relu=True)).train()
    module(_input(2)).square().sum().backward()
    for param in (module.weight, module.bias, module.bn.weight, module.bn.bias):
        assert param.grad is not None
        assert torch.isfinite(param.grad).all()
        assert param.grad.abs().sum() > 0


@pytest.mark.parametrize("relu", [False, True])
def test_to_float_after_training_gives_the_qat_eval_output(relu: bool) -> None:
    torch.manual_seed(1)
    module = getattr(nniqat, "ConvBnReLU2d" if relu else "ConvBn2d").from_float(_conv_bn(2, relu))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        module(_input(2)).square().mean().backward()
        optimizer.step()
    module.eval()
    set_fake_quant(module, False)
    back = module.to_float()
    assert type(back) is (nni.ConvReLU2d if relu else nn.Conv2d)
    assert not back.training
    x = _input(2)
    torch.testing.assert_close(back(x), module(x), rtol=1e-5, atol=1e-5)


def test_frozen_bn_keeps_running_stats_and_survives_model_train() -> None:
    module = nniqat.ConvBn1d.from_float(_conv_bn(1)).train()
    module.freeze_bn_stats()
    mean = module.bn.running_mean.clone()
    module.train()
    module(_input(1))
    assert torch.equal(module.bn.running_mean, mean)
    assert not module.bn.training
    assert module.weight_fake_quant.training
    nniqat.update_bn_stats(module)
    module(_input(1))
    assert not torch.equal(module.bn.running_mean, mean)


def test_freeze_helpers_work_with_model_apply() -> None:
    model = nn.Sequential(nniqat.ConvBn3d.from_float(_conv_bn(3)), nn.ReLU())
    model.apply(nniqat.freeze_bn_stats)
    assert model[0].freeze_bn
    model.apply(nniqat.update_bn_stats)
    assert not model[0].freeze_bn


def test_constructing_with_freeze_bn_starts_frozen() -> None:
    module = nniqat.ConvBn2d(3, 4, 3, freeze_bn=True, qconfig=tiny_qconfig())
    assert not module.bn.training
    assert module.training


def test_from_float_shares_conv_and_bn_state() -> None:
    fused = _conv_bn(2)
    module = nniqat.ConvBn2d.from_float(fused)
    assert module.weight is fused[0].weight
    assert module.bn is fused[1]


def test_from_float_needs_the_fused_float_module_and_its_qconfig() -> None:
    conv = nn.Conv2d(3, 4, 3)
    conv.qconfig = tiny_qconfig()
    with pytest.raises(ConfigTypeError, match=r"expects a fxquant\.nn\.intrinsic\.ConvBn2d"):
        nniqat.ConvBn2d.from_float(conv)
    fused = nni.ConvBn2d(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    with pytest.raises(ConfigError, match=r"qat\.ConvBn2d\.from_float needs mod\.qconfig"):
        nniqat.ConvBn2d.from_float(fused)


def test_bn_without_running_stats_is_refused() -> None:
    fused = nni.ConvBn2d(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False))
    fused.qconfig = tiny_qconfig()
    with pytest.raises(ConfigError, match="track_running_stats=True"):
        nniqat.ConvBn2d.from_float(fused)


def test_linear_bn_trains_like_linear_then_bn_and_folds_on_to_float() -> None:
    torch.manual_seed(2)
    fused = nni.LinearBn1d(nn.Linear(5, 4), nn.BatchNorm1d(4))
    fused.qconfig = tiny_qconfig()
    reference = copy.deepcopy(fused).train()
    module = nniqat.LinearBn1d.from_float(fused).train()
    set_fake_quant(module, False)
    for _ in range(3):
        x = torch.randn(8, 5)
        torch.testing.assert_close(module(x), reference(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(module.bn.running_var, reference[1].running_var)
    module.eval()
    back = module.to_float()
    assert type(back) is nn.Linear
    x = torch.randn(3, 5)
    torch.testing.assert_close(back(x), module(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_conv_relu_applies_relu_after_the_fake_quantized_conv(dim: int) -> None:
    conv = CONV[dim](2, 3, 1)
    fused = getattr(nni, f"ConvReLU{dim}d")(conv, nn.ReLU())
    fused.qconfig = tiny_qconfig()
    module = getattr(nniqat, f"ConvReLU{dim}d").from_float(fused)
    x = torch.randn(2, 2, *([3] * dim))
    set_fake_quant(module, False)
    assert torch.equal(module(x), torch.relu(conv(x)))
    back = module.to_float()
    assert type(back) is type(fused)
    assert torch.equal(back(x), fused(x))


def test_linear_relu_round_trips_through_qat() -> None:
    fused = nni.LinearReLU(nn.Linear(3, 3), nn.ReLU())
    fused.qconfig = tiny_qconfig()
    module = nniqat.LinearReLU.from_float(fused)
    x = torch.randn(4, 3)
    assert (module(x) >= 0).all()
    back = module.to_float()
    assert type(back) is nni.LinearReLU
    set_fake_quant(module, False)
    assert torch.equal(back(x), module(x))


def test_conv_bn_with_default_qat_qconfig_matches_torch_ao(ao) -> None:
    defaults = pytest.importorskip("fxquant.config.defaults")
    torch.manual_seed(3)
    fused = _conv_bn(2)
    fused.qconfig = defaults.default_qat_qconfig
    with oracle.quiet():
        ao_nni = importlib.import_module("torch.ao.nn.intrinsic")
        ao_nniqat = importlib.import_module("torch.ao.nn.intrinsic.qat")
        twin = ao_nni.ConvBn2d(copy.deepcopy(fused[0]), copy.deepcopy(fused[1]))
        twin.qconfig = ao.default_qat_qconfig
        theirs = ao_nniqat.ConvBn2d.from_float(twin).train()
    module = nniqat.ConvBn2d.from_float(fused).train()
    for _ in range(3):
        x = _input(2)
        with oracle.quiet():
            expected = theirs(x)
        torch.testing.assert_close(module(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(module.bn.running_mean, theirs.bn.running_mean)


def test_qat_conv_bn_survives_deepcopy_pickle_and_state_dict() -> None:
    module = nniqat.ConvBnReLU2d.from_float(_conv_bn(2, relu=True))
    module(_input(2))
    module.eval()
    x = _input(2)
    for clone in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
        assert torch.equal(clone(x), module(x))
    fresh = nniqat.ConvBnReLU2d(3, 4, 3, padding=1, qconfig=tiny_qconfig(scale=0.02)).eval()
    fresh.load_state_dict(module.state_dict())
    assert torch.equal(fresh(x), module(x))
