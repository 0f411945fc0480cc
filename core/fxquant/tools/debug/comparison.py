"""What :func:`fxquant.numerics.compare` returns: a row per node, and ways to read them."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Comparison", "NodeError"]


@dataclass(frozen=True, slots=True)
class NodeError:
    """One row of a :class:`Comparison`: a node's error against the float model.

    Example:
        >>> NodeError("fc", "Linear", "lowered", 31.5, 33.0, 0.02, 0.8).sqnr
        31.5
    """

    node: str
    pattern: str
    status: str
    sqnr: float
    """Accumulated: the node's value in the quantized model vs the float model's (dB)."""
    local_sqnr: float | None
    """The node alone, fed the float model's inputs (dB); None where it cannot be fed."""
    max_abs: float
    """Largest absolute difference of the accumulated value."""
    steps: float | None
    """``max_abs`` in quantization steps of the value (None for float values)."""
    local_steps: float | None = None
    """The local value's largest difference, in quantization steps: against a reference
    model, how far the node alone strays from it (a sound lowering: at most one step)."""
    gain: float | None = None
    """Output gain (dB): the model output's SQNR with this node alone running float,
    minus the quantized model's; what ``fallback`` buys by keeping it float. None where
    the node cannot run float on the quantized run's values."""


@dataclass(frozen=True)
class Comparison:
    """Per-node errors of a quantized model against a float (or reference) model.

    Iterating gives the rows (:class:`NodeError`) in graph order, the model's
    output last.

    Example:
        >>> rows = [NodeError("fc", "Linear", "reference", 20.0, 21.0, 0.1, 1.0, gain=0.5),
        ...         NodeError("fc2", "Linear", "reference", 18.0, 30.0, 0.1, 1.0, gain=6.0)]
        >>> [r.node for r in Comparison(rows).worst(1)], [r.node for r in
        ...     Comparison(rows).worst(1, by="local_sqnr")]
        (['fc2'], ['fc'])
    """

    rows: Sequence[NodeError] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[NodeError]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, node: str) -> NodeError:
        for row in self.rows:
            if row.node == node:
                return row
        msg = f"no row for node {node!r}; rows: {', '.join(r.node for r in self.rows)}"
        raise KeyError(msg)

    def worst(self, n: int = 5, *, by: str = "gain") -> list[NodeError]:
        """The ``n`` rows that cost the output most, output excluded.

        ``by="gain"`` (default): the largest output gain first, where ``fallback``
        starts; ``by="local_sqnr"`` (the node alone) or ``"sqnr"`` (accumulated):
        the lowest SQNR first.

        Raises:
            ValueError: ``by`` names no column to rank by.
        """
        if by not in ("gain", "local_sqnr", "sqnr"):
            msg = (
                f"by={by!r}: rank by 'gain' (output gain when the node runs float), "
                "'local_sqnr' (the node alone) or 'sqnr' (accumulated)"
            )
            raise ValueError(msg)

        def key(row: NodeError) -> float:
            value = getattr(row, by)
            if value is None:
                return math.inf
            return -float(value) if by == "gain" else float(value)

        return sorted((r for r in self.rows if r.node != "output"), key=key)[:n]

    def to_markdown(self) -> str:
        """The rows as a Markdown table.

        Example:
            >>> row = NodeError("fc", "Linear", "reference", 20.0, None, 0.1, None, gain=3.5)
            >>> header, _, line = Comparison([row]).to_markdown().splitlines()
            >>> header.split(" | ")[3:6]
            ['output gain dB', 'SQNR dB', 'local SQNR dB']
            >>> line
            '| fc | Linear | reference | 3.5 | 20.0 | - | 0.1 | - | - |'
        """

        def number(value: float | None, digits: int) -> str:
            return "-" if value is None else f"{value:.{digits}f}"

        lines = [
            "| node | pattern | status | output gain dB | SQNR dB | local SQNR dB | max abs "
            "| steps | local steps |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {r.node} | {r.pattern} | {r.status} | {number(r.gain, 1)} | {number(r.sqnr, 1)} | "
            f"{number(r.local_sqnr, 1)} | {r.max_abs:.3g} | {number(r.steps, 2)} | "
            f"{number(r.local_steps, 2)} |"
            for r in self.rows
        ]
        return "\n".join(lines)

    def to_dict(self) -> list[dict[str, Any]]:
        """The rows as plain data (JSON-able)."""
        return [asdict(r) for r in self.rows]

    def plot(self, path: str | None = None) -> Any:
        """A bar chart of both SQNRs per node (needs matplotlib); saved to ``path`` if given.

        Raises:
            ImportError: matplotlib is not installed (``pip install matplotlib``).
        """
        try:
            import matplotlib  # optional dependency

            matplotlib.use("Agg")
            from matplotlib import pyplot as plt
        except ImportError as error:
            msg = "Comparison.plot needs matplotlib: pip install matplotlib"
            raise ImportError(msg) from error
        names = [r.node for r in self.rows]
        positions = range(len(names))
        figure, axis = plt.subplots(figsize=(max(6.0, 0.5 * len(names)), 4.0))

        def finite(value: float | None) -> float:
            return 0.0 if value is None or not math.isfinite(value) else value

        axis.bar(
            [p - 0.2 for p in positions],
            [finite(r.sqnr) for r in self.rows],
            0.4,
            label="accumulated",
        )
        axis.bar(
            [p + 0.2 for p in positions],
            [finite(r.local_sqnr) for r in self.rows],
            0.4,
            label="local",
        )
        axis.set_xticks(list(positions), names, rotation=60, ha="right")
        axis.set_ylabel("SQNR (dB)")
        axis.legend()
        figure.tight_layout()
        if path is not None:
            figure.savefig(path)
        return figure
