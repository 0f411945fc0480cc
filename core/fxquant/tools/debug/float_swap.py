"""Output gain: how much the quantized model's output improves when one node alone runs float.

What :func:`fxquant.numerics.fallback` ranks its steps by (keep one pattern float),
measured without quantizing again: for each quantized node N, one run of the quantized
model in which N computes its float op (the float model's node of the same name, its
float module or function) on the values this run has for N's inputs, and N's readers get
that float value in place of N's quantized one (N's output quantize/dequantize skipped)::

    quantized run:  ... -> q/dq -> N (quantized) -> quantize -> dequantize -> readers
    swap run of N:  ... -> q/dq -> N's float op on the same inputs ----------> readers

The gain is the model output's SQNR against the float model's with N swapped, minus
the SQNR with nothing swapped (dB, summed over the batches). Local error (the node fed
the float model's inputs) says how wrong a node is; the gain says how much of the
output's error it causes, through everything downstream of it. N's output quantization
counts as N's: where a quantized node reads N (a residual add and its LayerNorm), that
quantization goes only once both are float, and the gain ranks both early, where keeping
N alone float may buy little (fallback keeps such a step unless its score drops).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx import Node

from fxquant.lowering import DEQUANTIZE_OPS
from fxquant.tools.debug.node_values import Site, ValueRun, value_sites

__all__ = ["GainRuns", "SwapRun", "output_gains"]


class _Unmatched(Exception):
    """A float input of the swapped node has no value in the quantized run."""


class SwapRun(ValueRun):
    """Runs the quantized ``gm`` with the nodes named in ``swapped`` computing in float."""

    def __init__(
        self,
        gm: fx.GraphModule,
        sites: Mapping[Node, Site],
        setup: GainRuns,
        swapped: Collection[str],
    ) -> None:
        super().__init__(gm, sites, None)
        float_gm = setup.float_gm
        self.float_gm, self.scaled = float_gm, setup.scaled
        self.float_nodes = {n.name: n for n in float_gm.graph.nodes}
        self.swapped = set(swapped)
        # a node running float has no output quantize: each dequantize after it hands its
        # readers the float value
        self.ends = {
            end: site.name
            for node, site in sites.items()
            if site.name in self.swapped
            for end in _dequantizes(site)
        }
        self.pending: dict[str, torch.Tensor] = {}
        self.done: set[str] = set()

    def run_node(self, n: Node) -> Any:
        if n in self.ends and self.ends[n] in self.pending:
            return self.pending[self.ends[n]]
        out = super().run_node(n)
        if n.op == "placeholder" and isinstance(out, torch.Tensor):
            self.values.setdefault(n.name, _as_float_value(out))
        site = self.sites.get(n)
        if site is None or site.name not in self.swapped or not isinstance(out, torch.Tensor):
            return out
        value = self._float_value(site.name)
        if value is None or value.shape != out.shape:
            return out
        value = _scale(value, self.scaled.get(site.name), up=True)
        self.done.add(site.name)
        self.values[site.name] = _as_float_value(value)
        if site.chain:
            self.pending[site.name] = value.float()
            return out
        return self._force(site, out, value)  # a kernel's integers: the float value, requantized

    def _float_value(self, name: str) -> torch.Tensor | None:
        node = self.float_nodes.get(name)
        if node is None:
            return None
        try:
            args = fx.node.map_arg(node.args, self._input)
            kwargs = fx.node.map_arg(node.kwargs, self._input)
        except _Unmatched:
            return None
        value = _call(self.float_gm, node, args, kwargs)
        return value if isinstance(value, torch.Tensor) else None

    def _input(self, arg: Node) -> Any:
        if arg.op == "get_attr":
            return operator.attrgetter(str(arg.target))(self.float_gm)
        if arg.name not in self.values:
            raise _Unmatched(arg.name)
        return _scale(self.values[arg.name], self.scaled.get(arg.name), up=False)


def _as_float_value(value: torch.Tensor) -> torch.Tensor:
    """A float model's input as its op reads it: float32 for floating values; integers (an
    embedding's token ids, a mask) stay integers, as the float model took them."""
    return value.detach().float() if value.is_floating_point() else value.detach()


def _dequantizes(site: Site) -> list[Node]:
    if not site.chain:
        return []
    return [
        u for u in site.chain[0].users if u.op == "call_function" and u.target in DEQUANTIZE_OPS
    ]


def _scale(value: torch.Tensor, scale: torch.Tensor | None, *, up: bool) -> torch.Tensor:
    """An equalized model's value (the float one times the folded scale) from the float
    one (``up``), or the float one from it."""
    if scale is None or value.shape[-1:] != scale.shape:
        return value
    return value * scale if up else value / scale


@dataclass(frozen=True)
class GainRuns:
    """What every swap run shares: the float graph, the quantized model, the scales
    equalization folded into the quantized model's values, and how outputs flatten."""

    float_gm: fx.GraphModule
    quantized: fx.GraphModule
    scaled: Mapping[str, torch.Tensor]
    outputs: Callable[[Any], list[torch.Tensor]]

    def run(
        self, sites: Mapping[Node, Site], swapped: Collection[str], batch: tuple[Any, ...]
    ) -> tuple[list[torch.Tensor], bool]:
        """The outputs of one run with ``swapped`` in float, and whether any swap happened."""
        run = SwapRun(self.quantized, sites, self, swapped)
        return self.outputs(run.run(*batch)), bool(run.done)


def _call(gm: fx.GraphModule, node: Node, args: Any, kwargs: Any) -> Any:
    """Run one node of ``gm`` on the given arguments."""
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    if node.op == "call_function":
        target: Callable[..., Any] = node.target  # type: ignore[assignment]  # op is call_function
        return target(*args, **kwargs)
    return None


def _noise(
    expected: Sequence[list[torch.Tensor]], outputs: Sequence[list[torch.Tensor]]
) -> tuple[float, float]:
    signal = noise = 0.0
    for want_all, got_all in zip(expected, outputs, strict=True):
        for want, got in zip(want_all, got_all, strict=False):
            signal += float(want.pow(2).sum())
            noise += float((want - got).pow(2).sum())
    return signal, noise


def _db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    return -math.inf if signal == 0.0 else 10.0 * math.log10(signal / noise)


def output_gains(
    runs: GainRuns,
    names: Collection[str],
    batches: Sequence[tuple[Any, ...]],
    expected: Sequence[list[torch.Tensor]],
) -> dict[str, float]:
    """Per node in ``names``, the output SQNR gained when it alone runs float (dB).

    ``expected`` holds the float model's outputs per batch (flattened as ``runs.outputs``
    does). A node whose float op cannot run on the quantized run's values (an input with
    no float counterpart, another shape) is left out.
    """
    sites = value_sites(runs.quantized, {n.name for n in runs.float_gm.graph.nodes})
    base = [runs.run(sites, (), b)[0] for b in batches]
    before = _db(*_noise(expected, base))
    gains: dict[str, float] = {}
    for name in names:
        swapped = [runs.run(sites, (name,), b) for b in batches]
        if not any(done for _, done in swapped):
            continue
        after = _db(*_noise(expected, [outs for outs, _ in swapped]))
        gains[name] = after - before if math.isfinite(before) else 0.0
    return gains
