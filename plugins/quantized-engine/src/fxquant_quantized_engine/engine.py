"""The quantized engine switch, and torch's quint8 deprecation warning kept inside kernels."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import TracebackType

import torch

# torch's deprecation warning for quint8/qint8 tensor creation (pytorch/pytorch#184982)
DEPRECATION_MESSAGE = r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized"


_QUINT8: torch.dtype = getattr(torch, "quint8")  # noqa: B009  # deprecated name, looked up once


_QINT8: torch.dtype = getattr(torch, "qint8")  # noqa: B009  # deprecated name, looked up once


_GET_ENGINE: Callable[[], int] = torch._C._get_qengine


_SET_ENGINE: Callable[[int], None] = torch._C._set_qengine


class _Quiet:
    """Filters torch's quantized-tensor deprecation warning (by its exact message).

    torch emits it with TORCH_WARN_ONCE (one call site, Quantizer.cpp): the first
    scope creates a quint8 tensor under the filter so the warning is spent there,
    and later scopes skip ``catch_warnings`` (2.4 us each) unless the user turned on
    ``torch.set_warn_always``, which makes it fire on every call.
    """

    spent = False

    def __enter__(self) -> None:
        self._catch: warnings.catch_warnings[None] | None = None
        if _Quiet.spent and not torch.is_warn_always_enabled():
            return
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("ignore", message=DEPRECATION_MESSAGE, category=UserWarning)
        if not _Quiet.spent:
            torch._empty_affine_quantized([0], scale=1.0, zero_point=0, dtype=_QUINT8)
            _Quiet.spent = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._catch is not None:
            self._catch.__exit__(kind, value, tb)


def _engine_id(name: str) -> int:
    previous = torch.backends.quantized.engine
    try:
        torch.backends.quantized.engine = name
        return int(torch._C._get_qengine())
    finally:
        torch.backends.quantized.engine = previous


class EngineScope:
    """Selects a quantized engine for a block and restores the previous one.

    Also filters torch's quint8 deprecation warning inside the block.

    Example:
        >>> before = torch.backends.quantized.engine
        >>> with EngineScope("qnnpack"):
        ...     torch.backends.quantized.engine
        'qnnpack'
        >>> torch.backends.quantized.engine == before
        True
    """

    __slots__ = ("_id", "_previous", "_quiet", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._id = _engine_id(name)
        self._previous = self._id
        self._quiet = _Quiet()

    def __enter__(self) -> EngineScope:
        self._previous = int(torch._C._get_qengine())
        if self._previous != self._id:
            torch._C._set_qengine(self._id)
        self._quiet.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._quiet.__exit__(kind, value, tb)
        if self._previous != self._id:
            torch._C._set_qengine(self._previous)
