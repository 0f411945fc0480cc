"""Float fallback under a budget: keep the most sensitive patterns float, fewest first.

The recipe (the accuracy-aware loops of OpenVINO/NNCF and Intel Neural
Compressor, driven here by a ``QConfigMapping`` so the answer is reviewable and
reusable with any backend):

1. quantize with the user's mapping and score it; done if the budget holds;
2. rank every quantized pattern by its output gain (:func:`fxquant.numerics.compare`:
   how much the model output's SQNR improves when that pattern alone runs float, one
   swap run per quantized node on the first calibration batch), largest first;
3. keep the next pattern of the ranking float (a ``None`` entry naming it in a copy of
   the mapping), quantize again and score, until the budget holds; a try whose score
   drops is taken back, and the patterns left are ranked again on the model as it is;
4. verify: try giving back each float pattern, most recently added first; keep it
   quantized when the budget still holds without it.

The answer is the mapping with those ``None`` entries (``to_json`` serializes it),
the float patterns with their sensitivity, and the score after every step.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from fxquant.config.backend import BackendConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigError
from fxquant.flow import convert_fx, convert_to_reference_fx, prepare_fx
from fxquant.flow.state import flow_state, node_info
from fxquant.tools.debug.budget import Budget, Evaluate, as_budget, cosine_score
from fxquant.tools.debug.compare import compare
from fxquant.tools.debug.fallback_report import FallbackResult, FallbackStep

__all__ = ["fallback"]


@dataclass(frozen=True)
class _Setup:
    model: nn.Module
    example_inputs: tuple[Any, ...]
    batches: list[tuple[Any, ...]]
    backend_config: BackendConfig | None
    lowered: bool
    evaluate: Evaluate
    min_score: float
    equalization: QConfigMapping | None = None
    """The backend's graph mode's equalization, once the first try picked one."""


def _batches(data: Iterable[Any]) -> list[tuple[Any, ...]]:
    batches = [b if isinstance(b, tuple) else (b,) for b in data]
    if not batches:
        msg = "calibration_data is empty: give at least one batch of inputs"
        raise ConfigError(msg)
    return batches


def _quantize(setup: _Setup, mapping: QConfigMapping) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The prepared-and-calibrated model and its converted form."""
    prepared = prepare_fx(
        copy.deepcopy(setup.model),
        mapping,
        setup.example_inputs,
        _equalization_config=setup.equalization,
        backend_config=setup.backend_config,
    )
    with torch.no_grad():
        for batch in setup.batches:
            prepared(*batch)
    convert = convert_fx if setup.lowered else convert_to_reference_fx
    return prepared, convert(prepared)


@dataclass(frozen=True)
class _Unit:
    """A quantized pattern: the nodes that go float together, and how the mapping names them."""

    name: str
    nodes: tuple[str, ...]
    keys: tuple[tuple[Any, ...], ...]  # ("module_name", path) / ("order", scope, type, index)


def _units(prepared: fx.GraphModule) -> list[_Unit]:
    from fxquant.flow import explain  # why: run-time cycle

    quantized = {
        e.node for e in explain(prepared, show=False).entries() if str(e.status) == "quantized"
    }
    groups: dict[str, list[fx.Node]] = {}
    for node in prepared.graph.nodes:
        if node.name in quantized:
            anchor = node_info(node).anchor or node.name
            groups.setdefault(anchor, []).append(node)
    units = []
    for anchor, nodes in groups.items():
        keys: list[tuple[Any, ...]] = []
        for node in nodes:
            if node.op == "call_module":
                keys.append(("module_name", str(node.target)))
            else:
                keys.extend(("order", *key) for key in node_info(node).call_orders[:1])
        if keys:
            units.append(_Unit(nodes[-1].name, tuple(n.name for n in nodes), tuple(keys)))
        del anchor
    return units


def _with_float(mapping: QConfigMapping, units: Iterable[_Unit]) -> QConfigMapping:
    chosen = copy.deepcopy(mapping)
    for unit in units:
        for key in unit.keys:
            if key[0] == "module_name":
                chosen.set_module_name(key[1], None)
            else:
                _, scope, object_type, index = key
                chosen.set_module_name_object_type_order(scope, object_type, index, None)
    return chosen


