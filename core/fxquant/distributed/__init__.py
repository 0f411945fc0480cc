"""Calibration and QAT over several processes (``torch.distributed``, DDP, ``torchrun``).

Sharded post-training calibration: every rank calibrates its shard of the
data with no communication, then :func:`sync_observers` merges the observers'
statistics (a handful of bucketed all-reduces) so that every rank holds the
same observers and ``convert_fx`` gives the same model everywhere::

    prepared = fxquant.prepare_fx(model, mapping, example_inputs)
    for batch in my_shard:
        prepared(batch)
    fxquant.distributed.sync_observers(prepared)
    quantized = fxquant.convert_fx(prepared)

Quantization-aware training under ``DistributedDataParallel``::

    prepared = fxquant.prepare_qat_fx(model, mapping, example_inputs)
    prepared = fxquant.distributed.convert_sync_batchnorm(prepared)  # BN over the global batch
    ddp = torch.nn.parallel.DistributedDataParallel(prepared)
    with fxquant.distributed.observe_global_batch(ddp):  # identical observers at every step
        train(ddp, my_shard)
    quantized = fxquant.convert_fx(fxquant.distributed.revert_sync_batchnorm(ddp.module))

What each step guarantees, and what it costs, is in docs/distributed.md; the
two-process tests in tests/distributed run every example above.
"""

from __future__ import annotations

from fxquant.distributed.batchnorm import (
    SyncBatchNorm,
    convert_sync_batchnorm,
    revert_sync_batchnorm,
)
from fxquant.distributed.global_batch import GlobalBatchObservation, observe_global_batch
from fxquant.distributed.merge import sync_observers

__all__ = [
    "GlobalBatchObservation",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "observe_global_batch",
    "revert_sync_batchnorm",
    "sync_observers",
]
