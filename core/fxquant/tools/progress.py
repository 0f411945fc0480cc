"""Progress on long runs (calibration, ``fxquant demo``, ``fxquant check``) without a dependency.

With ``tqdm`` installed (``pip install 'fxquant[progress]'``) a bar is drawn;
without it, plain lines go to the same stream, at most about ten per run, so
a CI log stays readable::

    calibrating: 10/100
    calibrating: 20/100
    ...

Progress is shown when the stream is a terminal, unless ``enabled`` says
otherwise or the environment sets ``FXQUANT_PROGRESS=0`` (never) or ``=1``
(always). It always goes to stderr by default: stdout stays the result
(``fxquant demo --json | jq`` works with a bar on the screen).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar

__all__ = ["progress", "progress_enabled"]

_Item = TypeVar("_Item")


def progress_enabled(enabled: bool | None, out: TextIO) -> bool:
    """Whether to show progress: ``enabled`` if given, else ``FXQUANT_PROGRESS``, else a TTY.

    Example:
        >>> import io
        >>> progress_enabled(None, io.StringIO())  # not a terminal
        False
    """
    if enabled is not None:
        return enabled
    setting = os.environ.get("FXQUANT_PROGRESS", "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    isatty = getattr(out, "isatty", None)
    return bool(isatty and isatty())


def _tqdm() -> Any:
    try:
        return importlib.import_module("tqdm").tqdm
    except ImportError:
        return None


def _plain(
    items: Iterable[_Item], total: int | None, description: str, out: TextIO
) -> Iterator[_Item]:
    every = max(1, (total or 0) // 10)
    for count, item in enumerate(items, start=1):
        yield item
        if count % every == 0 or count == total:
            print(f"{description}: {count}/{total if total is not None else '?'}", file=out)
            out.flush()


def progress(
    items: Iterable[_Item],
    *,
    description: str = "",
    total: int | None = None,
    enabled: bool | None = None,
    out: TextIO | None = None,
) -> Iterator[_Item]:
    """Yield ``items``, showing how far along they are (tqdm's bar, else plain lines).

    Args:
        items: what to iterate over.
        description: the label (``"calibrating"``).
        total: how many items (default: ``len(items)`` when it has one).
        enabled: show progress (default: see the module docstring).
        out: where progress goes (default: stderr).

    Example:
        >>> list(progress(range(3), description="counting", enabled=False))
        [0, 1, 2]
    """
    stream = sys.stderr if out is None else out
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]  # checked just above
    if not progress_enabled(enabled, stream):
        yield from items
        return
    bar = _tqdm()
    if bar is None:
        yield from _plain(items, total, description, stream)
        return
    yield from bar(items, total=total, desc=description, file=stream, leave=False)