def _entries(units: Iterable[_Unit]) -> tuple[str, ...]:
    lines = []
    for unit in units:
        for key in unit.keys:
            if key[0] == "module_name":
                lines.append(f"set_module_name({key[1]!r}, None)")
            else:
                name = getattr(key[2], "__name__", str(key[2]))
                lines.append(
                    f"set_module_name_object_type_order({key[1]!r}, {name}, {key[3]}, None)"
                )
    return tuple(lines)


def _sensitivity(setup: _Setup, units: list[_Unit], reference: nn.Module) -> dict[str, float]:
    """Each unit's output gain (dB) when it alone runs float, largest first: compare's ranking
    on the first calibration batch (one swap run per quantized node). A unit whose nodes
    cannot run float on the quantized values comes last, the lowest local SQNR first."""
    rows = {row.node: row for row in compare(setup.model, reference, setup.batches[:1])}
    ranked: list[tuple[float, float, str]] = []
    for unit in units:
        found = [rows[name] for name in unit.nodes if name in rows]
        gains = [row.gain for row in found if row.gain is not None]
        local = [row.sqnr if row.local_sqnr is None else row.local_sqnr for row in found]
        ranked.append((max(gains, default=-math.inf), min(local, default=math.inf), unit.name))
    ranked.sort(key=lambda item: (-item[0], item[1]))
    return {name: gain for gain, _, name in ranked}


def fallback(  # noqa: PLR0913  # five positional (the prepare_fx inputs + budget), the rest keyword-only
    model: nn.Module,
    qconfig_mapping: QConfigMapping,
    example_inputs: tuple[Any, ...],
    calibration_data: Iterable[Any],
    budget: Budget | float,
    *,
    backend_config: BackendConfig | None = None,
    lowered: bool = True,
    max_float: int | None = None,
) -> FallbackResult:
    """Quantize ``model`` keeping the fewest, most sensitive patterns float that meet ``budget``.

    Args:
        model: the float model, in eval mode (not modified: each try quantizes a copy).
        qconfig_mapping: the mapping to start from (e.g. the backend's default;
            when the backend picks a graph mode for it, every try starts from this
            mapping with the mode merged in, and the mode's equalization).
        example_inputs: as for ``prepare_fx``.
        calibration_data: batches of positional inputs (a tensor or a tuple each);
            they calibrate every try, rank the patterns, and feed the cosine budget.
        budget: a :class:`Budget`, or a number: the mean cosine to float outputs
            (``Budget.cosine``).
        backend_config: the backend (None: this host's native backend, as ``prepare_fx``).
        lowered: score the ``convert_fx`` model (default) or, if False, the
            ``convert_to_reference_fx`` one.
        max_float: stop after this many float patterns (default: no limit).

    Returns:
        A :class:`FallbackResult`; ``met`` says whether the budget holds (when
        no choice meets it, everything ranked was tried and the best-scoring
        float set is returned).

    Raises:
        ConfigError: empty ``calibration_data``.
        ConfigTypeError: ``budget`` is neither a ``Budget`` nor a number.

    Example:
        >>> import torch, fxquant
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
        >>> data = [torch.randn(8, 4) for _ in range(2)]
        >>> result = fallback(model, fxquant.get_default_qconfig_mapping("reference"),
        ...                   (data[0],), data, budget=0.9)
        >>> result.met, result.float_nodes
        (True, ())
    """
    budget = as_budget(budget)
    batches = _batches(calibration_data)
    evaluate = budget.evaluate or cosine_score(model, batches)
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    setup = _Setup(
        model, example_inputs, batches, backend_config, lowered, evaluate, budget.min_score
    )
    return _search(setup, qconfig_mapping, max_float)


