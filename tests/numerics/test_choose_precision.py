"""fxquant.numerics.choose_precision: int8, bf16 or fp32 per node under two budgets (issue 31).

The model plants the answer: fc2 holds one outlier weight reading an input that is always
0, so per-tensor int8 weights ruin fc2 (its other weights round to 0) while bfloat16 and
float32 keep it; fc1 and fc3 quantize well. The timings are given where the answer must
not depend on this machine's speed, measured where the test is about the measuring.
"""

from __future__ import annotations

import json

import pytest
import torch
from fxquant import BackendConfig, DTypeConfig, QConfigMapping
from fxquant.config.defaults import default_qconfig
from fxquant.errors import ConfigError
from fxquant.numerics import choose_precision
from fxquant.patterns import linear_configs
from torch import nn

BF16 = torch.bfloat16
INT8 = DTypeConfig(
    input_dtype=torch.uint8,
    output_dtype=torch.uint8,
    weight_dtype=torch.int8,
    bias_dtype=torch.float,
)
GEMM_BF16 = DTypeConfig(
    input_dtype=BF16, output_dtype=BF16, weight_dtype=BF16, bias_dtype=torch.float
)
NODES = ("fc1", "fc2", "fc3")
# int8 fastest, then bf16, then fp32 (an AMX CPU's order at BERT's shapes)
TIMINGS = {name: {"int8": 1.0, "bf16": 2.0, "fp32": 4.0} for name in NODES}


class Planted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 8)
        with torch.no_grad():
            self.fc1.weight[0], self.fc1.bias[0] = 0.0, 0.0  # fc2's input 0 is always 0
            self.fc2.weight[0, 0] = 100.0  # read by nothing, yet int8's per-tensor scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.fc2(self.fc1(x)))


def backend(bf16: bool) -> BackendConfig:
    offered = [INT8, GEMM_BF16] if bf16 else [INT8]
    return BackendConfig("planted").set_backend_pattern_configs(linear_configs(offered))


def choose(bf16: bool, **options: object) -> object:
    data = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    mapping = QConfigMapping().set_global(default_qconfig)
    return choose_precision(
        Planted().eval(), mapping, (data[0],), data, 0.99,
        backend_config=backend(bf16), lowered=False, **options,
    )  # fmt: skip


def precisions(result: object) -> dict[str, str]:
    return {c.node: c.precision for c in result.choices}  # type: ignore[attr-defined]  # a PrecisionResult


def test_the_node_int8_ruins_gets_bf16_where_the_backend_offers_it() -> None:
    result = choose(bf16=True, timings=TIMINGS)
    assert precisions(result) == {"fc1": "int8", "fc2": "bf16", "fc3": "int8"}
    assert result.met_accuracy
    fc2 = next(c for c in result.choices if c.node == "fc2")
    assert "int8 misses the accuracy budget" in fc2.why
    assert "bf16 meets it" in fc2.why
    assert fc2.ms == {"int8": 1.0, "bf16": 2.0, "fp32": 4.0}
    assert result.latency_ms == pytest.approx(1.0 + 2.0 + 1.0)


def test_without_bf16_the_node_int8_ruins_gets_fp32() -> None:
    result = choose(bf16=False, timings={n: {"int8": 1.0, "fp32": 4.0} for n in NODES})
    assert precisions(result) == {"fc1": "int8", "fc2": "fp32", "fc3": "int8"}
    assert result.met_accuracy
    assert all("bf16" not in c.ms for c in result.choices)


def test_a_precision_faster_than_int8_is_where_a_node_starts() -> None:
    # where bf16 measures faster than int8 (small GEMMs: the quantize step costs more than
    # the GEMM saves), every node starts in bf16, and bf16 already meets the budget
    timings = {n: {"int8": 3.0, "bf16": 2.0, "fp32": 4.0} for n in NODES}
    result = choose(bf16=True, timings=timings)
    assert precisions(result) == dict.fromkeys(NODES, "bf16")
    assert all(c.why.startswith("the fastest measured (bf16") for c in result.choices)


def test_a_latency_budget_below_the_fastest_choice_says_it_cannot_be_met() -> None:
    result = choose(bf16=True, timings=TIMINGS, max_latency_ms=2.5)
    assert not result.met_latency
    assert not result.met
    assert "latency budget cannot be met: even every node at its fastest precision takes " \
        "3.000 ms > 2.5 ms" in result.verdict  # fmt: skip


def test_budgets_that_trade_against_each_other_say_both_cannot_hold() -> None:
    # all int8 (3 ms) fits 3.5 ms but misses the accuracy; the accuracy needs 4 ms
    result = choose(bf16=True, timings=TIMINGS, max_latency_ms=3.5)
    assert result.met_accuracy
    assert not result.met_latency
    assert "the two budgets cannot both hold" in result.verdict
    assert "4.000 ms > 3.5 ms" in result.verdict


def test_both_budgets_met_and_the_table_shows_every_node_with_its_timings() -> None:
    result = choose(bf16=True, timings=TIMINGS, max_latency_ms=4.0)
    assert result.met
    lines = str(result).splitlines()
    assert lines[0].split() == ["node", "int8", "ms", "bf16", "ms", "fp32", "ms", "chosen", "why"]
    assert lines[2].split()[:5] == ["fc2", "1.000", "2.000", "4.000", "bf16"]
    assert lines[-1].startswith("accuracy budget met")
    plain = json.loads(json.dumps(result.to_dict()))
    assert plain["met"] is True
    assert [c["precision"] for c in plain["choices"]] == ["int8", "bf16", "int8"]


def test_timings_measured_on_the_captured_inputs_give_every_node_every_precision() -> None:
    result = choose(bf16=True, repeats=3)
    for choice in result.choices:
        assert set(choice.ms) == {"int8", "bf16", "fp32"}
        assert all(ms > 0 for ms in choice.ms.values())
    assert result.latency_ms > 0
    assert result.met_accuracy  # whatever is fastest here, fc2 ends in bf16 or fp32
    assert precisions(result)["fc2"] in ("bf16", "fp32")


def test_the_mapping_chosen_reproduces_the_choice() -> None:
    result = choose(bf16=True, timings=TIMINGS)
    mapping = result.qconfig_mapping
    assert mapping.qconfig_for("fc2", nn.Linear).activation().dtype == BF16
    assert mapping.qconfig_for("fc1", nn.Linear) == default_qconfig


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "5ms", True])
def test_a_latency_budget_that_is_not_a_positive_number_names_the_argument(value: object) -> None:
    with pytest.raises(ConfigError, match=r"max_latency_ms must be None or a positive number"):
        choose(bf16=True, timings=TIMINGS, max_latency_ms=value)


def test_timings_lacking_a_precision_name_the_node_and_the_precision() -> None:
    timings = {**TIMINGS, "fc2": {"int8": 1.0, "fp32": 4.0}}
    with pytest.raises(ConfigError, match=r"timings\['fc2'\] lacks bf16"):
        choose(bf16=True, timings=timings)
