"""Batch normalization over the global batch, on any device and backend (gloo on CPU included).

``torch.nn.SyncBatchNorm`` refuses CPU tensors (and DDP refuses CPU modules
that hold one), so QAT under DDP on CPU could not synchronize BatchNorm. This
``SyncBatchNorm`` computes the same thing with one differentiable all-gather:

    x (this rank's batch) -> per channel: mean, sum of squared deviations, count
                          -> all-gather -> Chan's formula -> global mean and variance
    y = (x - mean) / sqrt(var + eps) * weight + bias       (running stats: unbiased var)

The all-gather's backward is one all-reduce, so gradients reach every rank's
input and a DDP step equals one process's step on the concatenated batch (as
torch's: one collective forward, one backward). In eval mode (or alone) it is
plain BatchNorm. ``convert_sync_batchnorm`` swaps it in for every
``BatchNorm1d/2d/3d``, the ones inside fused QAT modules (``ConvBn2d``...)
included, sharing parameters and buffers; ``revert_sync_batchnorm`` swaps the
originals back.
"""

from __future__ import annotations

from typing import Any

import torch
from fxquant.errors import ConfigTypeError
from torch import nn

from fxquant_distributed.collectives import GroupRef, all_gather_differentiable, world_size

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm", "revert_sync_batchnorm"]

_BatchNorm = nn.modules.batchnorm._BatchNorm
_CONVERTED = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class SyncBatchNorm(_BatchNorm):
    """BatchNorm whose training statistics are the global batch's (every rank's batch).

    Args:
        num_features: channels (dimension 1 of the input).
        eps: added to the variance.
        momentum: running statistics' update factor (``None``: cumulative average).
        affine: learn ``weight`` and ``bias``.
        track_running_stats: keep running mean and variance.
        group: the process group (``None``: the default one).
        batch_norm_type: the BatchNorm class this one stands for (``nn.BatchNorm2d``
            by default): its input-shape check, and what :func:`revert_sync_batchnorm`
            restores.
        device: the parameters' device.
        dtype: the parameters' dtype.

    Example:
        >>> bn = SyncBatchNorm(3)  # no process group: an ordinary BatchNorm2d
        >>> x = torch.randn(4, 3, 2, 2)
        >>> torch.allclose(bn(x), nn.BatchNorm2d(3)(x))
        True
    """

    def __init__(  # noqa: PLR0913  # BatchNorm's arguments plus the group and the type it stands for
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        group: Any = None,
        batch_norm_type: type[_BatchNorm] = nn.BatchNorm2d,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype
        )
        if not (isinstance(batch_norm_type, type) and issubclass(batch_norm_type, _CONVERTED)):
            msg = (
                f"batch_norm_type must be nn.BatchNorm1d, nn.BatchNorm2d or nn.BatchNorm3d, "
                f"got {batch_norm_type!r}"
            )
            raise ConfigTypeError(msg)
        self.batch_norm_type = batch_norm_type
        self._group = GroupRef(group)

    @property
    def group(self) -> Any:
        """The process group the statistics are reduced over (``None``: the default one)."""
        return self._group.group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        # each BatchNormNd checks only the input's rank; self stands in for one
        self.batch_norm_type._check_input_dim(self, input)  # type: ignore[arg-type]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize with the global batch's statistics in training, else as BatchNorm does."""
        self._check_input_dim(input)
        if not self.training or world_size(self.group) == 1:
            return super().forward(input)
        factor = self._update_factor()
        mean, var, count = _global_moments(input, self.group)
        if self.track_running_stats:
            assert self.running_mean is not None  # registered when tracking (BatchNorm's init)
            assert self.running_var is not None
            with torch.no_grad():
                unbiased = var.detach() * (count / (count - 1))
                self.running_mean.mul_(1 - factor).add_(
                    mean.detach().to(self.running_mean), alpha=factor
                )
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var), alpha=factor)
        shape = [1, -1] + [1] * (input.dim() - 2)
        out = (input - mean.reshape(shape)) * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    def _update_factor(self) -> float:
        """The running statistics' factor for this step, counting it (as ``_BatchNorm`` does)."""
        if not self.track_running_stats:
            return 0.0
        assert self.num_batches_tracked is not None  # registered when tracking
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return float(self.momentum)

    def extra_repr(self) -> str:
        base: str = super().extra_repr()  # type: ignore[no-untyped-call]  # torch leaves it untyped
        return f"{base}, batch_norm_type={self.batch_norm_type.__name__}"


