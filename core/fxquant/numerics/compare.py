"""The numerics debugger: per quantized node, how far its value is from the float model's (#23).

Values are matched by node name: prepare and convert keep the names of the
traced (and fused) float graph, and a lowered kernel's node keeps its
pattern's anchor (``NodeInfo.anchor``) and output qparams. A node's value is
what the next op reads: after its output quantize/dequantize in a reference
model, the dequantized integers of a kernel in a lowered one.

Two runs of the quantized model over the same inputs:

- as it is: each node's **accumulated** error (SQNR against the float value);
- with every matched value replaced by the float model's before the next node
  reads it: each node's **local** error, the node alone fed float inputs
  (through its own input quantization, which is part of what it computes).

``compare(reference, lowered, inputs)`` works the same way: the reference model
plays the float model, and ``steps`` says how many quantization steps apart the
two are (issue 23's first target: at most one per quantized node).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.fx import Node

from fxquant.errors import ConfigTypeError
from fxquant.flow.epilogues import OUTPUT_OF_KEY, OUTPUT_QPARAMS_KEY
from fxquant.flow.report import NodeStatus
from fxquant.flow.state import META_KEY, FlowState
from fxquant.lowering import DEQUANTIZE_OPS, STATIC_QUANTIZE_OPS, QParams

__all__ = ["Comparison", "NodeError", "compare"]

_QUANTIZED = {NodeStatus.QUANTIZED, NodeStatus.REFERENCE, NodeStatus.LOWERED}


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
    model, how far the node alone strays from it (issue 23: at most one step)."""


