"""Loading a state dict into a fresh observer or fake quantize whose buffers have no shape yet.

Per-channel ranges and qparams (and equalization's sums) are empty until the first batch
tells how many channels there are; ``load_state_dict`` copies into a buffer of the saved
shape only, so each buffer first takes the shape saved for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["take_saved_shapes"]


def take_saved_shapes(
    module: torch.nn.Module, state_dict: Mapping[str, Any], prefix: str, names: Iterable[str]
) -> None:
    """Resize each buffer ``names`` of ``module`` to its tensor in ``state_dict``, if both exist.

    Example:
        >>> m = torch.nn.Module(); m.register_buffer("scale", torch.zeros(0))
        >>> take_saved_shapes(m, {"obs.scale": torch.ones(3)}, "obs.", ["scale", "absent"])
        >>> m.scale.shape
        torch.Size([3])
    """
    for name in names:
        buffer = getattr(module, name, None)
        saved = state_dict.get(prefix + name)
        if isinstance(buffer, torch.Tensor) and isinstance(saved, torch.Tensor):
            buffer.resize_(saved.shape)
