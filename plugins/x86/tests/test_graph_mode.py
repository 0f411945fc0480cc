"""x86's default on a bfloat16 CPU: a transformer's attention blocks in bfloat16 (#31).

The ``attention_bf16`` graph mode fills what the user's mapping leaves to x86's default:
on a CPU with AMX-BF16 or AVX512-BF16 every attention block runs as
``attention_bf16_qconfig_mapping`` asks (q, k, v int8 in, bfloat16 out; matmuls, mask,
softmax bfloat16); a block where the user set a node their own way keeps the user's
mapping; without bfloat16 arithmetic, on QAT, and with ``FXQUANT_X86_BF16=0`` nothing
changes. The CPU flags are faked, so every CPU runs both branches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.errors import ConfigError
from fxquant.flow.state import flow_state
from fxquant_x86 import precision
from fxquant_x86.compiled import compile_quantized
from fxquant_x86.qconfig import attention_bf16_qconfig_mapping
from test_attention_bf16 import AMX, AVX2, Encoder, inputs, quantize, sqnr
from torch import fx, nn

BF16_PATTERNS = {
    "Linear (int8 in, bfloat16 out)",
    "F.softmax (bfloat16)",
    "torch.matmul (bfloat16)",
}
MODE_LINE = "mode: attention_bf16 (2 of 2 attention block(s) in bfloat16, this CPU has amx_bf16: "


@pytest.fixture(autouse=True)
def fresh_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(precision.BF16_ENV, raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    fxquant.refresh()  # the real CPU's x86 backend for the tests after these


def on_cpu(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    fxquant.refresh()


def rows(model: fx.GraphModule) -> dict[str, Any]:
    return {row.node: row for row in fxquant.explain(model, show=False).entries()}


def bf16_nodes(model: fx.GraphModule) -> list[str]:
    return sorted(name for name, row in rows(model).items() if row.pattern in BF16_PATTERNS)


def test_the_default_mapping_runs_attention_in_bf16_on_a_bf16_cpu_and_explain_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    torch.manual_seed(0)
    model = Encoder().eval()
    reference = quantize(model, fxquant.get_default_qconfig_mapping("x86"))
    found = rows(reference)
    for block in ("0", "1"):
        for projection in ("query", "key", "value"):
            assert found[f"attention_{block}_{projection}"].pattern == (
                "Linear (int8 in, bfloat16 out)"
            )
        assert found[f"attention_{block}_output"].pattern == "Linear (int8 in, float out)"
    assert found["softmax"].pattern == "F.softmax (bfloat16)"
    assert found["add"].pattern == "operator.add (bfloat16)"  # the additive mask
    assert found["add_1"].status == "float"  # the residual add stays float32
    assert found["norm_0"].status == "float"
    (line,) = [n for n in fxquant.explain(reference, show=False).notes() if "attention_bf16" in n]
    assert line.startswith(MODE_LINE), line
    # what the explicit mapping gives: the same reference model
    explicit = quantize(model, attention_bf16_qconfig_mapping(model))
    with torch.no_grad():
        assert torch.equal(reference(*inputs(9)), explicit(*inputs(9)))


def test_on_a_cpu_without_bf16_arithmetic_the_default_is_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AVX2)
    torch.manual_seed(0)
    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepared = fxquant.prepare_fx(Encoder().eval(), mapping, inputs(0), backend_config=config)
    assert flow_state(prepared).graph_mode is None
    prepared(*inputs(1))
    reference = fxquant.convert_to_reference_fx(prepared)
    assert bf16_nodes(reference) == []
    assert rows(reference)["softmax"].status == "float"


@pytest.mark.parametrize(
    ("flags", "value", "bf16"),
    [(AMX, "0", False), (AVX2, "1", True), (AMX, "1", True)],
    ids=["amx_turned_off", "avx2_turned_on", "amx_said_on"],
)
def test_the_environment_variable_overrides_the_cpu_flags(
    monkeypatch: pytest.MonkeyPatch, flags: frozenset[str], value: str, bf16: bool
) -> None:
    monkeypatch.setenv(precision.BF16_ENV, value)
    on_cpu(monkeypatch, flags)
    assert precision.bf16_accelerated() is bf16
    torch.manual_seed(0)
    reference = quantize(Encoder().eval(), fxquant.get_default_qconfig_mapping("x86"))
    assert bool(bf16_nodes(reference)) is bf16
    notes = fxquant.explain(reference, show=False).notes()
    modes = [n for n in notes if n.startswith("mode: attention_bf16")]
    assert [f"FXQUANT_X86_BF16={value}" in n for n in modes] == ([True] if bf16 else [])


def test_a_bad_environment_value_names_the_variable_and_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(precision.BF16_ENV, "yes")
    with pytest.raises(ConfigError, match=r"FXQUANT_X86_BF16='yes': expected '0' .* or '1'"):
        precision.bf16_accelerated()


# a node of block attention.0 and the user's own qconfig for it: each leaves that block as
# the user's mapping says (float32 attention), and the other block in bf16; the mode's line
# names what the entry covers as the user knows it, never the block's first node (a
# ``x.size(0)`` shape read the user did not write)
NAMED = {
    "module query float": "module 'attention.0.query'",
    "module block float": "module 'attention.0.query'",
    "regex above": "node 'matmul'",  # the regex ends at the block: its Linears are not in it
    "module query as the default": "module 'attention.0.query'",
    "order softmax": "node 'softmax'",
}
USER_ENTRIES = {
    "module query float": lambda m: m.set_module_name("attention.0.query", None),
    "module block float": lambda m: m.set_module_name("attention.0", None),
    "regex above": lambda m: m.set_module_name_regex(r"attention\.0$", None),
    "module query as the default": lambda m: m.set_module_name(
        "attention.0.query", m.global_qconfig
    ),
    "order softmax": lambda m: m.set_module_name_object_type_order(
        "attention.0", F.softmax, 0, fxquant.get_default_qconfig_mapping("x86").global_qconfig
    ),
}


@pytest.mark.parametrize("entry", sorted(USER_ENTRIES))
def test_a_block_the_user_set_a_node_of_keeps_their_mapping_the_other_runs_bf16(
    monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    on_cpu(monkeypatch, AMX)
    mapping = USER_ENTRIES[entry](fxquant.get_default_qconfig_mapping("x86"))
    torch.manual_seed(0)
    reference = quantize(Encoder().eval(), mapping)
    found = bf16_nodes(reference)
    assert [name for name in found if name.startswith("attention_0")] == []
    assert "softmax" not in found
    assert "softmax_1" in found
    note = next(n for n in fxquant.explain(reference, show=False).notes() if "attention_bf16" in n)
    assert "1 of 2 attention block(s) in bfloat16" in note
    said = f"1 left as your mapping says (block 'attention.0': your qconfig for {NAMED[entry]})"
    assert said in note, note


def test_a_users_linear_type_entry_keeps_every_block_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    mapping = fxquant.get_default_qconfig_mapping("x86").set_object_type(nn.Linear, None)
    torch.manual_seed(0)
    reference = quantize(Encoder().eval(), mapping)
    assert bf16_nodes(reference) == []
    assert rows(reference)["attention_0_query"].status == "float"  # the user's None, kept


def test_qat_gets_no_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    on_cpu(monkeypatch, AMX)
    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86", is_qat=True)
    prepared = fxquant.prepare_qat_fx(Encoder().train(), mapping, inputs(0), backend_config=config)
    assert flow_state(prepared).graph_mode is None


def test_the_default_deployment_runs_one_bf16_flash_attention_per_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu(monkeypatch, AMX)
    torch.manual_seed(0)
    model = Encoder().eval()
    reference = quantize(model, fxquant.get_default_qconfig_mapping("x86"))
    compiled = compile_quantized(reference, inputs(0), cpp_wrapper=False)
    flash = "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default("
    assert sum(flash in line for line in compiled.code.splitlines()) == 2
    assert compiled.float_dtype == torch.bfloat16  # float32 SDPA without the mode
    gemms = [line for line in compiled.code.splitlines() if "qlinear_pointwise" in line]
    assert sum("torch.bfloat16" in line for line in gemms) == 2, gemms  # q/k/v, bf16 out
    with torch.no_grad():
        got, expected, want = compiled(*inputs(9)), reference(*inputs(9)), model(*inputs(9))
    assert sqnr(got, expected) >= 35.0
    assert sqnr(got, want) >= 30.0
