"""In-process peers for observers' global-batch mode: threads that reduce through a barrier.

``run_peers(n, fn)`` runs ``fn(rank, reducer)`` on ``n`` threads, where
``reducer`` implements :class:`fxquant.observer.BatchReducer` over the threads
(the role ``torch.distributed`` plays across processes). The observers' side
of ``observe_global_batch`` is then testable in milliseconds, with hypothesis;
plugins/distributed/tests/test_*_ranks.py run the same through real process groups.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class ThreadPeers:
    """``n`` threads exchanging one value each per collective call, in call order."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=30)
        self.slots: list[Any] = [None] * n

    def exchange(self, rank: int, value: Any) -> list[Any]:
        self.slots[rank] = value
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before every peer has read them all
        return values


class PeerReducer:
    """A ``BatchReducer`` over :class:`ThreadPeers`; sums in rank order, like a fixed tree."""

    def __init__(self, peers: ThreadPeers, rank: int) -> None:
        self.peers = peers
        self.rank = rank
        self.calls = 0

    def min_max(self, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        values = self.peers.exchange(self.rank, (low, high))
        lows = torch.stack([value[0] for value in values])
        highs = torch.stack([value[1] for value in values])
        return lows.amin(0), highs.amax(0)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.stack(self.peers.exchange(self.rank, values)).sum(0)


def run_peers(n: int, fn: Callable[[int, PeerReducer], Any]) -> list[Any]:
    """``fn(rank, reducer)`` on ``n`` threads; their results by rank (a failure re-raised)."""
    peers = ThreadPeers(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = fn(rank, PeerReducer(peers, rank))
        except BaseException as error:  # re-raised in the caller's thread below
            errors.append(error)
            peers.barrier.abort()  # the other peers stop waiting for this one

    threads = [threading.Thread(target=target, args=(rank,)) for rank in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results
