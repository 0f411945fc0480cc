"""Attention blocks in bfloat16 by the mapping, one bf16 flash-attention kernel each (#31).

:func:`attention_bf16_qconfig_mapping` asks for a transformer's attention (q, k, v
Linears int8 in / bf16 out, the matmuls, scaling, additive mask and softmax bf16) and
nothing else; the compiled deployment then runs one bfloat16 flash-attention call per
block. The CPU flags are faked (as test_float_side does), so every CPU runs every test.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.errors import ConfigWarning
from fxquant.numerics import compare
from fxquant_onednn.attention import Attention
from fxquant_x86 import precision
from fxquant_x86.attention import AttentionBlock, attention_blocks
from fxquant_x86.compiled import compile_quantized
from fxquant_x86.kernels import ToBFloat16
from fxquant_x86.qconfig import attention_bf16_qconfig_mapping
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

AMX = frozenset({"avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"})
AVX2 = frozenset({"avx2", "fma"})
HIDDEN, HEADS, TOKENS = 32, 4, 16
# a value rounded to bfloat16 (8 significant bits) alone: ~50 dB; as tests/flow/test_float_side
BF16_ROUNDING_DB = 45.0


class SelfAttention(nn.Module):
    """BERT's attention: heads split by view/permute, scaled scores plus an additive mask."""

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.dropout = nn.Dropout(0.1)
        self.output = nn.Linear(HIDDEN, HIDDEN)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), x.size(1), HEADS, HIDDEN // HEADS).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS)
        probs = self.dropout(F.softmax(scores + mask, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return self.output(context.view(context.size(0), context.size(1), -1))


class Encoder(nn.Module):
    """Two layers of attention, residual add, LayerNorm, GELU feed-forward; a padding mask."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.ModuleList(SelfAttention() for _ in range(2))
        self.norm = nn.ModuleList(nn.LayerNorm(HIDDEN) for _ in range(2))
        self.ffn = nn.ModuleList(
            nn.Sequential(nn.Linear(HIDDEN, 64), nn.GELU(), nn.Linear(64, HIDDEN)) for _ in range(2)
        )

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        mask = (1.0 - keep[:, None, None, :].to(x.dtype)) * -10000.0
        for attention, norm, ffn in zip(self.attention, self.norm, self.ffn, strict=True):
            x = norm(x + attention(x, mask))
            x = x + ffn(x)
        return x


class Inline(nn.Module):
    """Attention written inline with its residual add and LayerNorm: no module of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(self.q(x), self.k(x).transpose(-1, -2)) / 4.0
        return self.norm(x + torch.matmul(torch.softmax(scores, dim=-1), self.v(x)))


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    fxquant.refresh()  # the real CPU's x86 backend for the tests after these


def on_cpu(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    fxquant.refresh()


def inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(2, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(seed))
    keep = torch.ones(2, TOKENS, dtype=torch.int64)
    keep[1, -4:] = 0  # padding: the additive mask is -1e4 there
    return x, keep


def quantize(model: nn.Module, mapping: fxquant.QConfigMapping) -> fx.GraphModule:
    config = fxquant.get_backend_config("x86")
    prepared = fxquant.prepare_fx(model, mapping, inputs(0), backend_config=config)
    with torch.no_grad():
        for seed in range(4):
            prepared(*inputs(seed))
    return fxquant.convert_to_reference_fx(prepared)


def sqnr(actual: torch.Tensor, expected: torch.Tensor) -> float:
    noise = float((actual - expected).pow(2).mean())
    return math.inf if noise == 0 else 10 * math.log10(float(expected.pow(2).mean()) / noise)


def test_each_attention_module_is_found_with_its_query_key_and_value() -> None:
    blocks = attention_blocks(fx.symbolic_trace(Encoder()))
    assert blocks == [
        AttentionBlock(
            f"attention.{i}", tuple(f"attention.{i}.{p}" for p in ("query", "key", "value"))
        )  # type: ignore[arg-type]  # three names
        for i in range(2)
    ]


def test_attention_inline_with_a_residual_and_a_norm_is_left_out() -> None:
    # a module-name entry would put the residual add and the LayerNorm in bf16 too
    assert attention_blocks(fx.symbolic_trace(Inline())) == []


def test_explain_names_the_attention_ops_bf16_and_keeps_the_rest_as_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    torch.manual_seed(0)
    model = Encoder().eval()
    reference = quantize(model, attention_bf16_qconfig_mapping(model))
    rows = {row.node: row for row in fxquant.explain(reference, show=False).entries()}
    for projection in ("query", "key", "value"):
        assert rows[f"attention_0_{projection}"].pattern == "Linear (int8 in, bfloat16 out)"
    assert rows["attention_0_output"].pattern == "Linear (int8 in, float out)"
    # the additive mask's add runs in bf16 too (float32's exponent: -1e4 keeps its size),
    # else a cast each side of it keeps inductor from fusing the attention
    for node, op in (("matmul", "torch.matmul"), ("truediv", "operator.truediv")):
        assert rows[node].pattern == f"{op} (bfloat16)"
    assert rows["add"].pattern == "operator.add (bfloat16)", rows["add"]
    assert rows["softmax"].pattern == "F.softmax (bfloat16)", rows["softmax"]
    assert rows["mul"].status == "float"  # the mask itself: float32, as the default
    assert rows["add_1"].status == "float"  # the residual add, as the default
    assert rows["norm_0"].status == "float"


def test_bf16_attention_stays_within_bf16_rounding_of_the_float32_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    torch.manual_seed(0)
    model = Encoder().eval()
    bf16 = quantize(model, attention_bf16_qconfig_mapping(model))
    int8 = quantize(model, fxquant.get_default_qconfig_mapping("x86"))
    with torch.no_grad():
        want, got_bf16, got_int8 = model(*inputs(9)), bf16(*inputs(9)), int8(*inputs(9))
    assert sqnr(got_int8, want) >= 30.0
    assert sqnr(got_bf16, want) >= sqnr(got_int8, want) - 1.0


def test_compiled_attention_is_one_bf16_flash_attention_call_per_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    torch.manual_seed(0)
    model = Encoder().eval()
    reference = quantize(model, attention_bf16_qconfig_mapping(model))
    compiled = compile_quantized(reference, inputs(0), cpp_wrapper=False)
    calls = [
        line
        for line in compiled.code.splitlines()
        if "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(" in line
    ]
    assert len(calls) == 2, calls  # no bmm / softmax loops left
    # one merged q/k/v GEMM per block, writing bf16 itself: no float32 output and cast pass
    gemms = [line for line in compiled.code.splitlines() if "qlinear_pointwise" in line]
    assert sum("torch.bfloat16" in line for line in gemms) == 2, gemms
    assert "extern_kernels.bmm" not in compiled.code
    assert compiled.float_dtype == torch.bfloat16
    assert sum(compiled.kernels.values()) == compiled.expected_kernels
    with torch.no_grad():
        got, expected = compiled(*inputs(9)), reference(*inputs(9))
    assert got.dtype == torch.float32
    assert sqnr(got, expected) >= 35.0  # bf16 arithmetic where the reference rounds


def test_on_a_cpu_without_bf16_the_default_mapping_comes_back_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AVX2)
    with pytest.warns(ConfigWarning, match=r"no bfloat16 in hardware"):
        mapping = attention_bf16_qconfig_mapping(Encoder())
    assert mapping.to_dict() == fxquant.get_default_qconfig_mapping("x86").to_dict()


class Wrapped(nn.Module):
    """A model around one submodule (torch.nn's encoder layer, or the inline attention)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class Fused(nn.Module):
    """Attention already one fused call: F.scaled_dot_product_attention."""

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(self.query(x), self.key(x), self.value(x))


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (
            lambda: Wrapped(nn.TransformerEncoderLayer(HIDDEN, HEADS, 64, batch_first=True)),
            r"inside TransformerEncoderLayer 'inner', a torch\.nn module the tracer keeps whole",
        ),
        (Inline, r"softmax 'softmax' runs in the model's own forward, not in a submodule"),
        (lambda: Wrapped(Inline()), r"module 'inner' computes 'add' \(add\) beside its attention"),
        (Fused, r"calls F\.scaled_dot_product_attention \(1 call\(s\)\)"),
    ],
    ids=["torch_nn_encoder_layer", "inline", "inline_in_a_module", "sdpa"],
)
def test_a_model_without_an_attention_block_gets_the_default_mapping_and_a_warning_why(
    monkeypatch: pytest.MonkeyPatch, model: type[nn.Module], why: str
) -> None:
    on_cpu(monkeypatch, AMX)
    built = model()
    with pytest.warns(ConfigWarning) as caught:
        mapping = attention_bf16_qconfig_mapping(built)
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith(
        f"attention_bf16_qconfig_mapping: no attention block found in {type(built).__name__}: "
    )
    assert re.search(why, message), message
    assert "softmax sits between two matmuls fed by reshaped nn.Linear outputs" in message
    assert mapping.to_dict() == fxquant.get_default_qconfig_mapping("x86").to_dict()


@pytest.mark.parametrize(
    "model",
    [
        lambda: nn.TransformerEncoderLayer(HIDDEN, HEADS, 64, batch_first=True).eval(),
        lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(HIDDEN, HEADS, 64, batch_first=True),
            2,
            enable_nested_tensor=False,
        ).eval(),
    ],
    ids=["encoder_layer", "encoder"],
)
def test_a_model_plain_fx_cannot_trace_gets_the_default_mapping_and_how_to_pass_its_graph(
    monkeypatch: pytest.MonkeyPatch, model: type[nn.Module]
) -> None:
    on_cpu(monkeypatch, AMX)
    built = model()
    with pytest.warns(ConfigWarning) as caught:
        mapping = attention_bf16_qconfig_mapping(built)
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith(
        "attention_bf16_qconfig_mapping: torch.fx.symbolic_trace could not trace "
        f"{type(built).__name__} to look for attention blocks ("
    ), message
    assert "Pass a GraphModule traced already" in message
    assert mapping.to_dict() == fxquant.get_default_qconfig_mapping("x86").to_dict()


def test_strict_convert_accepts_the_bf16_ops_the_mapping_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    torch.manual_seed(0)
    model = Encoder().eval()
    config = fxquant.get_backend_config("x86")
    prepared = fxquant.prepare_fx(
        model, attention_bf16_qconfig_mapping(model), inputs(0), backend_config=config, strict=True
    )
    with torch.no_grad():
        for seed in range(4):
            prepared(*inputs(seed))
    converted = fxquant.convert_fx(prepared, strict=True)  # no QuantizationSkipped
    report = fxquant.explain(converted, show=False)
    rows = {row.node: row for row in report.entries()}
    # bf16 as asked: attention's ops one bf16 SDPA kernel, the head split / merge the
    # reference form (the op between bf16 casts), no reason to list
    for node in ("matmul", "softmax", "add", "attention_0_dropout"):
        assert (rows[node].status, rows[node].reason) == ("lowered", None), rows[node]
    assert (rows["view"].status, rows["view"].reason) == ("reference", None), rows["view"]
    assert rows["attention_0_query"].status == "lowered"
    assert report.skipped() == []
    (note,) = [n for n in report.notes() if n.startswith("18 node(s) run as float ops in")]
    assert note.startswith("18 node(s) run as float ops in bfloat16, as their qconfig asks")
    # x86's graph mode agrees with the mapping the user passed: nothing left to them
    (mode,) = [n for n in report.notes() if n.startswith("mode: attention_bf16")]
    assert "2 of 2 attention block(s) in bfloat16" in mode
    assert "left as your mapping says" not in mode
    with torch.no_grad():
        got, want = converted(*inputs(9)), model(*inputs(9))
    assert sqnr(got, want) >= 30.0


def test_transformers_bert_eager_attention_is_found_and_its_sdpa_form_is_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transformers = pytest.importorskip("transformers")
    hf_fx = pytest.importorskip("transformers.utils.fx")
    on_cpu(monkeypatch, AMX)

    def bert(attention: str) -> fx.GraphModule:
        config = transformers.BertConfig(
            hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
            intermediate_size=64, attn_implementation=attention, use_cache=False,
        )  # fmt: skip
        model = transformers.BertModel(config).eval()
        return hf_fx.symbolic_trace(model, input_names=["input_ids", "attention_mask"])

    # its head merge computes a shape (size()[:-2] + (hidden,)): not a value beside attention
    blocks = attention_blocks(bert("eager"))
    assert [block.module for block in blocks] == [
        f"encoder.layer.{i}.attention.self" for i in range(2)
    ]
    with pytest.warns(ConfigWarning, match=r"attn_implementation='eager'"):
        attention_bf16_qconfig_mapping(bert("sdpa"))


def lowered_and_reference(
    monkeypatch: pytest.MonkeyPatch, model: nn.Module
) -> tuple[fx.GraphModule, fx.GraphModule]:
    on_cpu(monkeypatch, AMX)
    config = fxquant.get_backend_config("x86")
    mapping = attention_bf16_qconfig_mapping(model)
    prepared = fxquant.prepare_fx(model, mapping, inputs(0), backend_config=config)
    with torch.no_grad():
        for seed in range(4):
            prepared(*inputs(seed))
    return fxquant.convert_fx(prepared), fxquant.convert_to_reference_fx(prepared)


def test_eager_bf16_attention_is_one_bf16_sdpa_kernel_per_block_within_bf16_rounding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    lowered, reference = lowered_and_reference(monkeypatch, Encoder().eval())
    kernels = [m for m in lowered.modules() if isinstance(m, Attention)]
    assert [k.compute_dtype for k in kernels] == [torch.bfloat16] * 2
    ops = {n.target for n in lowered.graph.nodes if n.op == "call_function"}
    assert torch.matmul not in ops
    assert F.softmax not in ops  # no score tensor: the scores stay inside SDPA
    rows = {row.node: row for row in compare(reference, lowered, [inputs(s) for s in (7, 8)])}
    for context in ("permute_3", "permute_7"):  # each block's context, fed the reference's q, k, v
        local = rows[context].local_sqnr
        assert local is not None
        assert local >= BF16_ROUNDING_DB, rows[context]
    report = {row.node: row for row in fxquant.explain(lowered, show=False).entries()}
    for node in ("matmul", "truediv", "add", "softmax", "attention_0_dropout", "matmul_1"):
        assert report[node].status == "lowered", report[node]
    assert report["view"].status == "reference"  # the head split: still the op between casts


def test_eager_bf16_attention_rounds_once_and_feeds_sdpa_bf16_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    lowered, reference = lowered_and_reference(monkeypatch, Encoder().eval())
    casts = [n.name for n in lowered.graph.nodes if n.op == "call_method" and n.target == "to"]
    # a view / permute / contiguous of bf16 values is bf16 values: its two casts are left out;
    # q, k, v and the mask, read by the attention kernels alone, are rounded once, to bf16
    assert casts == ["to"], casts  # the int64 padding mask to float: the model's own
    roundings = [m for m in lowered.modules() if isinstance(m, ToBFloat16)]
    assert len(roundings) == 2 * 3 + 1
    seen: list[torch.dtype] = []
    for kernel in (m for m in lowered.modules() if isinstance(m, Attention)):
        kernel.register_forward_pre_hook(lambda _, args: seen.extend(a.dtype for a in args))
    with torch.no_grad():
        got, want = lowered(*inputs(9)), reference(*inputs(9))
    assert seen == [torch.bfloat16] * 8  # no cast in front of SDPA
    assert sqnr(got, want) >= 45.0


@settings(max_examples=8, deadline=None)
@given(
    batch=st.integers(1, 3),
    tokens=st.integers(1, 24),
    padded=st.integers(0, 24),
    seed=st.integers(0, 2**16),
)
def test_eager_bf16_attention_agrees_with_the_reference_on_any_shape_and_padding(
    lowered_encoder: tuple[fx.GraphModule, fx.GraphModule],
    batch: int,
    tokens: int,
    padded: int,
    seed: int,
) -> None:
    lowered, reference = lowered_encoder
    x = torch.randn(batch, tokens, HIDDEN, generator=torch.Generator().manual_seed(seed))
    keep = torch.ones(batch, tokens, dtype=torch.int64)
    keep[-1, tokens - min(padded, tokens - 1) :] = 0  # padding, one token kept at least
    with torch.no_grad():
        got, want = lowered(x, keep), reference(x, keep)
    # the int8 ops after attention may move a value one step: the SQNR of bf16 rounding
    # through two layers, not bit equality
    assert sqnr(got, want) >= 35.0


@pytest.fixture(scope="module")
def lowered_encoder() -> Iterator[tuple[fx.GraphModule, fx.GraphModule]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as monkeypatch:
        torch.manual_seed(0)
        yield lowered_and_reference(monkeypatch, Encoder().eval())
    torch.set_num_threads(threads)
    fxquant.refresh()


class SingleHead(nn.Module):
    """Attention on 3-d q, k, v (one head, no permute): SDPA's 4-d kernel does not take it."""

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.output = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            p(x).view(x.size(0), x.size(1), HIDDEN) for p in (self.query, self.key, self.value)
        )
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN)
        return self.output(torch.matmul(F.softmax(scores + mask[:, 0], dim=-1), v))


class SingleHeadEncoder(Encoder):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.ModuleList(SingleHead() for _ in range(2))


def test_eager_bf16_attention_the_sdpa_kernel_does_not_take_replays_its_ops_on_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    lowered, reference = lowered_and_reference(monkeypatch, SingleHeadEncoder().eval())
    assert len([m for m in lowered.modules() if isinstance(m, Attention)]) == 2
    with torch.no_grad():
        got, want = lowered(*inputs(9)), reference(*inputs(9))
    assert got.dtype == torch.float32
    assert sqnr(got, want) >= 45.0  # the same ops, the same roundings
