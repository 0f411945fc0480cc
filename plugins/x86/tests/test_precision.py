"""x86's compiled deployment runs the float parts in bfloat16 where the CPU computes it (#31)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import fxquant
import pytest
import torch
from fxquant.errors import ConfigTypeError
from fxquant_x86 import precision
from fxquant_x86.compiled import compile_quantized, flatten_for_compile
from torch import fx, nn

BACKEND = "x86"


class Block(nn.Module):
    """Token ids -> embedding -> linear -> residual add -> LayerNorm -> linear + GELU -> linear:
    a transformer layer's float parts (add, LayerNorm, GELU) between int8 GEMMs."""

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


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def reference(ids: torch.Tensor) -> fx.GraphModule:
    torch.manual_seed(0)
    model = Block().eval()
    config = fxquant.get_backend_config(BACKEND)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    prepared = fxquant.prepare_fx(model, mapping, (ids,), backend_config=config)
    with torch.no_grad():
        for seed in range(4):
            prepared(torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(seed)))
    return fxquant.convert_to_reference_fx(prepared)


@pytest.mark.parametrize(
    ("flags", "accelerated"),
    [
        ({"avx2", "avx512f", "amx_tile", "amx_bf16", "amx_int8"}, True),
        ({"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}, True),
        ({"avx2", "avx512f", "avx512_vnni"}, False),
        ({"avx2", "fma"}, False),
    ],
)
def test_bf16_arithmetic_is_read_from_the_cpu_flags_and_the_default_stays_float32(
    monkeypatch: pytest.MonkeyPatch, flags: set[str], accelerated: bool
) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    assert precision.bf16_accelerated() is accelerated
    # measured no faster on AMX (plugins/x86/README.md): float32 float parts on every CPU
    assert precision.default_float_dtype() == torch.float32


AMX_FLAGS = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"})


@pytest.mark.parametrize(
    ("variable", "value", "capped"),
    [
        ("ONEDNN_MAX_CPU_ISA", "AVX2", True),
        ("ONEDNN_MAX_CPU_ISA", "avx512_core_vnni", True),
        ("DNNL_MAX_CPU_ISA", "AVX2_VNNI", True),
        ("ATEN_CPU_CAPABILITY", "avx2", True),
        ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", False),
        ("ONEDNN_MAX_CPU_ISA", "AVX10_1_512_AMX", False),
        ("ONEDNN_MAX_CPU_ISA", "ALL", False),
        ("ATEN_CPU_CAPABILITY", "avx512", False),
    ],
)
def test_an_isa_cap_below_bf16_turns_x86s_bf16_choices_off_on_an_amx_cpu(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, capped: bool
) -> None:
    from fxquant.errors import ConfigWarning
    from fxquant_x86.qconfig import bf16_qconfig_mapping

    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: AMX_FLAGS)
    monkeypatch.setenv(variable, value)
    assert precision.bf16_accelerated() is not capped
    if not capped:
        assert precision.isa_cap_without_bf16() is None
        return
    # the benchmark's ISA-capped rows rely on this: no bfloat16 mapping under the cap,
    # and the warning names the setting to unset
    with pytest.warns(ConfigWarning, match=f"{variable}={value} caps oneDNN"):
        mapping = bf16_qconfig_mapping()
    expected = fxquant.get_default_qconfig_mapping(BACKEND).to_dict()
    assert mapping.to_dict() == expected


@pytest.mark.parametrize("probe", [True, False])
def test_without_cpuinfo_flags_torchs_avx512_bf16_probe_decides(
    monkeypatch: pytest.MonkeyPatch, probe: bool
) -> None:
    monkeypatch.setattr(precision, "cpu_flags", frozenset)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: probe)
    assert precision.bf16_accelerated() is probe