def _global_moments(x: torch.Tensor, group: Any) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mean and biased variance per channel over every rank's ``x``, and the global count.

    Each rank's mean and sum of squared deviations (two passes: no cancellation),
    gathered in one collective and combined with Chan's pairwise formula.
    """
    dims = [0, *range(2, x.dim())]
    local_count = x.numel() // max(x.shape[1], 1)
    local_mean = x.sum(dims) / max(local_count, 1)  # an empty batch contributes zeros
    centered = x - local_mean.reshape([1, -1] + [1] * (x.dim() - 2))
    local = torch.cat(
        [
            local_mean.double(),
            (centered * centered).sum(dims).double(),
            # float64: counts stay exact past 2**24 values per channel
            x.new_tensor([local_count], dtype=torch.float64),
        ]
    )
    gathered = all_gather_differentiable(local, group)  # (ranks, 2 * channels + 1)
    channels = x.shape[1]
    means, squares = gathered[:, :channels], gathered[:, channels : 2 * channels]
    counts = gathered[:, -1:]
    count = float(counts.detach().sum())
    if count <= 1:
        msg = (
            f"Expected more than 1 value per channel when training over all ranks, got {count:.0f} "
            f"(this rank's input: {tuple(x.shape)})"
        )
        raise ValueError(msg)
    mean = (counts * means).sum(0) / count
    deviation = means - mean
    var = (squares + counts * deviation * deviation).sum(0) / count
    return mean.to(x.dtype), var.to(x.dtype), count


def _swap(module: nn.Module, replace: Any) -> nn.Module:
    """``module`` with ``replace(child)`` swapped in for every descendant it answers for."""
    swapped = replace(module)
    if swapped is not None:
        return swapped  # type: ignore[no-any-return]  # replace returns modules
    for name, child in module.named_children():
        new = _swap(child, replace)
        if new is not child:
            setattr(module, name, new)
    return module


def _share_state(source: _BatchNorm, target: _BatchNorm) -> _BatchNorm:
    """``target`` with ``source``'s parameters and buffers (the same tensors) and mode."""
    if source.affine:
        target.weight = source.weight
        target.bias = source.bias
    if source.track_running_stats:
        target.running_mean = source.running_mean
        target.running_var = source.running_var
        target.num_batches_tracked = source.num_batches_tracked
    if hasattr(source, "qconfig"):
        target.qconfig = source.qconfig
    return target.train(source.training)


def convert_sync_batchnorm(model: nn.Module, group: Any = None) -> nn.Module:
    """Swap every ``BatchNorm1d/2d/3d`` in ``model`` for a :class:`SyncBatchNorm`, in place.

    Like ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``, on CPU too: the
    BatchNorm inside fused QAT modules (``ConvBn2d``, ``ConvBnReLU2d``,
    ``LinearBn1d``...) and standalone ones alike. Parameters and buffers are the
    same tensors (an optimizer built before keeps working). ``convert_fx`` folds
    the ones in fused modules; call :func:`revert_sync_batchnorm` first when the
    model has standalone BatchNorm layers, which backends match by their class.

    Args:
        model: a module, typically from ``prepare_qat_fx``, before wrapping it in DDP.
        group: the process group to reduce statistics over (``None``: the default).

    Returns:
        ``model`` (or the new module when ``model`` itself is a BatchNorm).

    Example:
        >>> net = convert_sync_batchnorm(nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2)))
        >>> type(net[1]).__name__, net[1].batch_norm_type.__name__
        ('SyncBatchNorm', 'BatchNorm2d')
    """

    def replace(module: nn.Module) -> nn.Module | None:
        if type(module) not in _CONVERTED:
            return None
        bn: Any = module
        sync = SyncBatchNorm(
            bn.num_features,
            bn.eps,
            bn.momentum,
            bn.affine,
            bn.track_running_stats,
            group=group,
            batch_norm_type=type(bn),
        )
        return _share_state(bn, sync)

    return _swap(model, replace)


def revert_sync_batchnorm(model: nn.Module) -> nn.Module:
    """Swap every :class:`SyncBatchNorm` back to the BatchNorm class it stands for, in place.

    Args:
        model: a module after :func:`convert_sync_batchnorm` (``ddp.module`` after training).

    Returns:
        ``model`` (or the new module when ``model`` itself is a ``SyncBatchNorm``).

    Example:
        >>> net = convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(2)))
        >>> type(revert_sync_batchnorm(net)[0]).__name__
        'BatchNorm1d'
    """

    def replace(module: nn.Module) -> nn.Module | None:
        if not isinstance(module, SyncBatchNorm):
            return None
        bn = module.batch_norm_type(
            module.num_features,
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
        )
        return _share_state(module, bn)

    return _swap(model, replace)