@dataclass(frozen=True)
class Comparison:
    """Per-node errors of a quantized model against a float (or reference) model.

    Iterating gives the rows (:class:`NodeError`) in graph order, the model's
    output last.

    Example:
        >>> row = NodeError("fc", "Linear", "reference", 20.0, 21.0, 0.1, 1.0)
        >>> [r.node for r in Comparison([row]).worst(1)]
        ['fc']
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

    def worst(self, n: int = 5, *, by: str = "local_sqnr") -> list[NodeError]:
        """The ``n`` rows with the lowest SQNR (``by="local_sqnr"`` or ``"sqnr"``), output excluded.

        Raises:
            ValueError: ``by`` names no SQNR column.
        """
        if by not in ("local_sqnr", "sqnr"):
            msg = f"by={by!r}: rank by 'local_sqnr' (the node alone) or 'sqnr' (accumulated)"
            raise ValueError(msg)

        def key(row: NodeError) -> float:
            value = getattr(row, by)
            return math.inf if value is None else float(value)

        return sorted((r for r in self.rows if r.node != "output"), key=key)[:n]

    def to_markdown(self) -> str:
        """The rows as a Markdown table.

        Example:
            >>> row = NodeError("fc", "Linear", "reference", 20.0, None, 0.1, None)
            >>> print(Comparison([row]).to_markdown())
            | node | pattern | status | SQNR dB | local SQNR dB | max abs | steps | local steps |
            | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |
            | fc | Linear | reference | 20.0 | - | 0.1 | - | - |
        """

        def number(value: float | None, digits: int) -> str:
            return "-" if value is None else f"{value:.{digits}f}"

        lines = [
            "| node | pattern | status | SQNR dB | local SQNR dB | max abs | steps | local steps |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        lines += [
            f"| {r.node} | {r.pattern} | {r.status} | {number(r.sqnr, 1)} | "
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


# ---- where each node's value is ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Site:
    name: str  # the float graph's node name
    chain: tuple[Node, ...]  # output quantize -> dequantize applied to the node's output
    qparams: QParams | None  # to read an integer output (a kernel's)


def _attribute(gm: nn.Module, node: Node) -> Any:
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value


def _static_step(node: Node) -> float | None:
    if (
        node.target in STATIC_QUANTIZE_OPS
        and len(node.args) > 1
        and isinstance(node.args[1], float)
    ):
        return float(node.args[1])
    return None


def _output_chain(node: Node) -> tuple[Node, ...]:
    users = list(node.users)
    if (
        len(users) != 1
        or users[0].op != "call_function"
        or users[0].target not in STATIC_QUANTIZE_OPS
    ):
        return ()
    quantize = users[0]
    dequantize = [
        u for u in quantize.users if u.op == "call_function" and u.target in DEQUANTIZE_OPS
    ]
    return (quantize, dequantize[0]) if dequantize else ()


def _sites(gm: fx.GraphModule, names: set[str]) -> dict[Node, _Site]:
    sites = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        if node.op == "call_function" and (
            node.target in STATIC_QUANTIZE_OPS or node.target in DEQUANTIZE_OPS
        ):
            continue
        name = node.meta.get(OUTPUT_OF_KEY, node.name)
        if name is None or name not in names:
            continue
        sites[node] = _Site(name, _output_chain(node), node.meta.get(OUTPUT_QPARAMS_KEY))
    return sites


class _Run(fx.Interpreter):
    """Runs ``gm``, reading every site's value; replaces it by ``forced[name]`` if given."""

    def __init__(
        self, gm: fx.GraphModule, sites: Mapping[Node, _Site], forced: Mapping[str, Any] | None
    ) -> None:
        super().__init__(gm)
        self.sites, self.forced = sites, forced
        self.values: dict[str, torch.Tensor] = {}
        self.steps: dict[str, float] = {}

    def run_node(self, n: Node) -> Any:
        out = super().run_node(n)
        site = self.sites.get(n)
        if site is None or not isinstance(out, torch.Tensor):
            return out
        value = self._value(site, out)
        if value is not None:
            self.values.setdefault(site.name, value)
        if self.forced is not None and site.name in self.forced:
            return self._force(site, out, self.forced[site.name])
        return out

    def _value(self, site: _Site, out: torch.Tensor) -> torch.Tensor | None:
        for step in site.chain:
            args = [self._constant(a) for a in step.args[1:]]
            out = step.target(out, *args)  # type: ignore[operator]
            scale = _static_step(step)
            if scale is not None:
                self.steps[site.name] = scale
        if out.is_floating_point():
            return out.detach().float()
        qparams = site.qparams
        if qparams is None or qparams.scale is None or qparams.is_per_channel:
            return None
        self.steps[site.name] = float(qparams.scale)
        return (out.float() - float(qparams.zero_point or 0)) * float(qparams.scale)

    def _constant(self, arg: Any) -> Any:
        if isinstance(arg, Node):
            return _attribute(self.module, arg) if arg.op == "get_attr" else self.env[arg]
        return arg

    def _force(self, site: _Site, out: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        if value.shape != out.shape:
            return out
        if out.is_floating_point():
            return value.to(out.dtype)
        qparams = site.qparams
        if qparams is None or qparams.scale is None or qparams.is_per_channel:
            return out
        scaled = torch.round(value / float(qparams.scale)) + float(qparams.zero_point or 0)
        return scaled.clamp(qparams.quant_min, qparams.quant_max).to(out.dtype)


def _batches(inputs: Any) -> list[tuple[Any, ...]]:
    if isinstance(inputs, list):
        return [b if isinstance(b, tuple) else (b,) for b in inputs]
    return [inputs if isinstance(inputs, tuple) else (inputs,)]


def _float_graph(model: nn.Module, quantized: nn.Module) -> fx.GraphModule:
    """The float model as a graph with prepare's node names (traced and fused the same way)."""
    if isinstance(model, fx.GraphModule):
        return model
    from fxquant.flow import fuse_fx  # lazy: fxquant.flow imports this package's siblings

    state = getattr(quantized, "meta", {}).get(META_KEY)
    backend = state.backend_config if isinstance(state, FlowState) else None
    return fuse_fx(copy.deepcopy(model).eval(), backend_config=backend)


def _outputs(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.detach().float()]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _outputs(v)]
    return []


@dataclass
class _Sums:
    signal: float = 0.0
    noise: float = 0.0
    local_noise: float = 0.0
    local_signal: float = 0.0
    has_local: bool = False
    max_abs: float = 0.0
    local_max_abs: float = 0.0

    def add(self, expected: torch.Tensor, actual: torch.Tensor, local: torch.Tensor | None) -> None:
        self.signal += float(expected.pow(2).sum())
        self.noise += float((expected - actual).pow(2).sum())
        self.max_abs = max(
            self.max_abs, float((expected - actual).abs().max()) if expected.numel() else 0.0
        )
        if local is not None and local.shape == expected.shape:
            self.has_local = True
            self.local_signal += float(expected.pow(2).sum())
            self.local_noise += float((expected - local).pow(2).sum())
            if expected.numel():
                self.local_max_abs = max(self.local_max_abs, float((expected - local).abs().max()))


def _db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _labels(model: nn.Module) -> dict[str, tuple[str, str]]:
    state = getattr(model, "meta", {}).get(META_KEY)
    if not isinstance(state, FlowState):
        return {}
    from fxquant.flow import explain  # lazy, as above

    report = explain(model, show=False)
    return {
        e.node: (e.pattern or e.op, str(e.status))
        for e in report.entries()
        if e.status in _QUANTIZED
    }