class DtypeRecorder(fx.Interpreter):
    """Runs a graph and keeps each node's output dtype (tensors only)."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.dtypes: dict[str, torch.dtype] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if isinstance(value, torch.Tensor):
            self.dtypes[n.name] = value.dtype
        return value


def _dtypes_of(graph: fx.GraphModule, ids: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
    recorder = DtypeRecorder(graph)
    with torch.no_grad():
        out = recorder.run(ids)
    by_op: dict[str, Any] = {}
    for node in graph.graph.nodes:
        kind = getattr(node.target, "__name__", str(node.target))
        if node.name in recorder.dtypes:
            by_op.setdefault(kind, set()).add(recorder.dtypes[node.name])
    return by_op, out


def test_float_parts_in_runs_the_float_ops_in_bf16_and_hands_quantize_steps_float32(
    reference: fx.GraphModule, ids: torch.Tensor
) -> None:
    flat = flatten_for_compile(copy.deepcopy(reference))
    _, before = _dtypes_of(flat, ids)
    assert precision.float_parts_in(flat) > 0
    dtypes, after = _dtypes_of(flat, ids)
    # the float ops between the quantize steps compute in bfloat16
    for op in ("layer_norm", "gelu", "add", "linear"):
        assert dtypes[op] == {torch.bfloat16}, (op, dtypes[op])
    # quantize steps read float32 (inductor's int8-mixed-bf16 form), give integers
    assert dtypes["to_float32"] == {torch.float32}
    assert dtypes["quantize_per_tensor.default"] == {torch.uint8}
    # token ids stay integers: the embedding looked them up
    assert dtypes["embedding"] == {torch.bfloat16}
    assert after.dtype == torch.float32
    # bfloat16 float parts: close to the float32 reference, not equal to it
    noise = (after - before).pow(2).sum()
    assert not torch.equal(after, before)
    assert float(10 * torch.log10(before.pow(2).sum() / noise)) > 25


def test_float_dtype_other_than_float32_or_bf16_is_refused_naming_the_choices(
    reference: fx.GraphModule, ids: torch.Tensor
) -> None:
    with pytest.raises(ConfigTypeError, match=r"float_dtype must be torch\.float32.*float16"):
        compile_quantized(reference, (ids,), float_dtype=torch.float16)


def test_bf16_float_parts_compile_to_int8_gemms_with_bf16_outputs(
    reference: fx.GraphModule, ids: torch.Tensor
) -> None:
    compiled = compile_quantized(reference, (ids,), float_dtype=torch.bfloat16)
    assert compiled.float_dtype == torch.bfloat16
    assert precision.BF16_NOTE in compiled.report.notes()
    # every linear is still an int8 oneDNN GEMM
    assert sum(compiled.kernels.values()) == compiled.expected_kernels == 3
    # the GEMMs feeding float ops hand them bfloat16 (the buffers inductor allocates)
    assert re.search(r"bfloat16", compiled.code)
    x = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        actual, expected, float32 = compiled(x), compiled.reference(x), reference(x)
    assert actual.dtype == torch.float32
    # within one quantization step of the graph it compiled (the bf16 reference): fc3's
    # input step times its weights' largest row sum
    step = float(reference.fc3.weight.detach().abs().sum(1).max()) * _last_input_scale(reference)
    assert float((actual - expected).abs().max()) <= step
    assert float((actual - float32).abs().max()) <= 4 * step


def _last_input_scale(reference: fx.GraphModule) -> float:
    quantize = [
        n
        for n in reference.graph.nodes
        if n.target == torch.ops.fxquant.quantize_per_tensor.default
    ]
    return float(quantize[-1].args[1])


def test_ops_between_two_quantize_steps_stay_float32_so_the_int8_patterns_still_match() -> None:
    # conv + relu6 (one pattern) -> max pool: each between two quantize steps (x86 quantizes
    # the pool on its own); casting them would hide the clamp post-op and the integer pool
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU6(), nn.MaxPool2d(2)).eval()
    x = torch.randn(2, 3, 8, 8)
    config = fxquant.get_backend_config(BACKEND)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    with torch.no_grad():
        prepared(x)
    flat = flatten_for_compile(fxquant.convert_to_reference_fx(prepared))
    precision.float_parts_in(flat)
    dtypes, out = _dtypes_of(flat, x)
    for op in ("conv2d", "hardtanh", "max_pool2d"):
        assert dtypes[op] == {torch.float32}, (op, dtypes[op])
    assert not [n for n in flat.graph.nodes if n.op == "call_method" and n.target == "to"]
    assert out.dtype == torch.float32
