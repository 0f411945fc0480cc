"""The report every prepared and converted model carries, and strict mode.

One :class:`NodeReport` per node (pattern matched, qconfig applied, status,
and for every pattern left in float a :class:`Reason` with a stable code),
plus the QConfigMapping entries that matched nothing. ``fxquant.explain``
returns it; ``str(report)`` is the table.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Final

from fxquant.enums import StrEnum, member
from fxquant.errors import QuantizationSkipped

__all__ = [
    "CODES",
    "STATUSES",
    "NodeReport",
    "NodeStatus",
    "Reason",
    "ReasonCode",
    "Report",
    "raise_if_skipped",
]


class ReasonCode(StrEnum):
    """Why a node was not quantized (or not lowered, or not taken by a deployment).

    A member is its string value: it compares equal to it, prints as it and
    serializes as it, so ``entry.reason.code == "no_pattern"`` and the JSON of
    :meth:`Report.to_dict` read the same as with plain strings. The codes are
    stable; the words next to them may change.

    Example:
        >>> ReasonCode("quant_range") is ReasonCode.QUANT_RANGE
        True
        >>> f"[{ReasonCode.NO_PATTERN}]"
        '[no_pattern]'
    """

    NO_PATTERN = "no_pattern"
    """No pattern of the backend matches the node (or its fusion)."""
    DTYPE_MISMATCH = "dtype_mismatch"
    """The qconfig's dtypes are none of the pattern's dtype configs."""
    IS_DYNAMIC = "is_dynamic"
    """The qconfig is dynamic where the pattern is static, or the reverse."""
    QUANT_RANGE = "quant_range"
    """The observer's quant_min/quant_max exceed the dtype config's bounds."""
    SCALE_MIN = "scale_min"
    """The observer's smallest scale (eps) is under the dtype config's bound."""
    FIXED_QPARAMS = "fixed_qparams"
    """The op needs fixed qparams (sigmoid, tanh...) that the qconfig does not give."""
    ZERO_POINT = "zero_point"
    """The dtype config asks for a zero point (symmetric quantization) the qconfig does not give."""
    QCONFIG_NONE = "qconfig_none"
    """The qconfig mapping gives the node ``None``: it stays float, as asked."""
    FUSION_QCONFIG_MISMATCH = "fusion_qconfig_mismatch"
    """The nodes a pattern fuses have different qconfigs."""
    FUSION_NO_QAT_MODULE = "fusion_no_qat_module"
    """QAT: a fused module has no QAT module in the backend config."""
    NO_LOWERING_KERNEL = "no_lowering_kernel"
    """convert_fx: no lowering rule of the backend took the pattern; it stays in reference form."""
    QDQ_NOT_FUSABLE = "qdq_not_fusable"
    """A deployment's runtime cannot fuse the node's quantize/dequantize steps."""
    NON_FLOAT_TENSOR = "non_float_tensor"
    """The node produces no float tensor (integers, booleans, shapes): nothing to observe."""
    CONSTANT = "constant"
    """The node reads no activation (attributes, shapes, literals only): nothing to calibrate."""
    ADDITIVE_MASK = "additive_mask"
    """The node carries an additive attention mask (``fxquant.flow.values``): it stays float."""
    UNUSED_QCONFIG_ENTRY = "unused_qconfig_entry"
    """A qconfig-mapping entry matched no node."""
    STANDALONE_MODULE = "standalone_module"
    """A standalone module is quantized on its own, not as part of the model."""
    NOT_DELEGATED = "not_delegated"
    """A deployment (ExecuTorch's partitioner) left the node outside its delegate."""
    NOT_CALIBRATED = "not_calibrated"
    """convert: an activation observer next to the node saw no finite value (the prepared
    model was not run on data): the node stays float rather than use a made-up range."""


class NodeStatus(StrEnum):
    """What the flow did with a node; a member is its string value (see :class:`ReasonCode`).

    Example:
        >>> NodeStatus("lowered") == "lowered"
        True
    """

    QUANTIZED = "quantized"
    """Prepared: observers on its inputs and outputs."""
    SKIPPED = "skipped"
    """Left float against the qconfig mapping's intent; the reason says why."""
    LOWERED = "lowered"
    """Converted and replaced by a backend kernel (or taken by the deployment)."""
    REFERENCE = "reference"
    """Converted to reference form: the float op between quantize/dequantize steps."""
    FLOAT = "float"
    """Left float as intended (no qconfig, not a float tensor, a constant, an additive mask)."""


CODES: Final = tuple(code.value for code in ReasonCode)
"""Every reason code's string; the words may change, the codes do not."""

STATUSES: Final = tuple(status.value for status in NodeStatus)
"""Every status's string."""

_STATUS_ORDER: Final = ("quantized", "lowered", "reference", "float", "skipped")
"""The order in which :meth:`Report.summary` counts the statuses."""


@dataclass(frozen=True, slots=True, init=False)
class Reason:
    """Why a pattern was not quantized: a stable code and the sentence users read.

    ``code`` is a :class:`ReasonCode`; its string value is accepted too (and checked).

    Raises:
        ValueError: ``code`` is not a reason code; the message lists them.

    Example:
        >>> reason = Reason("quant_range", "linear: quant_max 255 exceeds the bound 127",
        ...                 field="quant_max_upper_bound", bound=127)
        >>> reason.code is ReasonCode.QUANT_RANGE, reason.code == "quant_range"
        (True, True)
    """

    code: ReasonCode
    words: str
    field: str | None
    bound: object

    # written out (not generated): a plain string code is accepted and checked, while the
    # attribute is always the enum member
    def __init__(
        self, code: ReasonCode | str, words: str, field: str | None = None, bound: object = None
    ) -> None:
        object.__setattr__(self, "code", member(ReasonCode, code, "Reason code"))
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "field", field)
        object.__setattr__(self, "bound", bound)


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What the flow did with one node.

    ``status`` is a :class:`NodeStatus`; its string value is accepted too (and checked).

    Raises:
        ValueError: ``status`` is not a status; the message lists them.

    Example:
        >>> NodeReport("fc", "call_module", "Linear", "QConfig(...)", "quantized").status
        <NodeStatus.QUANTIZED: 'quantized'>
    """

    node: str
    op: str
    pattern: str | None
    qconfig: str | None
    status: NodeStatus
    reason: Reason | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        status = member(NodeStatus, self.status, "NodeReport status")
        object.__setattr__(self, "status", status)  # frozen: the checked enum member


class Report:
    """Ordered node reports plus the qconfig-mapping entries that matched nothing.

    Immutable: :meth:`with_entry` returns a new report.

    Example:
        >>> report = Report([NodeReport("x", "placeholder", None, None, "float")])
        >>> [e.node for e in report.entries()]
        ['x']
    """

    __slots__ = ("_entries", "_notes", "_unused")

    def __init__(
        self,
        entries: Iterable[NodeReport] = (),
        unused: Iterable[Reason] = (),
        notes: Iterable[str] = (),
    ) -> None:
        self._entries: dict[str, NodeReport] = {e.node: e for e in entries}
        self._unused: tuple[Reason, ...] = tuple(unused)
        self._notes: tuple[str, ...] = tuple(notes)

    def notes(self) -> list[str]:
        """Lines about the whole model printed under the table (e.g. equalized pairs)."""
        return list(self._notes)

    def with_notes(self, notes: Iterable[str]) -> Report:
        """A copy with ``notes`` added after the existing ones.

        Example:
            >>> Report().with_notes(["equalized: ln -> fc"]).notes()
            ['equalized: ln -> fc']
        """
        return Report(self._entries.values(), self._unused, (*self._notes, *notes))

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
        return [
            e
            for e in self._entries.values()
            if e.reason is not None and e.status != NodeStatus.FLOAT
        ]

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
        return Report(entries.values(), self._unused, self._notes)

    def with_changes(self, changes: Mapping[str, Mapping[str, Any]]) -> Report:
        """A copy in which the entry of each node named in ``changes`` has those fields replaced.

        Example:
            >>> r = Report([NodeReport("x", "placeholder", None, None, "float")])
            >>> r.with_changes({"x": {"status": NodeStatus.SKIPPED}}).entries()[0].status
            <NodeStatus.SKIPPED: 'skipped'>
        """
        entries = self._entries.values()
        changed = (replace(e, **changes[e.node]) if e.node in changes else e for e in entries)
        return Report(changed, self._unused, self._notes)

    def with_unused(self, unused: Iterable[Reason]) -> Report:
        """A copy listing ``unused`` as the unmatched qconfig-mapping entries."""
        return Report(self._entries.values(), unused, self._notes)

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
        lines += list(self._notes)
        summary = self.summary()
        return "\n".join([*lines, summary] if summary else lines)

    def summary(self) -> str:
        """One line: how many op nodes have each status, with the reasons' codes counted.

        Example:
            >>> why = Reason("qconfig_none", "fc: qconfig is None")
            >>> fc = NodeReport("fc", "call_module", "Linear", None, "float", why)
            >>> relu = NodeReport("relu", "call_function", "F.relu", None, "lowered")
            >>> print(Report([fc, relu]).summary())
            summary: 1 lowered, 1 float (qconfig_none 1)
        """
        totals: Counter[str] = Counter()
        codes: defaultdict[str, Counter[str]] = defaultdict(Counter)  # status -> its reasons
        for entry in self._entries.values():
            if entry.op not in ("placeholder", "get_attr", "output"):  # values, not ops
                totals[str(entry.status)] += 1
                codes[str(entry.status)].update([str(entry.reason.code)] if entry.reason else [])
        order = [status for status in _STATUS_ORDER if status in totals]
        parts = []
        for status in order + sorted(set(totals) - set(order)):
            words = ", ".join(f"{code} {n}" for code, n in codes[status].most_common())
            parts.append(f"{totals[status]} {status}" + (f" ({words})" if words else ""))
        return f"summary: {', '.join(parts)}" if parts else ""

    __str__ = table

    def __repr__(self) -> str:
        return f"Report({len(self._entries)} nodes, {len(self.skipped())} skipped)"

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``{"nodes": [...], "unused": [...]}`` (JSON-able but for ``bound``).

        Example:
            >>> Report().to_dict()
            {'nodes': [], 'unused': []}
        """
        plain: dict[str, Any] = {
            "nodes": [asdict(e) for e in self._entries.values()],
            "unused": [asdict(r) for r in self._unused],
        }
        if self._notes:
            plain["notes"] = list(self._notes)
        return plain

    @classmethod
    def from_dict(cls, plain: Mapping[str, Any]) -> Report:
        """The report :meth:`to_dict` gave (read back from JSON, as a saved deployment does).

        Example:
            >>> report = Report([NodeReport("fc", "call_module", "Linear", None, "lowered")],
            ...                 notes=["kernels: onednn"])
            >>> Report.from_dict(report.to_dict()).table() == report.table()
            True
        """
        entries = [
            NodeReport(**{**entry, "reason": _reason(entry.get("reason"))})
            for entry in plain.get("nodes", ())
        ]
        unused = [_reason(reason) for reason in plain.get("unused", ())]
        return cls(entries, [r for r in unused if r is not None], plain.get("notes", ()))


def _reason(plain: Mapping[str, Any] | None) -> Reason | None:
    return None if plain is None else Reason(**plain)


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
        f"{step}(strict=True): {len(skipped)} pattern(s) would not run as the qconfig mapping "
        "asks (left in float, or kept in reference form with no kernel):\n"
        + "\n".join(lines)
        + "\nfix the qconfig mapping or backend config, or pass strict=False to skip them"
    )
    raise QuantizationSkipped(msg, skipped)
