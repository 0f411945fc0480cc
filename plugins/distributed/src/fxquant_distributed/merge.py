"""``sync_observers``: merge the observers' statistics over the ranks after sharded calibration.

Three bucketed all-reduces whatever the observer count (after one digest check
and, with per-channel observers, one of their channel counts):

    ranks' states -> MIN of (min_val, -max_val)        min/max and histogram ranges
                  -> SUM of (histograms re-binned       histograms; the ranks'
                     onto the common range, moving      moving averages and how
                     averages where a rank has them)    many ranks have one

then fake-quantize modules recompute their qparams from the merged state. The
guarantees per observer are in docs/distributed.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from fxquant.errors import ConfigError
from fxquant.numerics.fake_quantize import FakeQuantize
from fxquant.numerics.observer import HistogramObserver
from torch import nn

from fxquant_distributed.collectives import (
    all_reduce_min,
    all_reduce_sum,
    collective_device,
    fingerprint,
    min_max,
    require_initialized,
    require_same,
)
from fxquant_distributed.sites import (
    STATELESS,
    ObserverSite,
    differ_message,
    observer_sites,
    structure,
)

__all__ = ["sync_observers"]


class _Packer:
    """Tensors flattened into one float64 vector for a single all-reduce, and split back."""

    def __init__(self) -> None:
        self.parts: list[torch.Tensor] = []

    def add(self, tensor: torch.Tensor) -> int:
        self.parts.append(tensor.detach().reshape(-1).to(torch.float64))
        return len(self.parts) - 1

    def reduce(self, group: Any, *, minimum: bool) -> list[torch.Tensor]:
        if not self.parts:
            return []
        device = collective_device(group)
        packed = torch.cat([part.to(device) for part in self.parts])
        reduced = all_reduce_min(packed, group) if minimum else all_reduce_sum(packed, group)
        sizes = [part.numel() for part in self.parts]
        return list(torch.split(reduced, sizes))


def _channel_counts(sites: Sequence[ObserverSite], group: Any) -> dict[str, int]:
    """Channels of every per-channel observer, agreed over the ranks (0 where none saw data)."""
    per_channel = [site for site in sites if site.per_channel]
    if not per_channel:
        return {}
    local = torch.tensor([site.observer.min_val.numel() for site in per_channel], dtype=torch.int64)
    # ranks without data have no channels yet; the others must agree on the count
    seen = torch.where(local > 0, local, torch.iinfo(torch.int64).max)
    device = collective_device(group)
    fewest, most = min_max(seen.to(device), local.to(device), group)
    counts = {}
    for site, low, high in zip(per_channel, fewest.tolist(), most.tolist(), strict=True):
        if high > 0 and low != high:
            msg = (
                f"{site.name!r} saw {low} channels on one rank and {high} on another; "
                "per-channel observers must observe tensors of the same channel count"
            )
            raise ConfigError(msg)
        counts[site.name] = high
    return counts


def _extremes(site: ObserverSite, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The site's min/max, with ``inf``/``-inf`` standing for "no data here"."""
    observer = site.observer
    low, high = observer.min_val, observer.max_val
    if site.per_channel and low.numel() == 0:
        low = torch.full((channels,), float("inf"), dtype=low.dtype, device=low.device)
        high = torch.full((channels,), float("-inf"), dtype=high.dtype, device=high.device)
    return low, high


def _has_data(low: torch.Tensor, high: torch.Tensor) -> bool:
    return low.numel() > 0 and not bool(torch.all(low > high))


def _store(observer: Any, low: torch.Tensor, high: torch.Tensor) -> None:
    dtype, device = observer.min_val.dtype, observer.min_val.device
    observer.min_val.resize_(low.shape).copy_(low.to(dtype=dtype, device=device))
    observer.max_val.resize_(high.shape).copy_(high.to(dtype=dtype, device=device))


