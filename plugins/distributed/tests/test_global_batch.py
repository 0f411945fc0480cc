"""Observers in global-batch mode equal one observer fed the peers' batches concatenated.

The peers are threads (distributed_peers.py) so hypothesis can vary the
data, the shard sizes (empty shards included) and the observer settings; the
two-process tests run the same mode over gloo.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from distributed_peers import PeerReducer, run_peers
from fxquant.numerics import fake_quantize as fxfq
from fxquant.numerics import observer as fxobs
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import nn

CHANNELS = 3
OBSERVERS: dict[str, Callable[[], nn.Module]] = {
    "min_max": lambda: fxobs.MinMaxObserver(),
    "min_max_symmetric_int8": lambda: fxobs.MinMaxObserver(
        dtype=torch.int8, qscheme="per_tensor_symmetric"
    ),
    "moving_average": lambda: fxobs.MovingAverageMinMaxObserver(averaging_constant=0.3),
    "per_channel": lambda: fxobs.PerChannelMinMaxObserver(ch_axis=1),
    "moving_average_per_channel": lambda: fxobs.MovingAveragePerChannelMinMaxObserver(
        averaging_constant=0.3, ch_axis=-1, dtype=torch.int8, qscheme="per_channel_symmetric"
    ),
    "histogram": lambda: fxobs.HistogramObserver(bins=64),
}

# a step: each peer's rows (possibly none) of a (rows, CHANNELS) batch
rows = st.lists(
    st.lists(st.floats(-1e3, 1e3, width=32), min_size=CHANNELS, max_size=CHANNELS),
    max_size=6,
)
steps = st.lists(st.tuples(rows, rows, rows), min_size=1, max_size=5)


def batch(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).reshape(-1, CHANNELS)


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: buffer.clone() for name, buffer in module.named_buffers()}


def assert_same_state(actual: nn.Module, expected: nn.Module) -> None:
    want = state(expected)
    got = state(actual)
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(got[name], value), f"{name}: {got[name]} != {value}"


def one_process(make: Callable[[], nn.Module], data: list[Any]) -> tuple[nn.Module, list[Any]]:
    """One module fed every step's batches concatenated; its outputs per step."""
    module = make()
    outputs = [module(torch.cat([batch(part) for part in step])) for step in data]
    return module, outputs


def as_peers(make: Callable[[], nn.Module], data: list[Any]) -> list[tuple[nn.Module, list[Any]]]:
    """Three peers, each fed its part of every step, reducing through threads."""

    def peer(rank: int, reducer: PeerReducer) -> tuple[nn.Module, list[Any]]:
        module = make()
        for observer in module.modules():
            if isinstance(observer, fxobs.ObserverBase):
                observer._batch_reducer = reducer
        outputs = [module(batch(step[rank])) for step in data]
        for observer in module.modules():
            if isinstance(observer, fxobs.ObserverBase):
                observer._batch_reducer = None
        return module, outputs

    return run_peers(3, peer)


@pytest.mark.parametrize("kind", sorted(OBSERVERS))
@given(data=steps)
def test_observers_fed_shards_with_a_reducer_equal_one_observer_fed_the_whole_batch(
    kind: str, data: list[Any]
) -> None:
    expected, _ = one_process(OBSERVERS[kind], data)
    for module, _ in as_peers(OBSERVERS[kind], data):
        assert_same_state(module, expected)
        if expected.min_val.numel() > 0:  # type: ignore[operator]
            got, want = module.calculate_qparams(), expected.calculate_qparams()  # type: ignore[operator]
            assert torch.equal(got[0], want[0])
            assert torch.equal(got[1], want[1])


FAKE_QUANTIZE: dict[str, Callable[[], nn.Module]] = {
    "fake_quant": fxfq.default_fake_quant,
    "fake_quant_per_channel": lambda: fxfq.FakeQuantize(
        observer=fxobs.MovingAveragePerChannelMinMaxObserver,
        quant_min=-128,
        quant_max=127,
        dtype=torch.int8,
        qscheme="per_channel_symmetric",
        ch_axis=1,
    ),
    "fused": fxfq.default_fused_act_fake_quant,
    "fused_symmetric": fxfq.default_fused_wt_fake_quant,
    # the fused kernel takes channels on axis 0 only (weights): rows are then the batch's columns
    "fused_per_channel": lambda: ChannelsFirst(fxfq.default_fused_per_channel_wt_fake_quant()),
}


class ChannelsFirst(nn.Module):
    """``module`` applied to the transposed batch: (CHANNELS, rows) in, (rows, CHANNELS) out."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.t()).t()


@pytest.mark.parametrize("kind", sorted(FAKE_QUANTIZE))
@given(data=steps)
def test_fake_quantize_on_shards_outputs_the_slices_of_one_module_on_the_whole_batch(
    kind: str, data: list[Any]
) -> None:
    """Same scale and zero point at every step on every peer: QAT under DDP relies on it."""
    # one process cannot fake-quantize per channel before it has seen a channel either
    assume(any(data[0]) or "per_channel" not in kind)
    expected, expected_outputs = one_process(FAKE_QUANTIZE[kind], data)
    peers = as_peers(FAKE_QUANTIZE[kind], data)
    for rank, (module, outputs) in enumerate(peers):
        assert_same_state(module, expected)
        for step, (got, want) in enumerate(zip(outputs, expected_outputs, strict=True)):
            start = sum(len(data[step][r]) for r in range(rank))
            assert torch.equal(got, want[start : start + len(got)])


def test_an_observer_without_a_reducer_makes_no_collective_call() -> None:
    """The reducer is only consulted while set: plain calibration keeps its old cost."""

    def peer(rank: int, reducer: PeerReducer) -> int:
        observer = fxobs.HistogramObserver(bins=8)
        observer(torch.randn(4))  # no reducer: must not wait for the other peer
        observer._batch_reducer = reducer
        observer(torch.randn(4))
        observer(torch.empty(0) if rank == 0 else torch.randn(4))  # empty: still takes part
        observer(torch.empty(0))  # empty everywhere: the range says so, no counts to add
        return reducer.calls

    assert run_peers(2, peer) == [5, 5]  # range and counts, twice; then the range alone


def test_copies_of_an_observer_in_global_batch_mode_are_not_in_it() -> None:
    from fxquant_distributed.collectives import GroupReducer, GroupRef

    observer = fxobs.MinMaxObserver()
    observer._batch_reducer = GroupReducer(GroupRef(None))
    assert copy.deepcopy(observer)._batch_reducer is None
    assert observer._batch_reducer is not None
