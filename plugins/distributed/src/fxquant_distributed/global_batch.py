"""``observe_global_batch``: observers that fold in every rank's batch of the same step.

While the mode is on, each observer's ``_batch_reducer`` all-reduces its batch
statistics before it folds them in (see :class:`fxquant.observer.BatchReducer`),
so every rank makes the update one process seeing all the ranks' batches would
make. Entering checks, with one digest all-reduce each, that the ranks hold the
same observers in the same state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.numerics.fake_quantize import FakeQuantize, FakeQuantizeBase
from fxquant.numerics.observer import ObserverBase
from torch import nn

from fxquant_distributed.collectives import (
    GroupReducer,
    GroupRef,
    fingerprint,
    require_initialized,
    require_same,
)
from fxquant_distributed.sites import (
    REDUCING_FAKE_QUANT_FORWARDS,
    REDUCING_FORWARDS,
    SUPPORTED,
    ObserverSite,
    differ_message,
    observer_sites,
    structure,
)

__all__ = ["GlobalBatchObservation", "observe_global_batch"]


class GlobalBatchObservation:
    """The model's observers folding in global batches; a context manager, ended by ``remove()``.

    Returned by :func:`observe_global_batch`.

    Attributes:
        observers: the names of the observers that reduce their statistics.

    Example:
        On every rank (plugins/distributed/tests/test_calibration_ranks.py runs it on two):

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


def _global_batch_sites(model: nn.Module) -> list[ObserverSite]:
    sites = observer_sites(model)
    for site in sites:
        if type(site.observer).forward not in REDUCING_FORWARDS:
            msg = (
                f"{site.name!r} ({type(site.observer).__qualname__}) overrides forward, which "
                f"may not reduce its statistics over the ranks; {SUPPORTED}"
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
            REDUCING_FAKE_QUANT_FORWARDS
        ):
            msg = (
                f"{name!r} ({type(module).__qualname__}) overrides FakeQuantize.forward, which "
                f"may observe without its observer's reducer; {SUPPORTED}"
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
        On every rank (plugins/distributed/tests/test_qat_ranks.py runs it on two):

        >>> with observe_global_batch(ddp_model):  # doctest: +SKIP
        ...     for x, y in shard:
        ...         train_step(x, y)
    """
    sites = _global_batch_sites(model)
    require_initialized("observe_global_batch")
    require_same(fingerprint(structure(sites)), group, differ_message("the observers", sites))
    require_same(
        fingerprint([], _state(model)),
        group,
        "the observers' states differ between the ranks, and identical updates would keep them "
        "apart; start from the same state: a freshly prepared model, one wrapped in "
        "DistributedDataParallel (it broadcasts rank 0's buffers), or call sync_observers first",
    )
    reducer = GroupReducer(GroupRef(group))
    return GlobalBatchObservation([(site.name, site.observer) for site in sites], reducer)
