from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
from fxquant.config.pattern import MatchAllNode, simple_to_complex
from fxquant.flow import match as match_module
from fxquant.flow.match import PatternIndex, match_graph
from torch import fx, nn


class ConvAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.relu = nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1), nn.ReLU()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)) + y)


def test_longer_pattern_wins_over_its_suffix() -> None:
    gm = fx.symbolic_trace(nn.Sequential(nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1), nn.ReLU()))
    index = PatternIndex.build(
        [(nn.ReLU, "relu"), (simple_to_complex((nn.Conv2d, nn.BatchNorm2d, nn.ReLU)), "cbr")]
    )
    matches = match_graph(gm, index)
    assert {m.payload for m in matches.values()} == {"cbr"}
    (match,) = set(matches.values())
    assert [n.name for n in match.nodes] == ["_0", "_1", "_2"]
    assert match.structure == (match.nodes[2], (match.nodes[1], match.nodes[0]))


def test_pattern_index_is_an_identity_keyed_object_with_a_short_repr() -> None:
    entries = [((nn.ReLU, nn.Conv2d), "conv-relu"), (nn.Conv2d, "conv")]
    index, twin = PatternIndex.build(entries), PatternIndex.build(entries)
    assert {index: "a", twin: "b"}[index] == "a"  # hashable, and two builds stay apart
    assert index != twin
    assert repr(index).startswith("<fxquant.flow.match.PatternIndex object at 0x")


def test_complex_pattern_with_match_all_node_binds_but_does_not_claim_it() -> None:
    gm = fx.symbolic_trace(ConvAdd())
    pattern = (nn.ReLU, (operator.add, (nn.BatchNorm2d, nn.Conv2d), MatchAllNode))
    (match,) = set(match_graph(gm, PatternIndex.build([(pattern, "p")])).values())
    assert [n.name for n in match.nodes] == ["conv", "bn", "add", "relu"]
    assert match.anchor.name == "relu"
    assert match.bindings[4].name == "y"


def test_intermediate_node_with_an_outside_user_breaks_the_match() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.relu = nn.Conv2d(1, 1, 1), nn.ReLU()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.conv(x)
            return self.relu(y), y

    index = PatternIndex.build([((nn.ReLU, nn.Conv2d), "conv-relu"), (nn.Conv2d, "conv")])
    payloads = {n.name: m.payload for n, m in match_graph(fx.symbolic_trace(M()), index).items()}
    assert payloads == {"conv": "conv"}


def test_functions_and_method_names_match_by_target() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x).relu()

    index = PatternIndex.build([(torch.relu, "f"), ("relu", "m")])
    result = {n.name: m.payload for n, m in match_graph(fx.symbolic_trace(M()), index).items()}
    assert result == {"relu": "f", "relu_1": "m"}


def _chain(n: int) -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    for _ in range(n):
        x = graph.call_function(torch.relu, (graph.call_function(operator.add, (x, 1)),))
    graph.output(x)
    return fx.GraphModule(nn.Module(), graph)


def test_matching_work_grows_linearly_with_graph_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # count pattern-node comparisons, not seconds: the machine is shared
    calls = {"n": 0}
    original = match_module._Matcher.match

    def counting(self: Any, value: object, pattern: object, *, is_anchor: bool) -> Any:
        calls["n"] += 1
        return original(self, value, pattern, is_anchor=is_anchor)

    monkeypatch.setattr(match_module._Matcher, "match", counting)
    index = PatternIndex.build([((torch.relu, (operator.add, MatchAllNode, MatchAllNode)), 1)])
    work = []
    for size in (500, 4000):
        calls["n"] = 0
        gm = _chain(size)
        assert len(match_graph(gm, index)) == len(gm.graph.nodes) - 2
        work.append(calls["n"])
    assert work[1] == 8 * work[0]
