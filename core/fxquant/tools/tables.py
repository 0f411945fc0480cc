"""Markdown tables for the tools' output: ``fxquant demo``, ``fxquant check``, the docs' pages.

Its own module: the demo and the conformance checks borrowed it from the command line
module, which imports them (a cycle).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["markdown_table"]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Render a Markdown table with columns padded to their widest cell.

    Example:
        >>> print(markdown_table(["a", "bb"], [["1", "2"]]))
        | a | bb |
        | - | -- |
        | 1 | 2  |
    """
    cells = [[str(c).replace("|", "\\|") for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in cells
    ]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)
