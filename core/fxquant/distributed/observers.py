"""Observers across processes: merge their statistics once, or observe global batches.

:func:`sync_observers` (after sharded calibration) merges each observer's state
over the ranks in three bucketed all-reduces whatever the observer count:

    ranks' states -> MIN of (min_val, -max_val)        min/max and histogram ranges
                  -> SUM of (histograms re-binned       histograms; the ranks'
                     onto the common range, moving      moving averages and how
                     averages where a rank has them)    many ranks have one

:func:`observe_global_batch` (during calibration or QAT) gives every observer a
reducer: each batch's min/max (and histogram counts) are all-reduced before
the observer folds them in, so every rank makes the update one process seeing
all the ranks' batches would make. The guarantees are in docs/distributed.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxquant.distributed.collectives import (
    GroupReducer,
    GroupRef,
    all_reduce_min,
    all_reduce_sum,
    collective_device,
    fingerprint,
    min_max,
    require_initialized,
    require_same,
)
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.fake_quantize import FakeQuantize, FakeQuantizeBase, FusedMovingAvgObsFakeQuantize
from fxquant.observer import (
    FixedQParamsObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    NoopObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
    RecordingObserver,
    ReuseInputObserver,
)

__all__ = ["GlobalBatchObservation", "observe_global_batch", "sync_observers"]

# no state to merge: fixed qparams, dtype carriers, and the debug recorder (its tensors stay local)
_STATELESS = (
    FixedQParamsObserver,
    PlaceholderObserver,
    NoopObserver,
    ReuseInputObserver,
    RecordingObserver,
)
_MOVING_AVERAGE = (MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver)
_MIN_MAX = (MinMaxObserver, PerChannelMinMaxObserver)  # after _MOVING_AVERAGE: its base classes
# forwards known to route their statistics through the observer's reducer
_REDUCING_FORWARDS = {
    cls.forward
    for cls in (
        MinMaxObserver,
        MovingAverageMinMaxObserver,
        PerChannelMinMaxObserver,
        MovingAveragePerChannelMinMaxObserver,
        HistogramObserver,
    )
}
_REDUCING_FAKE_QUANT_FORWARDS = {FakeQuantize.forward, FusedMovingAvgObsFakeQuantize.forward}
_SUPPORTED = (
    "fxquant's MinMaxObserver, MovingAverageMinMaxObserver, PerChannelMinMaxObserver, "
    "MovingAveragePerChannelMinMaxObserver and HistogramObserver (and FakeQuantize modules "
    "around them)"
)


@dataclass(frozen=True, slots=True)
class _Site:
    """An observer with state to merge, found at ``name`` in the model."""

    name: str
    observer: Any  # one of the observer classes above (their buffers are read by name)
    kind: str  # "min_max", "moving_average" or "histogram"

    @property
    def per_channel(self) -> bool:
        return isinstance(self.observer, PerChannelMinMaxObserver)


def _kind(name: str, observer: ObserverBase) -> str | None:
    if isinstance(observer, _STATELESS):
        return None
    if isinstance(observer, HistogramObserver):
        return "histogram"
    if isinstance(observer, _MOVING_AVERAGE):
        return "moving_average"
    if isinstance(observer, _MIN_MAX):
        return "min_max"
    msg = f"cannot synchronize {name!r} ({type(observer).__qualname__}) across ranks; {_SUPPORTED}"
    raise ConfigTypeError(msg)


def _sites(model: nn.Module) -> list[_Site]:
    """Every observer with state, in module order (the same on every rank of the same model)."""
    sites = []
    for name, module in model.named_modules():
        if isinstance(module, ObserverBase):
            kind = _kind(name, module)
            if kind is not None:
                sites.append(_Site(name, module, kind))
        elif isinstance(module, FakeQuantizeBase) and not isinstance(module, FakeQuantize):
            msg = (
                f"cannot synchronize {name!r} ({type(module).__qualname__}) across ranks: "
                f"a fake-quantize module without an observer; {_SUPPORTED}"
            )
            raise ConfigTypeError(msg)
        elif not isinstance(module, FakeQuantize) and callable(
            getattr(module, "calculate_qparams", None)
        ):
            msg = f"cannot synchronize {name!r} ({type(module).__qualname__}); {_SUPPORTED}"
            raise ConfigTypeError(msg)
    return sites


def _structure(sites: Sequence[_Site]) -> list[str]:
    """What must be equal on every rank for the sites to pair up: names, kinds, shapes."""
    parts = []
    for site in sites:
        observer = site.observer
        detail = f"bins={observer.bins}" if site.kind == "histogram" else ""
        if site.per_channel:
            detail = f"ch_axis={observer.ch_axis}"
        parts.append(f"{site.name}|{type(observer).__qualname__}|{observer.min_val.dtype}|{detail}")
    return parts


def _differ(what: str, sites: Sequence[_Site]) -> str:
    return (
        f"{what} differ between the ranks ({len(sites)} observers on this one); build the same "
        "model with the same qconfig mapping on every rank (prepare_fx/prepare_qat_fx with the "
        "same arguments)"
    )


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


def _channel_counts(sites: Sequence[_Site], group: Any) -> dict[str, int]:
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


def _extremes(site: _Site, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
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


def _merge_ranges(sites: Sequence[_Site], counts: dict[str, int], group: Any) -> dict[str, Any]:
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
    sites: Sequence[_Site], counts: dict[str, int], ranges: dict[str, Any], group: Any
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
    sites: Sequence[_Site], ranges: dict[str, Any], sums: dict[str, list[torch.Tensor]]
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
            module.activation_post_process, _STATELESS
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
        >>> sync_observers(prepared)  # doctest: +SKIP
        ['activation_post_process_0', 'activation_post_process_1']
    """
    sites = _sites(model)  # type errors first: the same on every rank, before any collective
    require_initialized("sync_observers")
    require_same(fingerprint(_structure(sites)), group, _differ("the observers", sites))
    counts = _channel_counts(sites, group)
    ranges = _merge_ranges(sites, counts, group)
    sums = _merge_sums(sites, counts, ranges, group)
    _write_back(sites, ranges, sums)
    for fake_quantize in _fake_quantizers(model):
        fake_quantize._refresh_qparams()
    return [site.name for site in sites]


