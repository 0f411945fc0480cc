from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.nn import qat
from torch import nn

from tests import oracle
from tests.nn.helpers import TinyFakeQuantize, set_fake_quant, tiny_qconfig

FLOAT_CASES = [
    (qat.Linear, lambda: nn.Linear(4, 3), (2, 4)),
    (qat.Conv1d, lambda: nn.Conv1d(2, 3, 3, padding=1), (2, 2, 6)),
    (qat.Conv2d, lambda: nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"), (2, 2, 5, 5)),
    (qat.Conv3d, lambda: nn.Conv3d(2, 3, 1, bias=False), (2, 2, 2, 3, 3)),
]
IDS = [case[0].__name__ for case in FLOAT_CASES]


@pytest.mark.parametrize(("cls", "make", "shape"), FLOAT_CASES, ids=IDS)
def test_qat_module_runs_the_float_op_on_the_fake_quantized_weight(cls, make, shape) -> None:
    float_module = make()
    float_module.qconfig = tiny_qconfig(scale=0.05)
    module = cls.from_float(float_module)
    assert isinstance(module.weight_fake_quant, TinyFakeQuantize)
    x = torch.randn(shape)
    expected_weight = torch.fake_quantize_per_tensor_affine(float_module.weight, 0.05, 0, -128, 127)
    twin = make()
    twin.load_state_dict(float_module.state_dict())
    twin.weight.data = expected_weight.detach()
    torch.testing.assert_close(module(x), twin(x), rtol=0, atol=0)
    set_fake_quant(module, False)
    assert torch.equal(module(x), float_module(x))


@pytest.mark.parametrize(("cls", "make", "shape"), FLOAT_CASES, ids=IDS)
def test_to_float_returns_the_plain_module_with_the_trained_weight(cls, make, shape) -> None:
    float_module = make()
    float_module.qconfig = tiny_qconfig()
    module = cls.from_float(float_module).eval()
    back = module.to_float()
    assert type(back) is type(float_module)
    assert not back.training
    x = torch.randn(shape)
    assert torch.equal(back(x), float_module(x))


def test_from_float_shares_the_float_parameters() -> None:
    linear = nn.Linear(3, 3)
    linear.qconfig = tiny_qconfig()
    module = qat.Linear.from_float(linear)
    assert module.weight is linear.weight
    assert module.bias is linear.bias


def test_gradient_reaches_the_weight_through_fake_quant() -> None:
    conv = nn.Conv2d(2, 3, 3)
    conv.qconfig = tiny_qconfig(scale=0.01)
    module = qat.Conv2d.from_float(conv)
    module(torch.randn(2, 2, 5, 5)).sum().backward()
    assert module.weight.grad is not None
    assert module.weight.grad.abs().sum() > 0
    assert module.bias.grad is not None


def test_from_float_without_qconfig_says_how_to_set_it() -> None:
    with pytest.raises(ConfigError, match=r"qat\.Linear\.from_float needs mod\.qconfig to be set"):
        qat.Linear.from_float(nn.Linear(2, 2))


def test_from_float_of_the_wrong_module_type_is_a_type_error() -> None:
    conv = nn.Conv1d(1, 1, 1)
    conv.qconfig = tiny_qconfig()
    with pytest.raises(
        ConfigTypeError, match=r"qat\.Conv2d\.from_float expects a torch\.nn\.Conv2d"
    ):
        qat.Conv2d.from_float(conv)


def test_constructor_requires_a_qconfig() -> None:
    with pytest.raises(ConfigError, match=r"qat\.Conv3d needs a qconfig"):
        qat.Conv3d(1, 1, 1)
    with pytest.raises(ConfigError, match=r"qat\.Linear needs a qconfig"):
        qat.Linear(1, 1)


def test_qconfig_weight_must_build_a_module() -> None:
    class NotAModule:
        pass

    bad = tiny_qconfig()
    object.__setattr__(bad, "weight", NotAModule)
    with pytest.raises(ConfigTypeError, match=r"qconfig\.weight\(\) must build an nn\.Module"):
        qat.Linear(2, 2, qconfig=bad)


FLOAT_QPARAMS = torch.per_channel_affine_float_qparams


def test_embedding_requires_float_qparams_weight_fake_quant() -> None:
    emb = nn.Embedding(5, 2)
    emb.qconfig = tiny_qconfig()
    with pytest.raises(ConfigError, match="per_channel_affine_float_qparams"):
        qat.Embedding.from_float(emb)


def test_embedding_and_bag_look_up_the_fake_quantized_table() -> None:
    emb = nn.Embedding(6, 3, padding_idx=0)
    emb.qconfig = tiny_qconfig(qscheme=FLOAT_QPARAMS)
    module = qat.Embedding.from_float(emb)
    indices = torch.tensor([0, 2, 5])
    table = torch.fake_quantize_per_tensor_affine(emb.weight, 0.05, 0, -128, 127)
    assert torch.equal(module(indices), F.embedding(indices, table, padding_idx=0))
    assert type(module.to_float()) is nn.Embedding
    assert module.to_float().padding_idx == 0

    bag = nn.EmbeddingBag(6, 3, mode="max")
    bag.qconfig = tiny_qconfig(qscheme=FLOAT_QPARAMS)
    module_bag = qat.EmbeddingBag.from_float(bag)
    offsets = torch.tensor([0, 1])
    table = torch.fake_quantize_per_tensor_affine(bag.weight, 0.05, 0, -128, 127)
    expected = F.embedding_bag(indices, table, offsets, mode="max")
    assert torch.equal(module_bag(indices, offsets), expected)
    assert module_bag.to_float().mode == "max"


def test_default_qat_qconfig_matches_torch_ao_qat_linear(ao) -> None:
    defaults = pytest.importorskip("fxquant.config.defaults")
    torch.manual_seed(0)
    linear = nn.Linear(6, 4)
    linear.qconfig = defaults.default_qat_qconfig
    module = qat.Linear.from_float(linear)
    with oracle.quiet():
        twin = nn.Linear(6, 4)
        twin.load_state_dict(linear.state_dict())
        twin.qconfig = ao.default_qat_qconfig
        theirs = importlib.import_module("torch.ao.nn.qat").Linear.from_float(twin)
    for _ in range(3):
        x = torch.randn(5, 6)
        with oracle.quiet():
            expected = theirs(x)
        assert torch.equal(module(x), expected)


def test_default_embedding_qat_qconfig_matches_torch_ao_qat_embedding(ao) -> None:
    defaults = pytest.importorskip("fxquant.config.defaults")
    torch.manual_seed(1)
    emb = nn.Embedding(10, 4)
    emb.qconfig = defaults.default_embedding_qat_qconfig
    module = qat.Embedding.from_float(emb)
    with oracle.quiet():
        twin = nn.Embedding(10, 4)
        twin.load_state_dict(emb.state_dict())
        twin.qconfig = ao.default_embedding_qat_qconfig
        theirs = importlib.import_module("torch.ao.nn.qat").Embedding.from_float(twin)
    indices = torch.randint(0, 10, (6,))
    with oracle.quiet():
        expected = theirs(indices)
    assert torch.equal(module(indices), expected)
