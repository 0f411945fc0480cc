"""QAT on models with embeddings (issue 30): the default QAT mappings train and convert the
BERT family on every backend; a user's own global QAT qconfig leaves a table it does not
fit in float, as post-training quantization does."""

from __future__ import annotations

import copy

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.config.defaults import default_qat_qconfig
from fxquant.errors import ConfigError
from fxquant.nn import qat, reference
from fxquant.numerics import compare
from fxquant.patterns.qconfigs import embedding_qat_qconfig
from torch import nn

from tests.zoo.runner import ZOO, main_output, quiet

_LOOKUP_KERNELS = ("x86", "fbgemm", "qnnpack", "onednn")
_BACKENDS = ("x86", "fbgemm", "qnnpack", "onednn", "executorch", "reference")


def _installed(backend: str) -> str:
    if backend not in fxquant.list_backends():
        pytest.skip(f"backend {backend!r} is not installed")
    return backend


def _trained(model_name: str, backend: str, mapping: fxquant.QConfigMapping) -> tuple:
    """(float model, prepared after two SGD steps, its lowered and reference conversions)."""
    zoo = ZOO[model_name]
    model = zoo.build()
    config = fxquant.get_backend_config(backend)
    with quiet():
        prepared = fxquant.prepare_qat_fx(
            copy.deepcopy(model).train(), mapping, zoo.inputs(0), backend_config=config
        )
        optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-4)
        for seed in (1, 2):
            optimizer.zero_grad()
            main_output(prepared(*zoo.inputs(seed))).pow(2).mean().backward()
            optimizer.step()
        prepared.eval()
        lowered = fxquant.convert_fx(copy.deepcopy(prepared), backend_config=config)
        ref = fxquant.convert_to_reference_fx(prepared, backend_config=config)
    return model, prepared, lowered, ref


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.flatten(), b.flatten(), dim=0))


@pytest.mark.parametrize("backend", _BACKENDS)
def test_the_default_qat_mapping_trains_and_converts_a_bert_family_model(backend: str) -> None:
    model_name = "bert"
    backend = _installed(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend, is_qat=True)
    model, _, lowered, ref = _trained(model_name, backend, mapping)
    tables = [m for m in ref.modules() if isinstance(m, reference.Embedding)]
    # the default QAT mapping quantizes the tables weight-only, row by row
    assert tables, "no embedding table was quantized"
    assert all(t.weight_axis_int == 0 for t in tables)
    inputs = [ZOO[model_name].inputs(seed) for seed in (99, 100)]
    with torch.no_grad():
        for batch in inputs:
            expected = main_output(model(*batch))
            assert _cosine(expected, main_output(ref(*batch))) > 0.98
            assert _cosine(expected, main_output(lowered(*batch))) > 0.98
    with quiet():
        entries = fxquant.explain(lowered, show=False).entries()
        report = {e.node: e.reason for e in entries}
        rows = compare(ref, lowered, inputs)
    if backend in _LOOKUP_KERNELS:  # the rows are looked up in the integer table
        lookups = [e for e in entries if e.pattern == "Embedding"]
        assert lookups, "no embedding in the report"
        assert {e.status for e in lookups} == {"lowered"}
    for row in rows:
        if row.node != "output" and row.local_steps is not None and row.local_steps > 1.0:
            assert report.get(row.node) is not None, f"{row.node} is {row.local_steps} steps off"


def test_a_global_qat_qconfig_leaves_the_embeddings_float_with_the_reason() -> None:
    # torch.ao swaps every embedding and asserts on the table's qscheme; post-training
    # quantization (theirs and ours) leaves a table this qconfig does not fit in float
    mapping = fxquant.QConfigMapping().set_global(default_qat_qconfig)
    model, prepared, lowered, _ = _trained("bert", "x86", mapping)
    embeddings = [n for n, m in prepared.named_modules() if type(m) is nn.Embedding]
    assert embeddings, "BERT's embeddings were swapped for QAT modules"
    assert not any(isinstance(m, qat.Embedding) for m in prepared.modules())
    with quiet():
        report = fxquant.explain(lowered, show=False)
    skipped = {e.node: e for e in report.skipped() if e.pattern == "Embedding"}
    assert len(skipped) == len(embeddings), f"not all reported: {sorted(skipped)}"
    for entry in skipped.values():
        assert entry.reason is not None
        assert entry.reason.code == "dtype_mismatch"
        assert "torch.float32" in entry.reason.words
    batch = ZOO["bert"].inputs(99)
    with torch.no_grad():
        assert _cosine(main_output(model(*batch)), main_output(lowered(*batch))) > 0.98


def test_qat_embedding_takes_symmetric_int8_rows_and_refuses_a_per_tensor_table() -> None:
    emb = nn.Embedding(6, 3)
    emb.qconfig = embedding_qat_qconfig(torch.int8)
    module = qat.Embedding.from_float(emb)
    indices = torch.tensor([0, 2, 5])
    scale = emb.weight.detach().abs().amax(dim=1) / 127
    table = torch.fake_quantize_per_channel_affine(
        emb.weight, scale, torch.zeros(6, dtype=torch.int32), 0, -127, 127
    )
    assert torch.allclose(module(indices), F.embedding(indices, table), atol=1e-6)

    emb.qconfig = default_qat_qconfig
    with pytest.raises(
        ConfigError, match=r"got qscheme torch\.per_tensor_symmetric.*set_object_type"
    ):
        qat.Embedding.from_float(emb)
