"""Markdown tables for the tools' output: ``fxquant demo``, ``fxquant check``, the docs' pages.

A table is as wide as its content; given a ``width`` (the terminal's), its widest columns
shrink until a row fits and their cells wrap onto continuation rows (the other cells
blank), which Markdown still reads as a table. A column shrinks to its typical cell
first, and only where the row still does not fit down to its longest word.

Its own module: the demo and the conformance checks borrowed it from the command line
module, which imports them (a cycle).
"""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Sequence

__all__ = ["markdown_table", "output_width"]

_NARROWEST = 30  # a long column keeps at least this: a few words per line read as prose
_TYPICAL = 48  # ... and at most this, unless its longest word is longer
_FALLBACK = 120  # no terminal anywhere (CI logs, a file): a width a log viewer shows whole


def output_width() -> int:
    """The width tables wrap to: ``COLUMNS``, else the terminal's, else 120.

    Standard output piped on (``fxquant show x86 | head``) has no size; standard error
    usually still is the user's terminal, whose width is the one that matters.

    Example:
        >>> output_width() > 0
        True
    """
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    for fd in (1, 2):
        try:
            return os.get_terminal_size(fd).columns
        except OSError:  # not a terminal
            continue
    return shutil.get_terminal_size((_FALLBACK, 24)).columns


def _longest_word(column: Sequence[str]) -> int:
    """The narrowest a column can get: a word is never broken."""
    return max(len(word) for cell in column for word in cell.split() or [""])


def _floor(column: Sequence[str]) -> int:
    """How narrow a column gets first: its longest word, else its median cell within 30
    to 48 characters, so most cells of a column keep one line."""
    lengths = sorted(len(cell) for cell in column)
    typical = min(max(lengths[len(lengths) // 2], _NARROWEST), _TYPICAL)
    return max(_longest_word(column), min(lengths[-1], typical))


def _fit(widths: list[int], floors: list[int], width: int) -> list[int]:
    """``widths`` with the widest columns narrowed until a row fits in ``width``."""
    fitted = list(widths)
    overflow = sum(fitted) + 3 * len(fitted) + 1 - width
    while overflow > 0:
        shrinkable = [i for i, w in enumerate(fitted) if w > floors[i]]
        if not shrinkable:
            break  # the floors alone are wider: rows follow them
        widest = max(shrinkable, key=lambda i: fitted[i])
        fitted[widest] -= 1
        overflow -= 1
    return fitted


def _lines(row: Sequence[str], widths: Sequence[int]) -> list[str]:
    wrapped = [
        textwrap.wrap(c, w, break_long_words=False, break_on_hyphens=False) or [""]
        for c, w in zip(row, widths, strict=True)
    ]
    depth = max(len(parts) for parts in wrapped)
    return [
        "| "
        + " | ".join(
            (parts[i] if i < len(parts) else "").ljust(w)
            for parts, w in zip(wrapped, widths, strict=True)
        )
        + " |"
        for i in range(depth)
    ]


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None
) -> str:
    """Render a Markdown table with columns padded to their widest cell.

    Args:
        header: the column names.
        rows: the cells, as text.
        width: the widest a line may be (``None``: as wide as the content); the widest
            columns wrap their cells to fit, down to their median cell (within 30 to
            48 characters), then where that is not enough down to their longest word
            (a table whose longest words are wider stays wider than ``width``).

    Example:
        >>> print(markdown_table(["a", "bb"], [["1", "2"]]))
        | a | bb |
        | - | -- |
        | 1 | 2  |
        >>> cell = "one two three four five six seven eight nine ten eleven twelve"
        >>> print(markdown_table(["k", "v"], [["x", cell]], width=40))
        | k | v                                |
        | - | -------------------------------- |
        | x | one two three four five six      |
        |   | seven eight nine ten eleven      |
        |   | twelve                           |
    """
    cells = [[str(c).replace("|", "\\|") for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    if width is not None:
        columns = [[row[i] for row in cells] for i in range(len(header))]
        widths = _fit(widths, [_floor(column) for column in columns], width)
        # still too wide (many columns): wrap further, down to each column's longest word
        widths = _fit(widths, [_longest_word(column) for column in columns], width)
    lines = [line for row in cells for line in _lines(row, widths)]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)
