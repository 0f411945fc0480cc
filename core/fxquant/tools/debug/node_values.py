"""Where each node's value is, in a float, reference or lowered model, and a run reading them.

A node's value is what the next op reads: a reference model's node through its
output quantize/dequantize steps; a lowered kernel's integers, dequantized with
the output qparams lowering recorded on it (``flow/epilogues.py``'s keys), or its
float output where it took that dequantize in (still on that grid: steps are counted
on it). Values are copies: an in-place reader must not rewrite what was read. A run
can also replace each value by a given one before the next node reads it: fed
the float model's values, each node then shows its own (local) error.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx import Node

from fxquant.flow.epilogues import OUTPUT_OF_KEY, OUTPUT_QPARAMS_KEY, is_identity
from fxquant.lowering import DEQUANTIZE_OPS, STATIC_QUANTIZE_OPS, QParams

__all__ = ["Site", "ValueRun", "value_sites"]


@dataclass(frozen=True, slots=True)
class Site:
    name: str  # the float graph's node name
    chain: tuple[Node, ...]  # output quantize -> dequantize applied to the node's output
    qparams: QParams | None  # to read an integer output (a kernel's)


def _static_step(node: Node) -> float | None:
    if (
        node.target in STATIC_QUANTIZE_OPS
        and len(node.args) > 1
        and isinstance(node.args[1], float)
    ):
        return float(node.args[1])
    return None


def _passes_on(gm: fx.GraphModule, node: Node) -> bool:
    return node.op == "call_module" and is_identity(gm.get_submodule(str(node.target)))


def _output_chain(gm: fx.GraphModule, node: Node) -> tuple[Node, ...]:
    """The quantize -> dequantize steps that read ``node``'s value, through identities.

    An eval-mode dropout between a float-output Linear and the next quantize step is
    no step at all: lowering drops it and the kernel takes the quantize step in, so
    the reference's value is read after the quantize as the kernel's is.
    """
    users = list(node.users)
    while len(users) == 1 and _passes_on(gm, users[0]):
        users = list(users[0].users)
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


def value_sites(gm: fx.GraphModule, names: set[str]) -> dict[Node, Site]:
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
        sites[node] = Site(name, _output_chain(gm, node), node.meta.get(OUTPUT_QPARAMS_KEY))
    return sites


def _grid(qparams: QParams | None) -> tuple[float, float] | None:
    """(scale, zero point) of a per-tensor output grid, or None where there is none."""
    if qparams is None or qparams.scale is None or qparams.is_per_channel:
        return None
    return float(qparams.scale), float(qparams.zero_point or 0)


class ValueRun(fx.Interpreter):
    """Runs ``gm``, reading every site's value; replaces it by ``forced[name]`` if given."""

    def __init__(
        self, gm: fx.GraphModule, sites: Mapping[Node, Site], forced: Mapping[str, Any] | None
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

    def _value(self, site: Site, out: torch.Tensor) -> torch.Tensor | None:
        for step in site.chain:
            args = [self._constant(a) for a in step.args[1:]]
            out = step.target(out, *args)  # type: ignore[operator]
            scale = _static_step(step)
            if scale is not None:
                self.steps[site.name] = scale
        grid = _grid(site.qparams)
        if grid is not None:
            # a kernel's integers, or its float output with the dequantize taken in:
            # either way the values lie on its output grid, so steps can be counted
            self.steps[site.name] = grid[0]
        if out.is_floating_point():
            # a copy: an in-place op reading the node (SiLU(inplace=True)) would rewrite it
            return out.detach().float().clone()
        if grid is None:
            return None
        return (out.float() - grid[1]) * grid[0]

    def _constant(self, arg: Any) -> Any:
        if isinstance(arg, Node) and arg.op == "get_attr":
            return operator.attrgetter(str(arg.target))(self.module)
        if isinstance(arg, Node):
            return self.env[arg]
        return arg

    def _force(self, site: Site, out: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        if value.shape != out.shape:
            return out
        if out.is_floating_point():
            # a copy: an in-place op reading it would rewrite the expected value
            return value.to(out.dtype, copy=True)
        qparams = site.qparams
        if qparams is None or qparams.scale is None or qparams.is_per_channel:
            return out
        scaled = torch.round(value / float(qparams.scale)) + float(qparams.zero_point or 0)
        return scaled.clamp(qparams.quant_min, qparams.quant_max).to(out.dtype)