def _scaled_by_equalization(model: nn.Module) -> dict[str, torch.Tensor]:
    """Nodes whose values equalization scaled on purpose (a folded scale), and by what."""
    from fxquant.flow.equalize import EQUALIZATION_KEY  # lazy, as above

    scaled: dict[str, torch.Tensor] = {}
    for pair in getattr(model, "meta", {}).get(EQUALIZATION_KEY, ()):
        if pair.scale is not None:
            for name in pair.scaled_nodes:
                scaled[name] = scaled.get(name, torch.ones_like(pair.scale)) * pair.scale
    return scaled


def compare(float_model: nn.Module, quantized_model: nn.Module, inputs: Any) -> Comparison:
    """Per quantized node, the SQNR of ``quantized_model``'s value against ``float_model``'s.

    Args:
        float_model: the float model that was prepared (or its traced GraphModule),
            or a reference model when ``quantized_model`` is its lowered form.
        quantized_model: from ``convert_to_reference_fx`` or ``convert_fx``; any
            other callable (a deployed program) is compared at its output only.
        inputs: the positional inputs of one call (a tensor or a tuple), or a
            list of them (batches; errors are summed over all of them).

    Returns:
        A :class:`Comparison`: one row per quantized node (``explain``'s
        quantized, reference and lowered nodes) that has a float counterpart,
        then ``output``.

    Raises:
        ConfigTypeError: ``float_model`` is not an ``nn.Module``.

    Example:
        >>> import torch, fxquant
        >>> from fxquant.flow import convert_fx, prepare_fx
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        >>> x = torch.randn(8, 4)
        >>> prepared = prepare_fx(model, fxquant.get_default_qconfig_mapping("reference"), (x,))
        >>> _ = prepared(x)
        >>> result = compare(model, convert_fx(prepared), x)
        >>> [row.node for row in result]
        ['_0', 'output']
    """
    if not isinstance(float_model, nn.Module):
        msg = f"float_model must be an nn.Module, got {type(float_model).__name__}"
        raise ConfigTypeError(msg)
    batches = _batches(inputs)
    float_gm = _float_graph(float_model, quantized_model)
    float_sites = _sites(float_gm, {n.name for n in float_gm.graph.nodes})
    labels = _labels(quantized_model)
    # a reference model compared with its lowered form is equalized the same way
    scaled = (
        {} if _scaled_by_equalization(float_model) else _scaled_by_equalization(quantized_model)
    )
    is_graph = isinstance(quantized_model, fx.GraphModule)
    sites = _sites(quantized_model, set(labels)) if is_graph else {}  # type: ignore[arg-type]
    sums: dict[str, _Sums] = {}
    steps: dict[str, float] = {}
    with torch.no_grad():
        for batch in batches:
            reference = _Run(float_gm, float_sites, None)
            expected_out = _outputs(reference.run(*batch))
            expected = {k: _rescale(v, scaled.get(k)) for k, v in reference.values.items()}
            if is_graph:
                plain = _Run(quantized_model, sites, None)  # type: ignore[arg-type]
                actual_out = _outputs(plain.run(*batch))
                forced = _Run(quantized_model, sites, expected)  # type: ignore[arg-type]
                forced.run(*batch)
                steps.update(plain.steps)
                for name, value in plain.values.items():
                    if name in expected and expected[name].shape == value.shape:
                        sums.setdefault(name, _Sums()).add(
                            expected[name], value, forced.values.get(name)
                        )
            else:
                actual_out = _outputs(quantized_model(*batch))
            for want, got in zip(expected_out, actual_out, strict=False):
                sums.setdefault("output", _Sums()).add(want, got, None)
    return Comparison(tuple(_rows(sums, labels, steps, float_gm)))


def _rescale(value: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    if scale is None or value.shape[-1:] != scale.shape:
        return value
    return value * scale


def _rows(
    sums: Mapping[str, _Sums],
    labels: Mapping[str, tuple[str, str]],
    steps: Mapping[str, float],
    float_gm: fx.GraphModule,
) -> Iterable[NodeError]:
    order = [n.name for n in float_gm.graph.nodes if n.name in sums and n.op != "output"]
    for name in [*order, "output"]:
        if name not in sums:
            continue
        total = sums[name]
        pattern, status = labels.get(name, ("output", "-"))
        local = _db(total.local_signal, total.local_noise) if total.has_local else None
        step = steps.get(name)
        yield NodeError(
            node=name,
            pattern=pattern,
            status=status,
            sqnr=_db(total.signal, total.noise),
            local_sqnr=local,
            max_abs=total.max_abs,
            steps=None if step is None else total.max_abs / step,
            local_steps=None if step is None or local is None else total.local_max_abs / step,
        )
