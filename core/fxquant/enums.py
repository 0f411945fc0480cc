"""String enums for fxquant's closed vocabularies (reason codes, statuses, value kinds).

A member is its string value: it compares equal to it, hashes like it, prints
and formats as it and ``json.dumps`` writes it, so code and data written
against plain strings keep working while fxquant's own code names members.
``StrEnum`` is Python 3.11's (a shim on 3.10); :func:`member` turns a string
from outside into a member, or fails naming every valid choice.
"""

from __future__ import annotations

import sys
from enum import Enum
from typing import TypeVar

__all__ = ["StrEnum", "member"]

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover  # the CI runs 3.11

    class StrEnum(str, Enum):
        """Python 3.11's ``enum.StrEnum``: each member is its value as a string."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


_Member = TypeVar("_Member", bound=StrEnum)


def member(kind: type[_Member], value: object, what: str) -> _Member:
    """``value`` (a member of ``kind`` or its string value) as the member.

    Raises:
        ValueError: ``value`` is neither; the message names ``what`` and every choice.

    Example:
        >>> class Color(StrEnum):
        ...     RED = "red"
        ...     BLUE = "blue"
        >>> member(Color, "red", "color") is Color.RED
        True
        >>> member(Color, "green", "color")
        Traceback (most recent call last):
        ValueError: color 'green' is not one of red, blue
    """
    try:
        # a member, or the member whose value it is; the lookup refuses anything else
        return kind(value)  # type: ignore[arg-type]  # any object: ValueError if not a value
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        msg = f"{what} {value!r} is not one of {choices}"
        raise ValueError(msg) from None