def _search(setup: _Setup, mapping: QConfigMapping, max_float: int | None) -> FallbackResult:
    from fxquant.flow import convert_to_reference_fx  # why: run-time cycle

    prepared, quantized = _quantize(setup, mapping)
    setup, mapping = _adopt_graph_mode(prepared, setup, mapping)
    score = setup.evaluate(quantized)
    steps = [FallbackStep("quantize all", None, score, ())]
    units = _units(prepared)
    sensitivity = _sensitivity(setup, units, convert_to_reference_fx(prepared))
    by_name = {u.name: u for u in units}
    limit = len(units) if max_float is None else min(max_float, len(units))
    chosen, (model, score), best = _keep_float(
        setup, mapping, (by_name, list(sensitivity)), (quantized, score), (steps, limit)
    )
    if score < setup.min_score:  # not met: the best try, with every step recorded
        final_score, final_model, final_mapping, floats = best
        kept = [by_name[n] for n in floats]
        return FallbackResult(
            final_mapping,
            final_model,
            floats,
            sensitivity,
            tuple(steps),
            final_score,
            False,
            _entries(kept),
            setup.equalization,
        )
    chosen, model, score = _verify(setup, mapping, chosen, (model, score), steps)
    return FallbackResult(
        _with_float(mapping, chosen),
        model,
        tuple(u.name for u in chosen),
        sensitivity,
        tuple(steps),
        score,
        True,
        _entries(chosen),
        setup.equalization,
    )


_Best = tuple[float, nn.Module, QConfigMapping, tuple[str, ...]]


def _keep_float(
    setup: _Setup,
    mapping: QConfigMapping,
    ranking: tuple[dict[str, _Unit], list[str]],
    current: tuple[nn.Module, float],
    record: tuple[list[FallbackStep], int],
) -> tuple[list[_Unit], tuple[nn.Module, float], _Best]:
    """Keep the next unit of the ranking float until the budget holds (or ``limit`` units).

    A step that lowers the score is taken back (recorded ``kept=False``: an output gain
    that another quantized node's input quantization takes away again, or calibration
    that moved) and the units left are ranked again on the model as it is. A step that
    keeps the score is kept: its gain may need the next one (an add and its LayerNorm).
    """
    from fxquant.flow import convert_to_reference_fx  # why: run-time cycle

    (by_name, order), (model, score), (steps, limit) = ranking, current, record
    chosen: list[_Unit] = []
    best: _Best = (score, model, mapping, ())
    reference = None
    while order and len(chosen) < limit and score < setup.min_score:
        name = order.pop(0)
        trial = [*chosen, by_name[name]]
        mapping_now = _with_float(mapping, trial)
        prepared, candidate = _quantize(setup, mapping_now)
        trial_score = setup.evaluate(candidate)
        floats = tuple(u.name for u in trial)
        kept = trial_score >= score
        steps.append(FallbackStep("keep float", name, trial_score, floats, kept=kept))
        if kept:
            chosen, model, score, reference = trial, candidate, trial_score, prepared
            best = max(best, (score, model, mapping_now, floats), key=lambda item: item[0])
        elif order and reference is not None:
            left = [by_name[n] for n in order]
            order = list(_sensitivity(setup, left, convert_to_reference_fx(reference)))
            reference = None  # ranked on this model: again only after the next kept step
    return chosen, (model, score), best


def _adopt_graph_mode(
    prepared: nn.Module, setup: _Setup, mapping: QConfigMapping
) -> tuple[_Setup, QConfigMapping]:
    """The setup and mapping every later try uses: with the backend's graph mode merged in.

    The backend quantized this graph its own way, its mode merged into the mapping
    (``fxquant.flow.graph_mode``): the tries and the result state that mapping and the
    mode's equalization themselves, so the result reproduces the model without the mode.
    """
    state = flow_state(prepared)
    mode = state.graph_mode if state is not None else None
    if state is None or mode is None:
        return setup, mapping
    return dataclasses.replace(setup, equalization=mode.equalization), state.qconfig_mapping


def _verify(
    setup: _Setup,
    mapping: QConfigMapping,
    chosen: list[_Unit],
    current: tuple[nn.Module, float],
    steps: list[FallbackStep],
) -> tuple[list[_Unit], nn.Module, float]:
    """Give back each float pattern (latest first) that the budget does not need; again
    until a whole pass gives nothing back, so that each one left is needed by the others."""
    quantized, score = current
    changed = True
    while changed:
        changed = False
        for unit in list(reversed(chosen)):
            trial = [u for u in chosen if u is not unit]
            candidate = _quantize(setup, _with_float(mapping, trial))[1]
            trial_score = setup.evaluate(candidate)
            holds = trial_score >= setup.min_score
            names = tuple(u.name for u in trial)
            steps.append(FallbackStep("give back", unit.name, trial_score, names, kept=holds))
            if holds:
                chosen, quantized, score, changed = trial, candidate, trial_score, True
    return chosen, quantized, score