class GlobalBatchObservation:
    """The model's observers folding in global batches; a context manager, ended by ``remove()``.

    Returned by :func:`observe_global_batch`.

    Attributes:
        observers: the names of the observers that reduce their statistics.

    Example:
        >>> handle = observe_global_batch(prepared)  # doctest: +SKIP
        >>> calibrate(prepared, shard)  # doctest: +SKIP
        >>> handle.remove()  # doctest: +SKIP
    """

    def __init__(self, observers: Sequence[tuple[str, ObserverBase]], reducer: Any) -> None:
        self._modules = [module for _, module in observers]
        self._reducer = reducer
        self.observers: tuple[str, ...] = tuple(name for name, _ in observers)
        for module in self._modules:
            module._batch_reducer = reducer

    def remove(self) -> None:
        """Observers go back to folding in their own batch only (idempotent)."""
        for module in self._modules:
            if module._batch_reducer is self._reducer:
                module._batch_reducer = None

    def __enter__(self) -> GlobalBatchObservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def _global_batch_sites(model: nn.Module) -> list[_Site]:
    sites = _sites(model)
    for site in sites:
        if type(site.observer).forward not in _REDUCING_FORWARDS:
            msg = (
                f"{site.name!r} ({type(site.observer).__qualname__}) overrides forward, which "
                f"may not reduce its statistics over the ranks; {_SUPPORTED}"
            )
            raise ConfigTypeError(msg)
        if site.observer._batch_reducer is not None:
            msg = (
                f"{site.name!r} already observes global batches; remove() the first "
                "observe_global_batch before starting another"
            )
            raise ConfigError(msg)
    for name, module in model.named_modules():
        if isinstance(module, FakeQuantize) and type(module).forward not in (
            _REDUCING_FAKE_QUANT_FORWARDS
        ):
            msg = (
                f"{name!r} ({type(module).__qualname__}) overrides FakeQuantize.forward, which "
                f"may observe without its observer's reducer; {_SUPPORTED}"
            )
            raise ConfigTypeError(msg)
    return sites


def _state(model: nn.Module) -> list[torch.Tensor]:
    """Every observer's and fake-quantize module's buffers: the state the updates start from."""
    return [
        buffer
        for module in model.modules()
        if isinstance(module, (ObserverBase, FakeQuantizeBase))
        for buffer in module.buffers(recurse=False)
    ]


def observe_global_batch(model: nn.Module, group: Any = None) -> GlobalBatchObservation:
    """Make every observer fold in the global batch: all ranks' batches of the same step.

    While active, each observer all-reduces its batch statistics before
    updating (min/max: one all-reduce; ``HistogramObserver``: one for the range,
    one for the counts), so every rank makes the same update and the observers
    stay identical on all ranks, equal (bit for bit) to one process observing
    the ranks' batches concatenated: exact for moving averages and histograms
    too, and what QAT under ``DistributedDataParallel`` needs (fake-quantize
    modules then use the same ``scale``/``zero_point`` on every rank at every
    step). Cost: those all-reduces, per observer per forward.

    Every rank must run the same observers in the same order (the same model,
    no rank-dependent control flow), starting from the same state.

    Args:
        model: the prepared model (or a ``DistributedDataParallel`` around it).
        group: the process group; ``None`` is the default group.

    Returns:
        A handle: a context manager, or call ``remove()`` to end the mode.

    Raises:
        ConfigError: torch.distributed is not initialized, the ranks' observers
            differ in structure or state (raised on every rank), or the mode is
            already active on the model.
        ConfigTypeError: an observer or fake-quantize module that would not
            reduce its statistics.

    Example:
        >>> with observe_global_batch(ddp_model):  # doctest: +SKIP
        ...     for x, y in shard:
        ...         train_step(x, y)
    """
    sites = _global_batch_sites(model)
    require_initialized("observe_global_batch")
    require_same(fingerprint(_structure(sites)), group, _differ("the observers", sites))
    require_same(
        fingerprint([], _state(model)),
        group,
        "the observers' states differ between the ranks, and identical updates would keep them "
        "apart; start from the same state: a freshly prepared model, one wrapped in "
        "DistributedDataParallel (it broadcasts rank 0's buffers), or call sync_observers first",
    )
    reducer = GroupReducer(GroupRef(group))
    return GlobalBatchObservation([(site.name, site.observer) for site in sites], reducer)
