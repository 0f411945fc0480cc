"""Loading a state dict into buffers whose shape (or dtype) the module cannot know beforehand.

Per-channel ranges and qparams (and equalization's sums) are empty until the first batch
tells how many channels there are; ``load_state_dict`` copies into a buffer of the saved
shape only, so each buffer first takes the shape saved for it. A reference module's weight
qparams may be per tensor or per channel, with integer or float zero points: there the
buffer is replaced by the saved tensor, dtype included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["adopt_saved_buffers", "take_saved_shapes"]


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


def adopt_saved_buffers(
    module: torch.nn.Module, state_dict: Mapping[str, Any], prefix: str, names: Iterable[str]
) -> None:
    """Replace each buffer ``names`` of ``module`` by a copy of its tensor in ``state_dict``
    (on the buffer's device), so that its shape and dtype are the saved ones.

    Example:
        >>> m = torch.nn.Module(); m.register_buffer("zero_point", torch.tensor(0))
        >>> adopt_saved_buffers(m, {"zero_point": torch.tensor([0.5, 1.5])}, "", ["zero_point"])
        >>> m.zero_point
        tensor([0.5000, 1.5000])
    """
    for name in names:
        saved = state_dict.get(prefix + name)
        if isinstance(saved, torch.Tensor):
            current: torch.Tensor = getattr(module, name)
            setattr(module, name, saved.detach().clone().to(current.device))
