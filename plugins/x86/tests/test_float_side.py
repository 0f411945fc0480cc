"""x86's bfloat16 float side chosen by the config, run by the deployment as the config says (#31).

Where the CPU computes bfloat16 the x86 backend offers ``DTypeConfig``s with a bfloat16
float side; :func:`bf16_qconfig_mapping` asks for them; the reference model rounds those
values, ``explain`` names them, and the compiled deployment runs those nodes in bfloat16.
The CPU flags are faked (as test_precision does), so every CPU runs every test.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import fxquant
import pytest
import torch
from fxquant.errors import ConfigWarning
from fxquant_x86 import precision
from fxquant_x86.compiled import compile_quantized, flatten_for_compile
from fxquant_x86.qconfig import bf16_qconfig_mapping
from torch import fx, nn

BACKEND = "x86"
AMX = frozenset({"avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16"})
AVX2 = frozenset({"avx2", "fma"})


class Block(nn.Module):
    """Token ids -> embedding -> linear -> residual add -> LayerNorm -> linear + GELU -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.fc1 = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 32)
        self.fc3 = nn.Linear(32, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = self.norm(x + self.fc1(x))
        return self.fc3(nn.functional.gelu(self.fc2(x)))


def on_cpu(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> None:
    """Fake the CPU's flags; the x86 backend is assembled again for them."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    fxquant.refresh()


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    fxquant.refresh()  # the real CPU's x86 backend for the tests after these


def ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(seed))


def quantize(mapping: Any) -> tuple[nn.Module, fx.GraphModule]:
    torch.manual_seed(0)
    model = Block().eval()
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_fx(model, mapping, (ids(0),), backend_config=config)
    with torch.no_grad():
        for seed in range(4):
            prepared(ids(seed))
    return model, fxquant.convert_to_reference_fx(prepared)


def sqnr(actual: torch.Tensor, expected: torch.Tensor) -> float:
    noise = float((actual - expected).pow(2).mean())
    return math.inf if noise == 0 else 10 * math.log10(float(expected.pow(2).mean()) / noise)


def dtypes_of(model: fx.GraphModule, x: torch.Tensor) -> dict[str, torch.dtype]:
    """Each op's output dtype when ``model`` runs ``x``, by the op's name."""
    torch.fx.passes.shape_prop.ShapeProp(model).propagate(x)
    return {
        getattr(n.target, "__name__", str(n.target)): n.meta["tensor_meta"].dtype
        for n in model.graph.nodes
        if n.op == "call_function" and hasattr(n.meta.get("tensor_meta"), "dtype")
    }


def test_on_an_amx_cpu_explain_names_the_nodes_that_run_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    _, reference = quantize(bf16_qconfig_mapping())
    rows = {row.node: row for row in fxquant.explain(reference).entries()}
    for linear in ("fc1", "fc2", "fc3"):
        assert rows[linear].pattern == "Linear (int8 in, bfloat16 out)", rows[linear]
    assert rows["add"].pattern == "operator.add (bfloat16)"
    assert rows["norm"].pattern == "LayerNorm (bfloat16)"
    assert rows["gelu"].pattern == "F.gelu (bfloat16)"


def test_eager_convert_says_why_a_bf16_node_keeps_its_reference_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # eager convert_fx has no bf16 kernel for a float op: the node did what its qconfig asked
    # (bf16, in its reference form), so no reason strict mode would count; a note says where
    # it runs bf16
    on_cpu(monkeypatch, AMX)
    torch.manual_seed(0)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_fx(
        Block().eval(), bf16_qconfig_mapping(), (ids(0),), backend_config=config
    )
    prepared(ids(1))
    report = fxquant.explain(fxquant.convert_fx(prepared))
    rows = {row.node: row for row in report.entries()}
    for node in ("norm", "gelu"):
        assert (rows[node].status, rows[node].reason) == ("reference", None), rows[node]
        assert rows[node].pattern.endswith(" (bfloat16)"), rows[node]
    (note,) = [note for note in report.notes() if "bfloat16" in note]
    assert note.startswith("3 node(s) run as float ops in bfloat16, as their qconfig asks"), note
    assert "a deployment that compiles the reference form runs them in that dtype" in note


def test_bf16_reference_stays_within_bf16_rounding_of_the_int8_float32_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    model, bf16 = quantize(bf16_qconfig_mapping())
    _, int8 = quantize(fxquant.get_default_qconfig_mapping(BACKEND))
    with torch.no_grad():
        want, got_bf16, got_int8 = model(ids(9)), bf16(ids(9)), int8(ids(9))
    # the int8 GEMMs set the error; bf16 float parts may cost at most 2 dB of it
    assert sqnr(got_int8, want) >= 33.0
    assert sqnr(got_bf16, want) >= sqnr(got_int8, want) - 2.0


def test_deployment_graph_runs_in_bf16_exactly_the_nodes_the_reference_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    _, reference = quantize(bf16_qconfig_mapping())
    flat = flatten_for_compile(reference)
    assert precision.rounds_to_bf16(flat)
    # fc1..fc3, add, layer_norm, gelu
    assert precision.float_side_in(flat, (ids(0),)) == 6
    dtypes = dtypes_of(flat, ids(9))
    for op in ("linear", "add", "layer_norm", "gelu"):
        assert dtypes[op] == torch.bfloat16, op
    assert dtypes["embedding"] == torch.float32  # not asked for: as the reference runs it
    assert dtypes["quantize_per_tensor.default"] == torch.uint8
    with torch.no_grad():
        got, expected = flat(ids(9)), reference(ids(9))
    assert got.dtype == torch.float32
    # bf16 arithmetic where the reference rounds to bf16: the two differ by bf16 rounding
    assert sqnr(got, expected) >= 35.0


def test_int8_only_mapping_compiles_nothing_in_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    on_cpu(monkeypatch, AMX)
    _, reference = quantize(fxquant.get_default_qconfig_mapping(BACKEND))
    flat = flatten_for_compile(reference)
    assert not precision.rounds_to_bf16(flat)
    assert torch.bfloat16 not in dtypes_of(flat, ids(9)).values()


def test_on_a_cpu_without_bf16_the_mapping_falls_back_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AVX2)
    with pytest.warns(ConfigWarning, match=r"no bfloat16 in hardware.*amx_bf16, avx512_bf16"):
        mapping = bf16_qconfig_mapping()
    _, reference = quantize(mapping)
    rows = {row.node: row for row in fxquant.explain(reference).entries()}
    assert rows["fc1"].pattern == "Linear (int8 in, float out)"
    assert not precision.rounds_to_bf16(reference)
    # nor does the backend offer it to a mapping written by hand: the reason names the dtype
    config = fxquant.get_backend_config(BACKEND)
    assert not any(
        torch.bfloat16 in (c.input_dtype, c.output_dtype)
        for p in config.configs
        for c in p.dtype_configs
    )


def test_compiled_deployment_follows_the_config_and_stays_near_its_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    _, reference = quantize(bf16_qconfig_mapping())
    compiled = compile_quantized(reference, (ids(0),))
    assert compiled.float_dtype == torch.bfloat16
    assert any("as the config says" in note for note in compiled.report.notes())
    assert sum(compiled.kernels.values()) == compiled.expected_kernels == 3  # int8 GEMMs
    assert "bfloat16" in compiled.code  # the GEMMs hand the float ops bfloat16
    with torch.no_grad():
        got, expected = compiled(ids(9)), reference(ids(9))
    assert got.dtype == torch.float32
    assert sqnr(got, expected) >= 35.0
    # the float_dtype shorthand still turns it off
    off = compile_quantized(reference, (ids(0),), float_dtype=torch.float32)
    assert off.float_dtype == torch.float32


class Scores(nn.Module):
    """Attention's scores: q @ k^T / sqrt(d), softmax, @ v."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(self.q(x), self.k(x).transpose(-1, -2)) / 4.0
        return torch.matmul(torch.softmax(scores, dim=-1), self.v(x))


def test_attention_scaling_runs_bf16_so_no_cast_surrounds_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    x = torch.randn(2, 8, 16)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_fx(
        Scores().eval(), bf16_qconfig_mapping(), (x,), backend_config=config
    )
    prepared(x)
    reference = fxquant.convert_to_reference_fx(prepared)
    patterns = {row.node: row.pattern for row in fxquant.explain(reference, show=False).entries()}
    assert patterns["truediv"] == "operator.truediv (bfloat16)"
    assert patterns["softmax"] == "torch.softmax (bfloat16)"
    flat = flatten_for_compile(reference)
    precision.float_side_in(flat, (x,))
    back = [n for n in flat.graph.nodes if getattr(n.target, "__name__", "") == "to_float32"]
    assert [str(next(iter(n.users)).op) for n in back] == ["output"]
