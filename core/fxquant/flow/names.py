"""Fresh attribute names on a module: the flow adds observers, scales and aliases to the root."""

from __future__ import annotations

from torch import nn

__all__ = ["unique_name"]


def unique_name(root: nn.Module, base: str) -> str:
    """``base``, or ``base_N`` with the first N that ``root`` has no attribute of.

    Example:
        >>> root = nn.Linear(1, 1)
        >>> unique_name(root, "weight"), unique_name(root, "scale")
        ('weight_1', 'scale')
    """
    name, index = base, 0
    while hasattr(root, name):
        index += 1
        name = f"{base}_{index}"
    return name
