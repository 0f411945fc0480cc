"""The embedding lookup kernel: rows gathered from the integer table, then dequantized, bit
for bit the reference module's rows (issue 30: QAT quantizes BERT's tables by default)."""

from __future__ import annotations

import pytest
import torch
from fxquant.lowering import Declined
from fxquant.nn import reference
from fxquant_quantized_engine.embedding import EmbeddingLookup, build_embedding
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

_SCHEMES = {
    "float_qparams_uint8": ("per_channel_affine_float_qparams", torch.uint8, 0, 255),
    "symmetric_int8": ("per_channel_symmetric", torch.int8, -127, 127),
}


def _table(rows: int, dim: int, scheme: str, seed: int) -> reference.Embedding:
    qscheme, dtype, low, high = _SCHEMES[scheme]
    torch.manual_seed(seed)
    emb = nn.Embedding(rows, dim)
    lo, hi = emb.weight.detach().amin(1), emb.weight.detach().amax(1)
    if dtype == torch.uint8:
        scale = ((hi - lo) / (high - low)).clamp_min(1e-6)  # a one-column row has hi == lo
        zero_point = -lo / scale  # float zero points, as the float-qparams observer gives
    else:
        scale = (torch.maximum(hi.abs(), lo.abs()) / high).clamp_min(1e-6)
        zero_point = torch.zeros(rows, dtype=torch.int32)
    qparams = {"qscheme": qscheme, "dtype": dtype, "scale": scale, "zero_point": zero_point,
               "axis": 0, "quant_min": low, "quant_max": high}  # fmt: skip
    return reference.Embedding.from_float(emb, qparams)


@settings(max_examples=20, deadline=None)
@given(
    rows=st.integers(1, 40),
    dim=st.integers(1, 12),
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    scheme=st.sampled_from(sorted(_SCHEMES)),
    seed=st.integers(0, 2**16),
)
def test_the_lookup_equals_the_reference_rows(
    rows: int, dim: int, shape: list[int], scheme: str, seed: int
) -> None:
    ref = _table(rows, dim, scheme, seed)
    kernel = EmbeddingLookup(ref)
    indices = torch.randint(0, rows, shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert torch.equal(kernel(indices), ref(indices))
    assert kernel.table.dtype == _SCHEMES[scheme][1]  # the table is kept as integers


def test_a_per_tensor_table_or_max_norm_stays_in_reference_form_with_the_reason() -> None:
    class Match:
        def __init__(self, module: nn.Module) -> None:
            self.modules = (module,)

    per_tensor = reference.Embedding.from_float(
        nn.Embedding(4, 2),
        {"qscheme": "per_tensor_affine", "dtype": torch.uint8, "scale": 0.1, "zero_point": 3},
    )
    declined = build_embedding(Match(per_tensor))  # type: ignore[arg-type]
    assert isinstance(declined, Declined)
    assert "not per row" in declined.reason
    renormalized = _table(4, 2, "symmetric_int8", 0)
    renormalized.max_norm = 1.0
    declined = build_embedding(Match(renormalized))  # type: ignore[arg-type]
    assert isinstance(declined, Declined)
    assert "max_norm" in declined.reason


@pytest.mark.parametrize("scheme", sorted(_SCHEMES))
def test_the_lookup_keeps_its_table_through_state_dict(scheme: str) -> None:
    kernel = EmbeddingLookup(_table(6, 3, scheme, 1))
    twin = EmbeddingLookup(_table(6, 3, scheme, 2))
    twin.load_state_dict(kernel.state_dict())
    ids = torch.tensor([0, 5, 2])
    assert torch.equal(twin(ids), kernel(ids))