def _rebinned(observer: HistogramObserver, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """The observer's histogram on its bins over ``[low, high]`` (zeros when it saw nothing)."""
    if not _has_data(observer.min_val, observer.max_val):
        return torch.zeros_like(observer.histogram)
    if bool(observer.min_val == low) and bool(observer.max_val == high):
        return observer.histogram
    # the observer's own re-binning, the one it applies when a batch widens its range
    return observer._rebin(observer.histogram, observer.min_val, observer.max_val, low, high)


def _merge_ranges(
    sites: Sequence[ObserverSite], counts: dict[str, int], group: Any
) -> dict[str, Any]:
    """MIN/MAX of the min/max and histogram sites' ranges; returns name -> (low, high)."""
    packer, index = _Packer(), {}
    for site in sites:
        if site.kind in ("min_max", "histogram"):
            low, high = _extremes(site, counts.get(site.name, 0))
            index[site.name] = (packer.add(low), packer.add(-high), low.shape)
    reduced = packer.reduce(group, minimum=True)
    ranges = {}
    for name, (low_at, high_at, shape) in index.items():
        ranges[name] = (reduced[low_at].reshape(shape), (-reduced[high_at]).reshape(shape))
    return ranges


def _merge_sums(
    sites: Sequence[ObserverSite], counts: dict[str, int], ranges: dict[str, Any], group: Any
) -> dict[str, list[torch.Tensor]]:
    """SUM of the histograms (on the merged range) and of the moving averages, in one bucket."""
    packer, index = _Packer(), {}
    for site in sites:
        observer = site.observer
        if site.kind == "histogram" and _has_data(*ranges[site.name]):
            low, high = (value.to(observer.min_val) for value in ranges[site.name])
            index[site.name] = [packer.add(_rebinned(observer, low, high))]
        elif site.kind == "moving_average":
            low, high = _extremes(site, counts.get(site.name, 0))
            here = _has_data(low, high)
            zero = torch.zeros_like(low)
            index[site.name] = [
                packer.add(low if here else zero),
                packer.add(high if here else zero),
                packer.add(torch.tensor([1.0 if here else 0.0])),
            ]
    reduced = packer.reduce(group, minimum=False)
    return {name: [reduced[at] for at in ats] for name, ats in index.items()}


def _write_back(
    sites: Sequence[ObserverSite], ranges: dict[str, Any], sums: dict[str, list[torch.Tensor]]
) -> None:
    for site in sites:
        observer = site.observer
        if site.kind == "min_max" and _has_data(*ranges[site.name]):
            _store(observer, *ranges[site.name])
        elif site.kind == "histogram" and site.name in sums:
            low, high = (value.to(observer.min_val) for value in ranges[site.name])
            observer._set_state(sums[site.name][0].to(observer.histogram), low, high)
        elif site.kind == "moving_average":
            total_low, total_high, ranks = sums[site.name]
            if float(ranks) > 0:
                shape = (-1,) if site.per_channel else ()
                _store(
                    observer,
                    (total_low / ranks).reshape(shape),
                    (total_high / ranks).reshape(shape),
                )


def _fake_quantizers(model: nn.Module) -> Iterator[FakeQuantize]:
    for module in model.modules():
        if isinstance(module, FakeQuantize) and not isinstance(
            module.activation_post_process, STATELESS
        ):
            yield module


def sync_observers(model: nn.Module, group: Any = None) -> list[str]:
    """Merge every observer's statistics over the ranks of ``group``: the same on every rank.

    Call it on every rank after each rank has calibrated its shard of the data
    (no communication happens during calibration). Afterwards every observer,
    and every fake-quantize module's ``scale``/``zero_point``, is identical on
    all ranks, so ``convert_fx`` gives the same model everywhere:

    - min/max observers (per tensor and per channel): the min of the minima and
      the max of the maxima, exactly what one process calibrating all the shards
      records;
    - ``HistogramObserver``: each rank's histogram re-binned onto the union of
      the ranges (the observer's own re-binning) and summed; qparams come within
      a bin or so of one process's;
    - moving averages: the mean of the ranks' averages (ranks that saw no data
      left out). Not what one process computes (that depends on batch order);
      :func:`observe_global_batch` gives that exactly.

    Histogram counts add up: call it once per calibration, not twice.

    Args:
        model: the prepared model (or a ``DistributedDataParallel`` around it),
            the same on every rank.
        group: the process group; ``None`` is the default group.

    Returns:
        The names of the observers merged, in module order.

    Raises:
        ConfigError: torch.distributed is not initialized, or the ranks' models
            differ (on every rank at once: no rank is left waiting).
        ConfigTypeError: an observer whose state fxquant cannot merge.

    Example:
        On every rank (plugins/distributed/tests/test_calibration_ranks.py runs it on two):

        >>> sync_observers(prepared)  # doctest: +SKIP
        ['activation_post_process_0', 'activation_post_process_1']
    """
    # type errors first: the same on every rank, and raised before any collective
    sites = observer_sites(model)
    require_initialized("sync_observers")
    require_same(fingerprint(structure(sites)), group, differ_message("the observers", sites))
    counts = _channel_counts(sites, group)
    ranges = _merge_ranges(sites, counts, group)
    sums = _merge_sums(sites, counts, ranges, group)
    _write_back(sites, ranges, sums)
    for fake_quantize in _fake_quantizers(model):
        fake_quantize._refresh_qparams()
    return [site.name for site in sites]
