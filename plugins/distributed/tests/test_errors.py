"""Mistakes get clear errors, on every rank at once: nothing waits forever in a collective."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from distributed_ranks import run_ranks
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.numerics import fake_quantize as fxfq
from fxquant.numerics import observer as fxobs
from fxquant_distributed import observe_global_batch, sync_observers
from torch import nn


@pytest.mark.parametrize("function", [sync_observers, observe_global_batch])
def test_without_a_process_group_the_error_says_to_initialize_one(
    function: Callable[..., Any],
) -> None:
    model = nn.Sequential(fxobs.MinMaxObserver())
    with pytest.raises(ConfigError, match=r"init_process_group"):
        function(model)


class LearnedStep(fxfq.FakeQuantizeBase):
    """A fake-quantize module with no observer (a learned step size)."""

    def __init__(self) -> None:
        super().__init__()
        self.step = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.round(x / self.step) * self.step


class Clipping(fxobs.MinMaxObserver):
    """An observer whose own forward would skip the reducer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.min_val.copy_(torch.minimum(self.min_val, x.min().clamp(min=-1)))
        self.max_val.copy_(torch.maximum(self.max_val, x.max().clamp(max=1)))
        return x


class Foreign(nn.Module):
    """Anything with calculate_qparams that fxquant does not know the state of."""

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ones(1), torch.zeros(1)


@pytest.mark.parametrize(
    ("module", "name"),
    [(LearnedStep(), "LearnedStep"), (Foreign(), "Foreign")],
)
def test_modules_whose_state_fxquant_cannot_merge_are_named(module: nn.Module, name: str) -> None:
    model = nn.Sequential(fxobs.MinMaxObserver(), module)
    for function in (sync_observers, observe_global_batch):
        with pytest.raises(ConfigTypeError, match=rf"'1' \({name}\)"):
            function(model)


def test_an_observer_overriding_forward_cannot_observe_global_batches() -> None:
    with pytest.raises(ConfigTypeError, match=r"'0' \(Clipping\) overrides forward"):
        observe_global_batch(nn.Sequential(Clipping()))


def _error(run: Callable[[], Any]) -> str | None:
    try:
        run()
    except (ConfigError, ConfigTypeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def _mismatches(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    found: dict[str, Any] = {}
    extra = {"b": fxobs.MinMaxObserver()} if rank == 1 else {}
    different = nn.ModuleDict({"a": fxobs.MinMaxObserver(), **extra})
    found["structure"] = _error(lambda: sync_observers(different))

    calibrated = nn.ModuleDict({"a": fxobs.MinMaxObserver()})
    calibrated["a"](torch.tensor([float(rank)]))  # each rank saw other data
    found["state"] = _error(lambda: observe_global_batch(calibrated))

    channels = fxobs.PerChannelMinMaxObserver(ch_axis=1)
    channels(torch.randn(2, 3 + rank))
    found["channels"] = _error(lambda: sync_observers(nn.ModuleDict({"c": channels})))

    fresh = nn.ModuleDict({"a": fxobs.MinMaxObserver()})
    with observe_global_batch(fresh):
        found["twice"] = _error(lambda: observe_global_batch(fresh))

    probe = torch.ones(1)
    dist.all_reduce(probe)  # the group still works: no rank is stuck in a collective
    found["after"] = float(probe)
    return found


@pytest.mark.slow
def test_ranks_that_disagree_all_raise_the_same_clear_error() -> None:
    ranks = run_ranks(_mismatches)
    for rank in ranks:
        assert "the observers differ between the ranks" in rank["structure"]
        assert "states differ between the ranks" in rank["state"]
        assert "call sync_observers first" in rank["state"]
        assert "saw 3 channels on one rank and 4 on another" in rank["channels"]
        assert "already observes global batches" in rank["twice"]
        assert rank["after"] == 2.0
