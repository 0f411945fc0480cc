"""The quantized engine switch, and torch's quint8 deprecation warning kept inside kernels.

``torch.backends.quantized.engine`` is one process-wide setting, and some kernels read
it while they run (prepacking, add/mul/cat pick their implementation by it). Kernels of
one engine may run in many threads at once; a kernel of another engine waits until they
are done (a lease). The first kernel in selects the engine, the last one out puts
back the engine it found, so between kernels the engine is the user's, and two threads
never flip it under each other::

    thread A (fbgemm)   lease ----- kernel ----- kernel --- release
    thread B (fbgemm)        lease --- kernel --- release
    thread C (qnnpack)       waits ...........................  lease -- kernel -- release
"""

from __future__ import annotations

import threading
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


_ENGINE_IDS: dict[str, int] = {}


def _engine_id(name: str) -> int:
    """The id torch gives engine ``name``; found without switching (another thread's
    kernel may be running on the current engine)."""
    found = _ENGINE_IDS.get(name)
    if found is None:
        if name not in torch.backends.quantized.supported_engines:
            msg = (
                f"quantized engine {name!r} is not in this torch build; supported: "
                f"{', '.join(torch.backends.quantized.supported_engines)}"
            )
            raise RuntimeError(msg)
        found = _ENGINE_IDS[name] = int(torch.backends.quantized._get_qengine_id(name))
    return found


# the lease: which engine id the holders run on, how many hold it, the engine the
# first holder found (put back by the last one), how many threads wait for another engine
_ENGINE, _HOLDERS, _RESTORE, _WAITING = 0, 1, 2, 3
_LEASE = [-1, 0, -1, 0]
_LOCK = threading.Lock()
_FREE = threading.Condition(_LOCK)
_LOCAL = threading.local()  # per thread: the engines of its outer holds (a stack)


def acquire_engine(engine: int) -> None:
    """Hold the quantized engine ``engine`` (an id) for this thread; wait for other engines.

    The kernels' hot path (two calls per kernel): kept to a lock and a few list reads. A
    thread that already holds the lease and asks for another engine (nested scopes of
    two engines) switches at once: waiting would wait for itself.

    Example:
        >>> acquire_engine(_engine_id("qnnpack")); torch.backends.quantized.engine
        'qnnpack'
        >>> release_engine()
    """
    stack = _LOCAL.__dict__.setdefault("stack", [])
    lease = _LEASE
    with _LOCK:
        if not stack:
            while lease[_HOLDERS] and lease[_ENGINE] != engine:
                lease[_WAITING] += 1
                _FREE.wait()
                lease[_WAITING] -= 1
        if lease[_HOLDERS] == 0:
            lease[_RESTORE] = current = _GET_ENGINE()
            if current != engine:
                _SET_ENGINE(engine)
        elif lease[_ENGINE] != engine:  # nested: this thread holds another engine
            _SET_ENGINE(engine)
        stack.append(lease[_ENGINE])
        lease[_ENGINE] = engine
        lease[_HOLDERS] += 1


def release_engine() -> None:
    """Give back this thread's innermost hold (see :func:`acquire_engine`).

    The last holder puts back the engine the first one found, unless the user set
    another engine meanwhile (theirs stays).

    Example:
        >>> before = torch.backends.quantized.engine
        >>> acquire_engine(_engine_id("qnnpack")); release_engine()
        >>> torch.backends.quantized.engine == before
        True
    """
    stack = _LOCAL.stack
    lease = _LEASE
    with _LOCK:
        outer = stack.pop()
        lease[_HOLDERS] -= 1
        if lease[_HOLDERS] == 0:
            current = _GET_ENGINE()
            if current == lease[_ENGINE] != lease[_RESTORE]:
                _SET_ENGINE(lease[_RESTORE])
            lease[_ENGINE] = -1
            if lease[_WAITING]:
                _FREE.notify_all()
        elif stack and outer != lease[_ENGINE]:  # a nested scope ends: the outer engine again
            lease[_ENGINE] = outer
            _SET_ENGINE(outer)


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

    __slots__ = ("_id", "_quiet", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._id = _engine_id(name)
        self._quiet = _Quiet()

    def __enter__(self) -> EngineScope:
        acquire_engine(self._id)
        self._quiet.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._quiet.__exit__(kind, value, tb)
        release_engine()
