"""The report every prepared and converted model carries, and strict mode.

One :class:`NodeReport` per node (pattern matched, qconfig applied, status,
and for every pattern left in float a :class:`Reason` with a stable code),
plus the QConfigMapping entries that matched nothing. ``fxquant.explain``
returns it; ``str(report)`` is the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Final

from fxquant.errors import QuantizationSkipped

__all__ = ["CODES", "NodeReport", "Reason", "Report", "raise_if_skipped"]

CODES: Final = (
    "no_pattern",
    "dtype_mismatch",
    "is_dynamic",
    "quant_range",
    "scale_min",
    "fixed_qparams",
    "zero_point",
    "qconfig_none",
    "fusion_qconfig_mismatch",
    "fusion_no_qat_module",
    "no_lowering_kernel",
    "qdq_not_fusable",
    "non_float_tensor",
    "additive_mask",
    "unused_qconfig_entry",
    "standalone_module",
    "not_delegated",
)
"""Every reason code; the words may change, the codes do not."""

STATUSES: Final = ("quantized", "skipped", "lowered", "reference", "float")


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a pattern was not quantized: a stable code and the sentence users read.

    Example:
        >>> Reason("quant_range", "linear: quant_max 255 exceeds the bound 127",
        ...        field="quant_max_upper_bound", bound=127).code
        'quant_range'
    """

    code: str
    words: str
    field: str | None = None
    bound: object = None

    def __post_init__(self) -> None:
        if self.code not in CODES:
            msg = f"Reason code {self.code!r} is not one of {', '.join(CODES)}"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What the flow did with one node.

    Example:
        >>> NodeReport("fc", "call_module", "Linear", "QConfig(...)", "quantized").status
        'quantized'
    """

    node: str
    op: str
    pattern: str | None
    qconfig: str | None
    status: str
    reason: Reason | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            msg = f"NodeReport status {self.status!r} is not one of {', '.join(STATUSES)}"
            raise ValueError(msg)


class Report:
    """Ordered node reports plus the qconfig-mapping entries that matched nothing.

    Immutable: :meth:`with_entry` returns a new report.

    Example:
        >>> report = Report([NodeReport("x", "placeholder", None, None, "float")])
        >>> [e.node for e in report.entries()]
        ['x']
    """

    __slots__ = ("_entries", "_unused")

    def __init__(self, entries: Iterable[NodeReport] = (), unused: Iterable[Reason] = ()) -> None:
        self._entries: dict[str, NodeReport] = {e.node: e for e in entries}
        self._unused: tuple[Reason, ...] = tuple(unused)

    def entries(self) -> list[NodeReport]:
        """Every node's report, in graph order."""
        return list(self._entries.values())

    def skipped(self) -> list[NodeReport]:
        """The reports of patterns left unquantized against the user's intent.

        Entries with status ``"float"`` (qconfig None, non-float tensors, additive
        masks) carry a reason but are the intended outcome, so they are not listed.

        Example:
            >>> Report([NodeReport("x", "placeholder", None, None, "float")]).skipped()
            []
        """
        return [e for e in self._entries.values() if e.reason is not None and e.status != "float"]

    def unused(self) -> list[Reason]:
        """QConfigMapping entries that matched no node (code ``unused_qconfig_entry``)."""
        return list(self._unused)

    def entry(self, node: str) -> NodeReport | None:
        """The report of the node named ``node``, if any."""
        return self._entries.get(node)

    def with_entry(self, entry: NodeReport) -> Report:
        """A copy with ``entry`` replacing the entry of ``entry.node`` (or appended).

        Example:
            >>> r = Report().with_entry(NodeReport("x", "placeholder", None, None, "float"))
            >>> len(r.entries())
            1
        """
        entries = dict(self._entries)
        entries[entry.node] = entry
        return Report(entries.values(), self._unused)

    def with_unused(self, unused: Iterable[Reason]) -> Report:
        """A copy listing ``unused`` as the unmatched qconfig-mapping entries."""
        return Report(self._entries.values(), unused)

    def table(self) -> str:
        """The report as a text table (node, op, pattern, qconfig, status, reason).

        Example:
            >>> print(Report([NodeReport("x", "placeholder", None, None, "float")]).table())
            node  op           pattern  qconfig  status  reason
            x     placeholder  -        -        float   -
        """
        header = ("node", "op", "pattern", "qconfig", "status", "reason")
        rows = [header] + [_row(e) for e in self._entries.values()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
        lines = [
            "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
            for row in rows
        ]
        lines += [f"unused qconfig entry: {r.words}" for r in self._unused]
        return "\n".join(lines)

    __str__ = table

    def __repr__(self) -> str:
        return f"Report({len(self._entries)} nodes, {len(self.skipped())} skipped)"

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``{"nodes": [...], "unused": [...]}`` (JSON-able but for ``bound``).

        Example:
            >>> Report().to_dict()
            {'nodes': [], 'unused': []}
        """
        return {
            "nodes": [asdict(e) for e in self._entries.values()],
            "unused": [asdict(r) for r in self._unused],
        }


def _row(entry: NodeReport) -> tuple[str, ...]:
    reason = f"{entry.reason.code}: {entry.reason.words}" if entry.reason else "-"
    return (
        entry.node,
        entry.op,
        entry.pattern or "-",
        entry.qconfig or "-",
        entry.status,
        reason,
    )


def raise_if_skipped(report: Report, step: str) -> None:
    """Strict mode: raise :class:`QuantizationSkipped` listing every skipped node.

    Raises:
        QuantizationSkipped: when any node or qconfig entry carries a reason.

    Example:
        >>> raise_if_skipped(Report(), "prepare_fx")
    """
    skipped: list[object] = [*report.skipped(), *report.unused()]
    if not skipped:
        return
    lines = [
        f"  {e.node}: [{e.reason.code}] {e.reason.words}" for e in report.skipped() if e.reason
    ]
    lines += [f"  qconfig mapping: [{r.code}] {r.words}" for r in report.unused()]
    msg = (
        f"{step}(strict=True): {len(skipped)} pattern(s) would be left in float:\n"
        + "\n".join(lines)
        + "\nfix the qconfig mapping or backend config, or pass strict=False to skip them"
    )
    raise QuantizationSkipped(msg, skipped)
