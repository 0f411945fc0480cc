from __future__ import annotations

import inspect

import pytest
import torch
from fxquant.config.backend import BackendConfig
from fxquant.config.custom import PrepareCustomConfig
from fxquant.flow.context import FlowContext
from fxquant.flow.state import node_info
from fxquant.flow.trace import UntraceableModelError, trace
from fxquant.registry.resolution import ResolvedBackend
from torch import nn


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent: symbolic tracing cannot follow it
            return x
        return -x


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.gate = Branchy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(torch.relu(self.fc(x)))


def ctx(config: PrepareCustomConfig | None = None) -> FlowContext:
    return FlowContext(
        ResolvedBackend(BackendConfig("b")), prepare_custom_config=config or PrepareCustomConfig()
    )


def test_untraceable_module_error_names_path_line_and_fix() -> None:
    with pytest.raises(UntraceableModelError) as info:
        trace(Outer(), ctx())
    text = str(info.value)
    assert "module 'gate' (Branchy)" in text
    assert "test_trace.py:" in text
    assert "set_non_traceable_module_names(['gate'])" in text


def test_non_traceable_names_and_classes_become_single_calls() -> None:
    by_name = trace(Outer(), ctx(PrepareCustomConfig().set_non_traceable_module_names(["gate"])))
    by_class = trace(
        Outer(), ctx(PrepareCustomConfig().set_non_traceable_module_classes([Branchy]))
    )
    for gm in (by_name, by_class):
        assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["fc", "gate"]


def test_nodes_record_owner_module_and_user_source_line() -> None:
    config = PrepareCustomConfig().set_non_traceable_module_names(["gate"])
    gm = trace(Outer(), ctx(config))
    relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
    fc = next(n for n in gm.graph.nodes if n.target == "fc")
    assert node_info(fc).module_type is nn.Linear
    assert node_info(relu).module_path == ""
    line = inspect.getsourcelines(Outer.forward)[1] + 1
    assert (node_info(relu).source or "").endswith(f"test_trace.py:{line}")


def test_preserved_attributes_survive_tracing() -> None:
    model = Outer()
    model.vocab = ["a", "b"]  # type: ignore[assignment]
    config = PrepareCustomConfig().set_non_traceable_module_names(["gate"])
    gm = trace(model, ctx(config.set_preserved_attributes(["vocab"])))
    assert gm.vocab == ["a", "b"]


def test_tracing_shares_no_container_with_the_users_model() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)))
    gm = trace(model, ctx())
    gm.get_submodule("0").add_module("extra", nn.ReLU())
    assert not hasattr(model[0], "extra")


def test_fxquant_and_torch_ao_fused_modules_stay_single_calls(ao: object) -> None:
    from fxquant.nn.intrinsic import ConvReLU2d

    from tests import oracle

    with oracle.quiet():
        from torch.ao.nn.intrinsic import LinearReLU

        model = nn.Sequential(
            ConvReLU2d(nn.Conv2d(1, 1, 1), nn.ReLU()),
            nn.Flatten(),
            LinearReLU(nn.Linear(4, 4), nn.ReLU()),
        )
    gm = trace(model, ctx())
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"] == ["0", "1", "2"]
