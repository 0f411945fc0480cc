"""Calibration and QAT over several processes (``torch.distributed``, DDP, ``torchrun``).

An optional part of fxquant in a distribution of its own, ``fxquant-distributed``:
no module of the core imports it. ``import fxquant_distributed`` gives this package too
(``fxquant.moved``), and names the distribution to install when it is missing.

Sharded post-training calibration: every rank calibrates its shard of the
data with no communication, then :func:`sync_observers` merges the observers'
statistics (a handful of bucketed all-reduces) so that every rank holds the
same observers and ``convert_fx`` gives the same model everywhere::

    import fxquant_distributed as fxdist

    prepared = fxquant.prepare_fx(model, mapping, example_inputs)
    for batch in my_shard:
        prepared(batch)
    fxdist.sync_observers(prepared)
    quantized = fxquant.convert_fx(prepared)

Quantization-aware training under ``DistributedDataParallel``::

    prepared = fxquant.prepare_qat_fx(model, mapping, example_inputs)
    prepared = fxdist.convert_sync_batchnorm(prepared)  # BN over the global batch
    ddp = torch.nn.parallel.DistributedDataParallel(prepared)
    with fxdist.observe_global_batch(ddp):  # identical observers at every step
        train(ddp, my_shard)
    quantized = fxquant.convert_fx(fxdist.revert_sync_batchnorm(ddp.module))

What each step guarantees, and what it costs, is in docs/distributed.md; the
two-process tests in plugins/distributed/tests run every example above.
"""

from __future__ import annotations

from fxquant_distributed.batchnorm import (
    SyncBatchNorm,
    convert_sync_batchnorm,
    revert_sync_batchnorm,
)
from fxquant_distributed.global_batch import GlobalBatchObservation, observe_global_batch
from fxquant_distributed.merge import sync_observers

__all__ = [
    "GlobalBatchObservation",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "observe_global_batch",
    "revert_sync_batchnorm",
    "sync_observers",
]
