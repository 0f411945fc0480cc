"""Calibration: run a prepared model on data, with progress on long runs.

Calibrating is a loop over batches; this is that loop with what people write
around it: ``torch.no_grad()``, tuples spread over ``forward``'s arguments,
and a progress bar (:mod:`fxquant.tools.progress`) when the run is long enough to
wait for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import torch

from fxquant.tools.progress import progress

__all__ = ["calibrate"]

_Model = TypeVar("_Model", bound=torch.nn.Module)


def calibrate(
    model: _Model,
    data: Iterable[Any],
    *,
    description: str = "calibrating",
    show_progress: bool | None = None,
) -> _Model:
    """Run ``model`` (prepared by ``prepare_fx``) on every batch of ``data``; return it.

    Args:
        model: the prepared model, whose observers record what they see.
        data: batches: a tensor, a tuple or list of positional inputs, or a
            dict of keyword inputs (a ``DataLoader`` of inputs works as it is).
        description: the progress label.
        show_progress: progress on stderr (default: when stderr is a terminal,
            see :mod:`fxquant.tools.progress`).

    Returns:
        ``model``, calibrated (its observers hold the ranges convert needs).

    Example:
        >>> import fxquant
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
        >>> prepared = fxquant.prepare_fx(model, fxquant.get_default_qconfig_mapping("reference"),
        ...                               (torch.randn(1, 4),))
        >>> prepared = calibrate(prepared, [torch.randn(8, 4) for _ in range(3)])
        >>> fxquant.convert_fx(prepared)(torch.randn(2, 4)).shape
        torch.Size([2, 2])
    """
    with torch.no_grad():
        for batch in progress(data, description=description, enabled=show_progress):
            if isinstance(batch, dict):
                model(**batch)
            elif isinstance(batch, (tuple, list)):
                model(*batch)
            else:
                model(batch)
    return model
