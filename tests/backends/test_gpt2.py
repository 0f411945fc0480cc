"""GPT-2 (transformers 4.5x) end to end on x86: its vmap-built causal mask and its Conv1D (#20).

transformers builds decoder models' causal masks with ``torch.vmap`` over mask functions
(``masking_utils``), which symbolic tracing cannot enter; fxquant's transformers tracer
computes the same mask by broadcasting. GPT-2's ``Conv1D`` layers (an ``addmm`` with a
transposed weight) are traced as ``nn.Linear`` and quantized. Tiny model, random weights.
"""

from __future__ import annotations

import copy
import math

import fxquant
import pytest
import torch
from torch import nn

from tests.backends.conftest import installed_first_party

transformers = pytest.importorskip("transformers")
masking = pytest.importorskip("transformers.masking_utils")
pytest.importorskip("transformers.utils.fx")
pytest.importorskip("fxquant_transformers", reason="pip install -e plugins/transformers")
from fxquant_transformers import broadcast_mask_function  # noqa: E402  (after the skips)

pytestmark = pytest.mark.skipif(
    "x86" not in installed_first_party(), reason="backend 'x86' is not installed"
)

CONV1D_PER_LAYER = 4  # c_attn, attn.c_proj, c_fc, mlp.c_proj


def gpt2(attn_implementation: str) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        attn_implementation=attn_implementation,
    )
    return transformers.GPT2Model(config).eval()


def token_ids(seed: int, length: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (2, length), generator=torch.Generator().manual_seed(seed))


def padding(seed: int, length: int = 16) -> torch.Tensor:
    """Left padding in the first row, right padding in the second (whole masked rows too)."""
    mask = torch.ones(2, length, dtype=torch.long)
    mask[0, : seed % 4 + 1] = 0
    mask[1, -(seed % 3 + 1) :] = 0
    return mask


def sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    noise = (expected - got).double().pow(2).sum()
    return (
        math.inf if noise == 0 else float(10 * torch.log10(expected.double().pow(2).sum() / noise))
    )


def prepare(model: nn.Module, example: tuple[torch.Tensor | None, ...]) -> torch.fx.GraphModule:
    return fxquant.prepare_fx(
        copy.deepcopy(model),
        fxquant.get_default_qconfig_mapping("x86"),
        example,
        backend_config=fxquant.get_backend_config("x86"),
    )


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_gpt2_is_int8_on_x86_with_its_conv1d_layers_lowered(attn_implementation: str) -> None:
    model = gpt2(attn_implementation)
    prepared = prepare(model, (token_ids(0),))
    with torch.no_grad():
        for seed in (1, 2, 3):
            prepared(token_ids(seed))
    converted = fxquant.convert_fx(prepared, backend_config=fxquant.get_backend_config("x86"))
    lowered = [
        e.node for e in fxquant.explain(converted, show=False).entries() if e.status == "lowered"
    ]
    assert len(lowered) == 2 * CONV1D_PER_LAYER, lowered
    x = token_ids(99)
    with torch.no_grad():
        expected, got = model(x).last_hidden_state, converted(x)["last_hidden_state"]
    assert not torch.equal(got, expected)
    assert sqnr(expected, got) >= 25


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_the_traced_causal_mask_is_transformers_mask_with_and_without_padding(
    attn_implementation: str,
) -> None:
    model = gpt2(attn_implementation)
    without = prepare(model, (token_ids(0),))
    with_mask = prepare(model, (token_ids(0), None, None, padding(0)))
    with torch.no_grad():
        for length in (16, 11):  # traced at 16 tokens: the mask follows the input's length
            x = token_ids(7, length)
            expected = model(x).last_hidden_state
            # equal up to float rounding (F.linear for Conv1D's addmm); a wrong mask is O(1) off
            assert torch.allclose(without(x)["last_hidden_state"], expected, atol=1e-5)
            mask = padding(5, length)
            expected = model(x, attention_mask=mask).last_hidden_state
            got = with_mask(x, None, None, mask)["last_hidden_state"]
            assert torch.allclose(got, expected, atol=1e-5)
            got = with_mask(x, attention_mask=mask)["last_hidden_state"]  # by keyword too
            assert torch.allclose(got, expected, atol=1e-5)


def test_no_observer_sees_the_eager_masks_minus_infinity() -> None:
    prepared = prepare(gpt2("eager"), (token_ids(0), None, None, padding(0)))
    with torch.no_grad():
        prepared(token_ids(1), None, None, padding(1))
    observers = [
        m for m in prepared.modules() if isinstance(getattr(m, "min_val", None), torch.Tensor)
    ]
    assert observers
    assert all(float(m.min_val.min()) > -1e3 for m in observers if m.min_val.numel())


MASK_FUNCTIONS = {
    "causal": lambda: masking.causal_mask_function,
    "sliding window": lambda: masking.sliding_window_causal_mask_function(3),
    "chunked": lambda: masking.chunked_causal_mask_function(2, torch.tensor([1, 0])),
    "padding": lambda: masking.and_masks(
        masking.causal_mask_function, masking.padding_mask_function(padding(3, 7).bool())
    ),
    "packed": lambda: masking.and_masks(
        masking.causal_mask_function,
        masking.packed_sequence_mask_function(torch.tensor([[0, 0, 1, 1, 1, 2, 2]] * 2)),
    ),
    "or": lambda: masking.or_masks(
        masking.causal_mask_function, masking.padding_mask_function(padding(2, 7).bool())
    ),
}


@pytest.mark.parametrize("name", list(MASK_FUNCTIONS))
def test_broadcasting_gives_the_vmapped_mask(name: str) -> None:
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    function = MASK_FUNCTIONS[name]()
    indices = (torch.arange(2), torch.arange(1), torch.arange(2, 7), torch.arange(7))
    with TransformGetItemToIndex():  # as transformers calls its vmapped mask
        expected = masking._vmap_for_bhqkv(function)(*indices)
    assert torch.equal(broadcast_mask_function(function)(*indices), expected)
    q_kv = masking._vmap_for_bhqkv(masking.causal_mask_function, bh_indices=False)
    broadcast = broadcast_mask_function(masking.causal_mask_function, bh_indices=False)
    assert torch.equal(broadcast(None, None, *indices[2:]), q_kv(None, None, *indices[2:]))


def test_a_mask_function_that_does_not_broadcast_is_an_untraceable_model_error() -> None:
    def scalar_only(batch_idx, head_idx, q_idx, kv_idx):  # type: ignore[no-untyped-def]
        return torch.tensor(bool(kv_idx <= q_idx))  # Python control flow on one index

    indices = (torch.arange(2), torch.arange(1), torch.arange(3), torch.arange(3))
    with pytest.raises(fxquant.errors.UntraceableModelError, match=r"scalar_only.*4D attention"):
        broadcast_mask_function(scalar_only)(*indices)
