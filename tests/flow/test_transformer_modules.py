"""PyTorch's own transformer modules through prepare_fx / convert_fx (#20).

Traced: the prepared model computes what the module computes in eval mode (float
tolerance). Converted: every Linear (in_proj, out_proj, the feed-forward layers)
lowered to int8 on x86 and qnnpack, SQNR against the float module. Escape hatches:
a module class kept as one call, a custom observed module swapped in.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fxquant import (
    PrepareCustomConfig,
    QConfigMapping,
    convert_fx,
    disable_observer,
    explain,
    get_backend_config,
    get_default_qat_qconfig_mapping,
    get_default_qconfig_mapping,
    prepare_fx,
    prepare_qat_fx,
)
from fxquant.errors import UntraceableModelError
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

D, HEADS, FF, SEQ, MEM, BATCH = 32, 4, 64, 6, 5, 3


def sqnr(signal: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (signal - approximation).pow(2).mean()
    return float(10 * torch.log10(signal.pow(2).mean() / noise))


class Call(nn.Module):
    """``call(module, x, y, z)``: masks and memory arrive as forward inputs (placeholders)."""

    def __init__(self, module: nn.Module, call: Callable[..., Any]) -> None:
        super().__init__()
        self.module = module
        self.call = call
        self.eval()  # eval mode throughout, as the module given

    def forward(self, x: Any, y: Any = None, z: Any = None) -> Any:
        return self.call(self.module, x, y, z)


def _seq(batch_first: bool, length: int = SEQ) -> torch.Tensor:
    return torch.randn(BATCH, length, D) if batch_first else torch.randn(length, BATCH, D)


def _causal(length: int = SEQ) -> torch.Tensor:
    return nn.Transformer.generate_square_subsequent_mask(length)


def _padding(length: int = SEQ) -> torch.Tensor:
    mask = torch.zeros(BATCH, length, dtype=torch.bool)
    mask[0, -2:] = True  # batch 0: its last two keys are padding
    return mask


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _outputs(out: Any) -> list[torch.Tensor]:
    items = out if isinstance(out, tuple) else (out,)
    return [t for t in items if t is not None]


def _prepared(model: nn.Module, inputs: tuple[Any, ...], mapping: Any, backend: str) -> Any:
    return prepare_fx(model, mapping, inputs, backend_config=get_backend_config(backend))


# --- the cases: (name, model builder, inputs builder) ---------------------------------------


def _mha_case(batch_first: bool, need_weights: bool, mask: str, kind: str) -> tuple[Any, ...]:
    kdim = D // 2 if kind == "kdim" else None
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, HEADS, batch_first=batch_first, kdim=kdim, vdim=kdim).eval()
    length = SEQ if kind == "self" else MEM
    memory = _seq(batch_first, length)
    if kdim is not None:
        memory = memory[..., :kdim].contiguous()
    attn = {"none": None, "causal": _causal(), "bool": _causal() == float("-inf")}.get(mask)
    if attn is not None and kind != "self":
        attn = attn[:, :length]
    padding = _padding(length) if mask == "padding" else None

    def call(m: nn.Module, x: Any, mem: Any, attn_mask: Any) -> Any:
        key = x if kind == "self" else mem
        return m(
            x, key, key, need_weights=need_weights, attn_mask=attn_mask, key_padding_mask=padding
        )

    inputs = (_seq(batch_first), memory, attn)
    return Call(mha, call), inputs


MHA_CASES = list(
    itertools.product(
        (True, False), (True, False), ("none", "causal", "bool", "padding"), ("self", "cross")
    )
)


@pytest.mark.parametrize(("batch_first", "need_weights", "mask", "kind"), MHA_CASES)
def test_multihead_attention_traced_computes_the_module(
    batch_first: bool, need_weights: bool, mask: str, kind: str
) -> None:
    model, inputs = _mha_case(batch_first, need_weights, mask, kind)
    prepared = _prepared(model, inputs, QConfigMapping(), "x86")
    assert not any(
        isinstance(prepared.get_submodule(str(n.target)), nn.MultiheadAttention)
        for n in prepared.graph.nodes
        if n.op == "call_module"
    ), "the attention was kept as one call"
    with torch.no_grad():
        for want, got in zip(_outputs(model(*inputs)), _outputs(prepared(*inputs)), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_multihead_attention_with_its_own_key_and_value_sizes() -> None:
    model, inputs = _mha_case(True, True, "none", "kdim")
    prepared = _prepared(model, inputs, QConfigMapping(), "x86")
    with torch.no_grad():
        for want, got in zip(_outputs(model(*inputs)), _outputs(prepared(*inputs)), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_unbatched_multihead_attention_traced_computes_the_module() -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, HEADS).eval()
    x = torch.randn(SEQ, D)
    prepared = _prepared(mha, (x, x, x), QConfigMapping(), "x86")
    with torch.no_grad():
        for want, got in zip(_outputs(mha(x, x, x)), _outputs(prepared(x, x, x)), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _layer(kind: str, batch_first: bool, norm_first: bool) -> nn.Module:
    torch.manual_seed(0)
    options = {"dim_feedforward": FF, "batch_first": batch_first, "norm_first": norm_first}
    if kind == "encoder_layer":
        return nn.TransformerEncoderLayer(D, HEADS, **options)
    if kind == "decoder_layer":
        return nn.TransformerDecoderLayer(D, HEADS, **options)
    if kind == "encoder":
        layer = nn.TransformerEncoderLayer(D, HEADS, **options)
        return nn.TransformerEncoder(layer, 2, nn.LayerNorm(D), enable_nested_tensor=False)
    if kind == "decoder":
        return nn.TransformerDecoder(nn.TransformerDecoderLayer(D, HEADS, **options), 2)
    with warnings.catch_warnings():  # torch's note that norm_first has no nested-tensor path
        warnings.simplefilter("ignore", UserWarning)
        model = nn.Transformer(D, HEADS, 2, 2, FF, batch_first=batch_first, norm_first=norm_first)
    model.encoder.use_nested_tensor = False  # the float side without prototype nested tensors
    return model


def _layer_case(kind: str, batch_first: bool, norm_first: bool, masked: bool) -> tuple[Any, ...]:
    module = _layer(kind, batch_first, norm_first).eval()
    x, memory = _seq(batch_first), _seq(batch_first, MEM)
    causal = _causal() == float("-inf") if masked else None  # bool, as the padding masks
    padding = _padding() if masked else None
    memory_padding = _padding(MEM) if masked else None

    def call(m: nn.Module, x: Any, mem: Any, mask: Any) -> Any:
        if kind in ("encoder_layer", "encoder"):
            return m(x, mask, src_key_padding_mask=padding)
        if kind == "transformer":
            return m(
                mem,
                x,
                tgt_mask=mask,
                src_key_padding_mask=memory_padding,
                memory_key_padding_mask=memory_padding,
            )
        return m(x, mem, tgt_mask=mask, tgt_key_padding_mask=padding)

    return Call(module, call), (x, memory, causal), padding


LAYER_CASES = list(
    itertools.product(
        ("encoder_layer", "decoder_layer", "encoder", "decoder", "transformer"),
        (True, False),
        (True, False),
        (True, False),
    )
)


def _valid(out: torch.Tensor, padding: torch.Tensor | None, batch_first: bool) -> torch.Tensor:
    """The outputs at positions that are not padding (torch's fast path zeroes padding)."""
    if padding is None:
        return out
    keep = ~padding if batch_first else (~padding).T
    return out[keep]


@pytest.mark.parametrize(("kind", "batch_first", "norm_first", "masked"), LAYER_CASES)
def test_transformer_modules_traced_compute_the_module(
    kind: str, batch_first: bool, norm_first: bool, masked: bool
) -> None:
    model, inputs, padding = _layer_case(kind, batch_first, norm_first, masked)
    prepared = _prepared(model, inputs, QConfigMapping(), "x86")
    if kind == "transformer":
        padding = None  # the decoder's own queries are not padded there
    with torch.no_grad():
        want, got = model(*inputs), prepared(*inputs)
    torch.testing.assert_close(
        _valid(got, padding, batch_first), _valid(want, padding, batch_first), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("kind", ["encoder", "decoder_layer", "transformer"])
@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
def test_transformer_modules_int8_lower_every_linear(kind: str, backend: str) -> None:
    model, inputs, _ = _layer_case(kind, True, False, True)
    mapping = get_default_qconfig_mapping(backend)
    prepared = _prepared(model, inputs, mapping, backend)
    with torch.no_grad():
        for _ in range(4):
            prepared(*inputs)
        prepared(*inputs)
        converted = convert_fx(prepared)
        want, got = model(*inputs), converted(*inputs)
    assert sqnr(want, got) > 25.0
    report = explain(converted)
    linears = [e for e in report.entries() if e.pattern and "linear" in e.pattern.lower()]
    # per encoder layer: in_proj, out_proj, linear1 (+ relu), linear2; per decoder layer also
    # the cross-attention's query and key/value projections (F.linear) and its out_proj
    expected = {"encoder": 2 * 4, "decoder_layer": 7, "transformer": 2 * 4 + 2 * 7}[kind]
    assert len(linears) == expected, [e.node for e in linears]
    assert all(e.status == "lowered" for e in linears), [(e.node, e.status) for e in linears]


def test_encoder_as_the_root_prepares_and_converts() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(BATCH, SEQ, D)
    prepared = _prepared(encoder, (x,), get_default_qconfig_mapping("x86"), "x86")
    with torch.no_grad():
        torch.testing.assert_close(prepared(x), encoder(x), atol=1e-5, rtol=1e-5)
        converted = convert_fx(prepared)
        assert sqnr(encoder(x), converted(x)) > 30.0
    names = {n.target for n in converted.graph.nodes if n.op == "call_module"}
    assert "layers.0.self_attn.in_proj" in names
    assert "layers.1.self_attn.out_proj" in names
    assert not hasattr(encoder.layers[0].self_attn, "in_proj"), "the user's model was changed"
    assert type(encoder.layers[0].self_attn.out_proj) is not nn.Linear


def test_a_class_kept_as_one_call_stays_float() -> None:
    model, inputs, _ = _layer_case("encoder", True, False, False)
    config = PrepareCustomConfig().set_non_traceable_module_classes([nn.TransformerEncoderLayer])
    prepared = prepare_fx(
        model,
        get_default_qconfig_mapping("x86"),
        inputs,
        prepare_custom_config=config,
        backend_config=get_backend_config("x86"),
    )
    kept = [n for n in prepared.graph.nodes if n.op == "call_module" and "layers" in str(n.target)]
    assert [type(prepared.get_submodule(str(n.target))) for n in kept] == [
        nn.TransformerEncoderLayer
    ] * 2
    with torch.no_grad():
        prepared(*inputs)
        converted = convert_fx(prepared)
        torch.testing.assert_close(converted(*inputs), model(*inputs), atol=1e-5, rtol=1e-5)


def test_a_custom_module_class_stays_one_call_for_the_user_to_swap() -> None:
    model, inputs = _mha_case(True, False, "none", "self")
    config = PrepareCustomConfig().set_float_to_observed_mapping(nn.MultiheadAttention, Observed)
    prepared = prepare_fx(
        model,
        get_default_qconfig_mapping("x86"),
        inputs,
        prepare_custom_config=config,
        backend_config=get_backend_config("x86"),
    )
    calls = [n for n in prepared.graph.nodes if n.op == "call_module"]
    assert [str(n.target) for n in calls] == ["module"]
    with torch.no_grad():
        want = model(*inputs)[0]
        torch.testing.assert_close(prepared(*inputs)[0], want)


class Observed(nn.MultiheadAttention):
    """A user's observed attention (the custom-module escape hatch)."""


def test_a_subclass_with_its_own_forward_is_traced_as_written() -> None:
    class Mine(nn.TransformerEncoderLayer):
        def forward(self, src: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
            return self.linear2(self.linear1(src))

    model = Mine(D, HEADS, FF, batch_first=True).eval()
    x = _seq(True)
    gm = _prepared(model, (x,), QConfigMapping(), "x86")
    targets = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert targets == ["linear1", "linear2"]


@pytest.mark.parametrize("option", [{"add_bias_kv": True}, {"add_zero_attn": True}])
def test_attention_with_bias_kv_or_zero_attn_stays_one_float_call(option: dict[str, bool]) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(D, HEADS, batch_first=True, **option).eval()
    model = Call(mha, lambda m, x, _y, _z: m(x, x, x)[0])
    x = _seq(True)
    prepared = _prepared(model, (x,), get_default_qconfig_mapping("x86"), "x86")
    calls = [n for n in prepared.graph.nodes if n.op == "call_module"]
    assert [type(prepared.get_submodule(str(n.target))) for n in calls] == [type(mha)]
    with torch.no_grad():
        prepared(x)
        torch.testing.assert_close(convert_fx(prepared)(x), model(x))


def test_is_causal_without_the_mask_is_refused_as_torch_does() -> None:
    mha = nn.MultiheadAttention(D, HEADS).eval()
    model = Call(mha, lambda m, x, _y, _z: m(x, x, x, is_causal=True, need_weights=False))
    with pytest.raises(UntraceableModelError, match="is_causal=True needs attn_mask"):
        _prepared(model, (_seq(False),), QConfigMapping(), "x86")


@settings(max_examples=15, deadline=None)
@given(
    batch_first=st.booleans(),
    heads=st.sampled_from([1, 2, 4, 8]),
    length=st.integers(1, 7),
    padded=st.integers(0, 3),
    weights=st.booleans(),
    average=st.booleans(),
)
def test_attention_masks_of_any_shape_match_the_module(
    batch_first: bool, heads: int, length: int, padded: int, weights: bool, average: bool
) -> None:
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(D, heads, batch_first=batch_first).eval()
    x = torch.randn(2, length, D) if batch_first else torch.randn(length, 2, D)
    padded = min(padded, length - 1)  # one key left to attend
    padding = torch.zeros(2, length)  # float, as the float attn_mask (torch warns on a mix)
    padding[1, length - padded :] = float("-inf") if padded else 0.0
    attn = torch.randn(2 * heads, length, length)  # a float 3-d mask, one per batch and head

    def call(m: nn.Module, x: Any, attn: Any, padding: Any) -> Any:
        return m(
            x,
            x,
            x,
            attn_mask=attn,
            key_padding_mask=padding,
            need_weights=weights,
            average_attn_weights=average,
        )

    model = Call(mha, call)
    gm = _prepared(model, (x, attn, padding), QConfigMapping(), "x86")
    with torch.no_grad():
        want, got = _outputs(model(x, attn, padding)), _outputs(gm(x, attn, padding))
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_qat_attention_dropout_follows_train_and_eval() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.5, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).train()
    x = torch.randn(BATCH, SEQ, D)
    prepared = prepare_qat_fx(
        encoder,
        get_default_qat_qconfig_mapping("x86"),
        (x,),
        backend_config=get_backend_config("x86"),
    )
    dropouts = [
        n.target
        for n in prepared.graph.nodes
        if n.op == "call_module" and isinstance(prepared.get_submodule(str(n.target)), nn.Dropout)
    ]
    assert "layers.0.self_attn.attn_dropout" in dropouts
    prepared(x).sum().backward()  # trains
    prepared.eval()
    prepared.apply(disable_observer)  # fixed qparams: only dropout could change the output
    with torch.no_grad():
        torch.testing.assert_close(prepared(x), prepared(x))  # no dropout left in eval
        converted = convert_fx(prepared)
        encoder.eval()
        assert sqnr(encoder(x), converted(x)) > 25.0
