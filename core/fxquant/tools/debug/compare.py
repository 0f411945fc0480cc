"""The numerics debugger: per quantized node, how far its value is from the float model's.

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

and, per quantized node, one more run with that node alone in float: its **output gain**,
how much the model output's SQNR improves (:mod:`.float_swap`), the ranking of
:meth:`Comparison.worst` and of ``fallback``.

``compare(reference, lowered, inputs)`` works the same way: the reference model
plays the float model, and ``steps`` says how many quantization steps apart the
two are (a sound lowering stays within one per quantized node).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from fxquant.errors import ConfigTypeError
from fxquant.flow import fuse_fx
from fxquant.flow.equalization.prepare import EQUALIZATION_KEY
from fxquant.flow.report import NodeStatus
from fxquant.flow.state import META_KEY, FlowState
from fxquant.tools.debug.comparison import Comparison, NodeError
from fxquant.tools.debug.float_swap import GainRuns as _GainRuns
from fxquant.tools.debug.float_swap import output_gains
from fxquant.tools.debug.node_values import ValueRun, value_sites

__all__ = ["compare"]

_QUANTIZED = {NodeStatus.QUANTIZED, NodeStatus.REFERENCE, NodeStatus.LOWERED}


def _batches(inputs: Any) -> list[tuple[Any, ...]]:
    if isinstance(inputs, list):
        return [b if isinstance(b, tuple) else (b,) for b in inputs]
    return [inputs if isinstance(inputs, tuple) else (inputs,)]


def _float_graph(model: nn.Module, quantized: nn.Module) -> fx.GraphModule:
    """The float model as a graph with prepare's node names (traced and fused the same way)."""
    if isinstance(model, fx.GraphModule):
        return model
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
        self.signal += _power(expected)
        self.noise += _power(expected - actual)
        self.max_abs = max(
            self.max_abs, float((expected - actual).abs().max()) if expected.numel() else 0.0
        )
        if local is not None and local.shape == expected.shape:
            self.has_local = True
            self.local_signal += _power(expected)
            self.local_noise += _power(expected - local)
            if expected.numel():
                self.local_max_abs = max(self.local_max_abs, float((expected - local).abs().max()))


def _power(values: torch.Tensor) -> float:
    """The sum of squares in float64: float32 overflows past 1.8e19 (a QAT-broken model's
    activations reach 1e17), and an infinite noise would read as no signal at all."""
    return float(values.double().pow(2).sum())


def _db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    if signal == 0.0 or math.isinf(noise):
        return -math.inf
    # the difference of logs: signal / noise underflows to 0 when both are extreme
    return 10.0 * (math.log10(signal) - math.log10(noise))


def _labels(model: nn.Module) -> dict[str, tuple[str, str]]:
    state = getattr(model, "meta", {}).get(META_KEY)
    if not isinstance(state, FlowState):
        return {}
    from fxquant.flow import explain  # why: a cycle at run time (as above)

    report = explain(model, show=False)
    return {
        e.node: (e.pattern or e.op, str(e.status))
        for e in report.entries()
        if e.status in _QUANTIZED
    }


def _scaled_by_equalization(model: nn.Module) -> dict[str, torch.Tensor]:
    """Nodes whose values equalization scaled on purpose (a folded scale), and by what."""
    scaled: dict[str, torch.Tensor] = {}
    for pair in getattr(model, "meta", {}).get(EQUALIZATION_KEY, ()):
        if pair.scale is not None:
            for name in pair.scaled_nodes:
                scaled[name] = scaled.get(name, torch.ones_like(pair.scale)) * pair.scale
    return scaled


def compare(
    float_model: nn.Module, quantized_model: nn.Module, inputs: Any, *, gains: bool = True
) -> Comparison:
    """Per quantized node, the SQNR of ``quantized_model``'s value against ``float_model``'s.

    Args:
        float_model: the float model that was prepared (or its traced GraphModule),
            or a reference model when ``quantized_model`` is its lowered form.
        quantized_model: from ``convert_to_reference_fx`` or ``convert_fx``; any
            other callable (a deployed program) is compared at its output only.
        inputs: the positional inputs of one call (a tensor or a tuple), or a
            list of them (batches; errors are summed over all of them).
        gains: measure each node's output gain (one more run of the model per
            quantized node, most of the time ``compare`` takes); ``False`` leaves
            every row's ``gain`` None, for a caller that reads only the errors.

    Returns:
        A :class:`Comparison`: one row per quantized node (``explain``'s
        quantized, reference and lowered nodes) that has a float counterpart,
        then ``output``. ``worst(n)`` gives the nodes of largest output gain.

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
    float_sites = value_sites(float_gm, {n.name for n in float_gm.graph.nodes})
    labels = _labels(quantized_model)
    # a reference model compared with its lowered form is equalized the same way
    scaled = (
        {} if _scaled_by_equalization(float_model) else _scaled_by_equalization(quantized_model)
    )
    sums: dict[str, _Sums] = {}
    steps: dict[str, float] = {}
    expected_outs: list[list[torch.Tensor]] = []
    with torch.no_grad():
        for batch in batches:
            reference = ValueRun(float_gm, float_sites, None)
            expected_outs.append(_outputs(reference.run(*batch)))
            expected = {k: _rescale(v, scaled.get(k)) for k, v in reference.values.items()}
            actual_out = _node_errors(quantized_model, labels, batch, expected, (sums, steps))
            for want, got in zip(expected_outs[-1], actual_out, strict=False):
                sums.setdefault("output", _Sums()).add(want, got, None)
        found: dict[str, float] = {}
        if gains and isinstance(quantized_model, fx.GraphModule):
            names = [name for name in labels if name in sums]
            runs = _GainRuns(float_gm, quantized_model, scaled, _outputs)
            found = output_gains(runs, names, batches, expected_outs)
    return Comparison(tuple(_rows(sums, labels, steps, float_gm, found)))


def _node_errors(
    quantized_model: nn.Module,
    labels: Mapping[str, tuple[str, str]],
    batch: tuple[Any, ...],
    expected: Mapping[str, torch.Tensor],
    into: tuple[dict[str, _Sums], dict[str, float]],
) -> list[torch.Tensor]:
    """One batch through the quantized model, as it is and fed the float values; each
    node's errors added to ``into`` (sums, steps). Returns the model's outputs."""
    if not isinstance(quantized_model, fx.GraphModule):
        return _outputs(quantized_model(*batch))  # a callable: compared at its output only
    sums, steps = into
    sites = value_sites(quantized_model, set(labels))
    plain = ValueRun(quantized_model, sites, None)
    actual_out = _outputs(plain.run(*batch))
    forced = ValueRun(quantized_model, sites, expected)
    forced.run(*batch)
    steps.update(plain.steps)
    for name, value in plain.values.items():
        if name in expected and expected[name].shape == value.shape:
            sums.setdefault(name, _Sums()).add(expected[name], value, forced.values.get(name))
    return actual_out


def _rescale(value: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    if scale is None or value.shape[-1:] != scale.shape:
        return value
    return value * scale


def _rows(
    sums: Mapping[str, _Sums],
    labels: Mapping[str, tuple[str, str]],
    steps: Mapping[str, float],
    float_gm: fx.GraphModule,
    gains: Mapping[str, float],
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
            gain=gains.get(name),
        )
