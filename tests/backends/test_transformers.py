"""A real architecture, end to end on x86: transformers' BertModel, both ways users capture it.

Issue 11: ``prepare_fx(BertModel)`` raised ``UntraceableModelError`` (optional arguments
became proxies), and ``prepare_fx`` of the GraphModule transformers' own tracer made
traced it again and failed on a slice by a traced length. The model is built from a small
config with random weights: nothing is downloaded.
"""

from __future__ import annotations

import inspect
from typing import Any

import fxquant
import pytest
import torch
from torch import nn

from tests.backends.conftest import installed_first_party

transformers = pytest.importorskip("transformers")
transformers_fx = pytest.importorskip("transformers.utils.fx")
pytest.importorskip("fxquant_transformers", reason="pip install -e plugins/transformers")

pytestmark = pytest.mark.skipif(
    "x86" not in installed_first_party(), reason="backend 'x86' is not installed"
)

LINEARS = 2 * 6 + 1  # per layer: query, key, value, attention output, intermediate, output; pooler


def bert() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        initializer_range=0.2,  # weights large enough that int8 rounding shows in the output
    )
    return transformers.BertModel(config).eval()


def token_ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(seed))


def quantize(model: nn.Module, **kwargs: Any) -> nn.Module:
    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepared = fxquant.prepare_fx(model, mapping, (token_ids(0),), backend_config=config, **kwargs)
    for seed in range(1, 5):
        prepared(token_ids(seed))  # calibrate
    return fxquant.convert_fx(prepared, backend_config=config)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def check_quantized(model: nn.Module, quantized: nn.Module) -> None:
    report = fxquant.explain(quantized, show=False)
    lowered = [e.node for e in report.entries() if e.status == "lowered"]
    assert len(lowered) == LINEARS, lowered
    x = token_ids(99)
    with torch.no_grad():
        expected = model(x).last_hidden_state
        got = quantized(x)["last_hidden_state"]
    assert not torch.equal(got, expected)
    assert cosine(got, expected) >= 0.99


def test_bert_model_is_quantized_with_concrete_args_for_its_optional_inputs() -> None:
    model = bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optional = [name for name in inspect.signature(model.forward).parameters][1:]
    quantized = quantize(model, concrete_args=dict.fromkeys(optional))
    check_quantized(model, quantized)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_graph_module_of_transformers_tracer_is_quantized_as_it_is() -> None:
    model = bert()
    traced = transformers_fx.symbolic_trace(model, input_names=["input_ids"])
    code = traced.code
    quantized = quantize(traced)
    check_quantized(model, quantized)
    assert traced.code == code
    assert all(
        type(m).__module__.startswith("torch.nn") for m in traced.modules() if m is not traced
    )
