"""Fresh attribute names on a module: the flow adds observers, scales and aliases to the root."""

from __future__ import annotations

from torch import nn

__all__ = ["unique_name"]


def unique_name(root: nn.Module, base: str, *, first: int | None = None) -> str:
    """``base``, or ``base_N`` with the first N that ``root`` has no attribute of.

    With ``first``, the name is always numbered and the search starts at ``base_<first>``:
    a caller adding a numbered series (``activation_post_process_0``, ``_1``...) passes how
    many it added, so each name costs one lookup, not one per name before it.

    Example:
        >>> root = nn.Linear(1, 1)
        >>> unique_name(root, "weight"), unique_name(root, "scale", first=0)
        ('weight_1', 'scale_0')
    """
    index = 0 if first is None else first
    name = base if first is None else f"{base}_{index}"
    while hasattr(root, name):
        index += 1
        name = f"{base}_{index}"
    return name
