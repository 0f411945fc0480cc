"""The ``torch.distributed`` side of :mod:`fxquant_distributed`: groups, checks, reductions.

Everything here is collective: every rank of the group calls the same
functions in the same order with tensors of the same shapes. The checks
(:func:`require_same`) reduce a fingerprint instead of gathering Python
objects, so a mismatch raises on every rank at once and no rank is left
waiting in a later collective.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from fxquant.errors import ConfigError

__all__ = [
    "GroupReducer",
    "GroupRef",
    "all_gather_differentiable",
    "all_reduce_min",
    "all_reduce_sum",
    "collective_device",
    "fingerprint",
    "min_max",
    "require_initialized",
    "require_same",
    "world_size",
]

# a 62-bit digest: negating it in an int64 all-reduce never overflows
_DIGEST_BITS = 62


class GroupRef:
    """A process group (``None``: the default one) that model copies share.

    ``torch.distributed``'s process groups cannot be pickled or deep-copied, and
    ``convert_fx`` deep-copies the model: a module keeps its group behind this
    reference, which a deep copy shares instead of copying.

    Example:
        >>> import copy
        >>> ref = GroupRef(None)
        >>> copy.deepcopy(ref) is ref, ref.group is None
        (True, True)
    """

    def __init__(self, group: Any) -> None:
        self.group = group

    def __deepcopy__(self, memo: dict[int, Any]) -> GroupRef:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        if self.group is not None:
            msg = (
                "a module synchronized over an explicit process group cannot be pickled "
                "(process groups belong to their processes); save its state_dict() instead"
            )
            raise TypeError(msg)
        return (GroupRef, (None,))


def require_initialized(what: str) -> None:
    """Raise a clear error unless ``torch.distributed`` is available and initialized.

    Example:
        >>> require_initialized("sync_observers")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: sync_observers needs an initialized process group; ...
    """
    if not dist.is_available():
        msg = f"{what} needs torch.distributed, which this build of torch does not include"
        raise ConfigError(msg)
    if not dist.is_initialized():
        msg = (
            f"{what} needs an initialized process group; call "
            "torch.distributed.init_process_group(...) in every process first (torchrun sets "
            "the environment for init_process_group('gloo') or ('nccl'); see docs/distributed.md)"
        )
        raise ConfigError(msg)


def world_size(group: Any) -> int:
    """Ranks in ``group`` (``None``: the default group); 1 when torch.distributed is not in use.

    Example:
        >>> world_size(None)  # no process group in a doctest
        1
    """
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return int(dist.get_world_size(group))


def collective_device(group: Any) -> torch.device:
    """Where a tensor made only to be reduced lives: the GPU for NCCL, else the CPU.

    Example:
        >>> collective_device(None)  # doctest: +SKIP
        device(type='cpu')
    """
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """The elementwise sum of ``tensor`` over the group, as a new tensor.

    Example:
        >>> all_reduce_sum(torch.ones(2), None)  # doctest: +SKIP
        tensor([2., 2.])
    """
    out = tensor.detach().clone().contiguous()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def all_reduce_min(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """The elementwise minimum of ``tensor`` over the group, as a new tensor.

    Example:
        >>> all_reduce_min(torch.tensor([float(dist.get_rank())]), None)  # doctest: +SKIP
        tensor([0.])
    """
    out = tensor.detach().clone().contiguous()
    dist.all_reduce(out, op=dist.ReduceOp.MIN, group=group)
    return out


def min_max(low: torch.Tensor, high: torch.Tensor, group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise min of ``low`` and max of ``high`` over the group, in one all-reduce.

    ``max(high) == -min(-high)``: both halves ride in one MIN reduction.

    Example:
        >>> min_max(torch.tensor(-1.0), torch.tensor(2.0), None)  # doctest: +SKIP
        (tensor(-3.), tensor(5.))
    """
    count = low.numel()
    packed = torch.cat([low.detach().reshape(-1), -high.detach().reshape(-1).to(low.dtype)])
    reduced = all_reduce_min(packed, group)
    return reduced[:count].reshape(low.shape), (-reduced[count:]).reshape(high.shape)


class _AllGather(torch.autograd.Function):
    """Every rank's tensor, stacked; the backward sums each rank's slice over the ranks."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor.detach().contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # every rank's loss depends on this rank's slice: their gradients add up
        return all_reduce_sum(grad, ctx.group)[ctx.rank], None


def all_gather_differentiable(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``tensor`` stacked in rank order; gradients flow back to each rank's own.

    Example:
        >>> stacked = all_gather_differentiable(torch.ones(3), None)  # doctest: +SKIP
        >>> stacked.shape  # doctest: +SKIP
        torch.Size([2, 3])
    """
    result: torch.Tensor = _AllGather.apply(tensor, group)  # type: ignore[no-untyped-call]  # torch leaves Function.apply untyped
    return result


class GroupReducer:
    """:class:`fxquant.observer.BatchReducer` over a process group: one all-reduce a call.

    A copy of an observer (``copy.deepcopy``, pickling) is not part of the mode
    that set this reducer: the copy gets ``None`` instead.

    Example:
        >>> import copy
        >>> copy.deepcopy(GroupReducer(GroupRef(None))) is None
        True
    """

    def __init__(self, group: GroupRef) -> None:
        self.group = group

    def min_max(self, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Elementwise minimum of ``low`` and maximum of ``high`` over the ranks."""
        return min_max(low, high, self.group.group)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of ``values`` over the ranks."""
        return all_reduce_sum(values, self.group.group)

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(None), ())


def fingerprint(parts: Sequence[str], tensors: Sequence[torch.Tensor] = ()) -> int:
    """A 62-bit digest of ``parts`` and the bytes of ``tensors`` (shape and dtype included).

    Example:
        >>> fingerprint(["a"]) == fingerprint(["a"]) != fingerprint(["b"])
        True
    """
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    for tensor in tensors:
        # a copy: numpy() of the tensor itself would make its storage unresizable for good,
        # and per-channel observers resize theirs on their first batch
        plain = tensor.detach().to("cpu", copy=True).contiguous()
        digest.update(f"{plain.dtype}{tuple(plain.shape)}".encode())
        digest.update(plain.reshape(-1).view(torch.uint8).numpy().tobytes())
    return int.from_bytes(digest.digest()[:8], "little") >> (64 - _DIGEST_BITS)


def require_same(value: int, group: Any, message: str) -> None:
    """Raise ``ConfigError(message)`` on every rank unless all ranks pass the same ``value``.

    Example:
        >>> require_same(7, None, "ranks differ")  # doctest: +SKIP
    """
    packed = torch.tensor([value, -value], dtype=torch.int64, device=collective_device(group))
    reduced = all_reduce_min(packed, group)
    if int(reduced[0]) != -int(reduced[1]):
        raise ConfigError(message)
