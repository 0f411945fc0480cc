"""Per node int8, bf16 or fp32 under an accuracy budget and a latency budget at once.

:func:`fxquant.numerics.fallback` keeps nodes float until an accuracy budget holds; on a
CPU with bfloat16 units a node that int8 costs too much accuracy has a cheaper way out
than float32, and the choice is a trade of measured time against accuracy:

1. candidates: the Linear and Conv modules the mapping quantizes; each offered in int8
   (the mapping's qconfig), bf16 (where the backend accepts ``bfloat16_static_qconfig``
   for it) and fp32;
2. each node alone is timed in each precision on its input captured while the
   calibration data runs (:mod:`.node_timing`);
3. every node starts at its fastest precision; the model is quantized and scored;
4. while the accuracy budget misses: the node of largest output gain (``compare``'s
   ranking) tries each more accurate precision, least measured time first; the first that
   meets the budget is kept, else the best-scoring one if it scores better;
5. the latency estimate (the float model's time with each node's time replaced by its
   chosen precision's) is checked against the latency budget, and the verdict says which
   budget holds and, where one cannot, why.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

from fxquant.config.backend import BackendConfig
from fxquant.config.defaults import bfloat16_static_qconfig
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigError
from fxquant.flow import explain, prepare_fx
from fxquant.tools.debug.budget import Budget, as_budget, cosine_score
from fxquant.tools.debug.compare import compare
from fxquant.tools.debug.fallback import _batches, _quantize, _Setup
from fxquant.tools.debug.node_timing import PRECISIONS, capture_inputs, median_ms, time_node
from fxquant.tools.debug.precision_report import PrecisionChoice, PrecisionResult, is_budget

__all__ = ["choose_precision"]

_WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)

Offered = dict[str, dict[str, QConfig | None]]
"""Per node (module path), the qconfig of each precision the backend offers it in."""


@dataclass
class _Search:
    """The search's state: each node's precision and why, the score and its model."""

    choice: dict[str, str]
    why: dict[str, str]
    score: float
    model: nn.Module
    prepared: fx.GraphModule


def _quantized_modules(setup: _Setup, mapping: QConfigMapping) -> set[str]:
    """The module paths that ``mapping`` quantizes (prepared only, not calibrated)."""
    prepared = prepare_fx(
        copy.deepcopy(setup.model),
        mapping,
        setup.example_inputs,
        backend_config=setup.backend_config,
    )
    targets = {n.name: str(n.target) for n in prepared.graph.nodes if n.op == "call_module"}
    return {
        targets[e.node]
        for e in explain(prepared, show=False).entries()
        if str(e.status) == "quantized" and e.node in targets
    }


def _offered(setup: _Setup, mapping: QConfigMapping) -> Offered:
    names = {
        name: mapping.qconfig_for(name, type(module))
        for name, module in setup.model.named_modules()
        if isinstance(module, _WEIGHTED)
    }
    int8 = _quantized_modules(setup, mapping)
    candidates = [name for name, qconfig in names.items() if qconfig is not None and name in int8]
    all_bf16 = copy.deepcopy(mapping)
    for name in candidates:
        all_bf16.set_module_name(name, bfloat16_static_qconfig)
    bf16 = _quantized_modules(setup, all_bf16)
    offered: Offered = {}
    for name in candidates:
        offered[name] = {"int8": names[name]}
        if name in bf16:
            offered[name]["bf16"] = bfloat16_static_qconfig
        offered[name]["fp32"] = None
    return offered


def _measure(setup: _Setup, offered: Offered, repeats: int) -> dict[str, dict[str, float]]:
    inputs = capture_inputs(setup.model, list(offered), setup.batches)
    modules = dict(setup.model.named_modules())
    return {
        name: time_node(modules[name], inputs[name], qconfigs, setup.backend_config, repeats)
        for name, qconfigs in offered.items()
    }


def _checked_timings(
    timings: Mapping[str, Mapping[str, float]], offered: Offered
) -> dict[str, dict[str, float]]:
    checked: dict[str, dict[str, float]] = {}
    for name, qconfigs in offered.items():
        given = timings.get(name, {})
        missing = [p for p in qconfigs if not isinstance(given.get(p), (int, float))]
        if missing:
            msg = (
                f"timings[{name!r}] lacks {', '.join(missing)}: give the measured ms of every "
                f"node in every precision it is offered in, e.g. {{{name!r}: "
                f"{ {p: 0.1 for p in qconfigs} }}} (or timings=None to measure them)"
            )
            raise ConfigError(msg)
        checked[name] = {p: float(given[p]) for p in qconfigs}
    return checked


def _mapping_for(mapping: QConfigMapping, choice: Mapping[str, str], offered: Offered) -> Any:
    chosen = copy.deepcopy(mapping)
    for name, precision in choice.items():
        if precision != "int8":
            chosen.set_module_name(name, offered[name][precision])
    return chosen


def _try(setup: _Setup, mapping: QConfigMapping) -> tuple[float, nn.Module, fx.GraphModule]:
    prepared, model = _quantize(setup, mapping)
    return setup.evaluate(model), model, prepared


def _ranked(setup: _Setup, prepared: fx.GraphModule, names: Iterable[str]) -> list[str]:
    """``names`` by output gain (``compare``), largest first."""
    from fxquant.flow import convert_to_reference_fx  # why: run-time cycle

    node_of = {str(n.target): n.name for n in prepared.graph.nodes if n.op == "call_module"}
    reference = convert_to_reference_fx(copy.deepcopy(prepared))
    rows = {row.node: row for row in compare(setup.model, reference, setup.batches[:1])}

    def gain(name: str) -> float:
        row = rows.get(node_of.get(name, ""))
        return -math.inf if row is None or row.gain is None else row.gain

    return sorted(names, key=gain, reverse=True)


def _more_accurate(
    current: str, offered: Mapping[str, object], ms: Mapping[str, float]
) -> list[str]:
    """The precisions more accurate than ``current`` offered, least measured time first."""
    rank = PRECISIONS.index(current)
    options = [p for p in offered if PRECISIONS.index(p) > rank]
    return sorted(options, key=lambda p: ms[p])


def _raise_one(
    setup: _Setup, mapping: QConfigMapping, node: str, state: _Search, known: tuple[Offered, Any]
) -> None:
    """Make ``node`` more accurate: the cheapest precision that meets the budget, else the
    best-scoring one if it scores better than now."""
    offered, measured = known
    before, score = state.choice[node], state.score
    best: tuple[float, str, nn.Module, fx.GraphModule] | None = None
    for precision in _more_accurate(before, offered[node], measured[node]):
        trial = {**state.choice, node: precision}
        result = _try(setup, _mapping_for(mapping, trial, offered))
        if best is None or result[0] > best[0]:
            best = (result[0], precision, result[1], result[2])
        if result[0] >= setup.min_score:
            break
    if best is None or best[0] <= score:
        state.why[node] += f"; more accurate ones did not raise the score ({score:.4f})"
        return
    new_score, precision, state.model, state.prepared = best
    state.choice[node], state.score = precision, new_score
    met = "meets" if new_score >= setup.min_score else "is the best try toward"
    state.why[node] = (
        f"{before} misses the accuracy budget (score {score:.4f} < {setup.min_score}); "
        f"{precision} {met} it (score {new_score:.4f}) at the least measured time"
    )


def _search(
    setup: _Setup, mapping: QConfigMapping, offered: Offered, measured: dict[str, dict[str, float]]
) -> _Search:
    choice = {name: min(ms, key=ms.__getitem__) for name, ms in measured.items()}
    why = {
        name: f"the fastest measured ({choice[name]} {measured[name][choice[name]]:.3f} ms)"
        for name in choice
    }
    state = _Search(choice, why, *_try(setup, _mapping_for(mapping, choice, offered)))
    tried: set[str] = set()
    while state.score < setup.min_score:
        left = [
            n
            for n in choice
            if n not in tried and _more_accurate(state.choice[n], offered[n], measured[n])
        ]
        if not left:
            break
        node = _ranked(setup, state.prepared, left)[0]
        tried.add(node)
        _raise_one(setup, mapping, node, state, (offered, measured))
    return state


def _verdict(result: PrecisionResult) -> str:
    if result.met_accuracy:
        accuracy = f"accuracy budget met: score {result.score:.4f} >= {result.min_score}"
    else:
        accuracy = (
            f"accuracy budget NOT met: score {result.score:.4f} < {result.min_score} with "
            f"every node tried at each more accurate precision it is offered in"
        )
    estimate, limit = result.latency_ms, result.max_latency_ms
    if limit is None:
        latency = f"latency {estimate:.3f} ms (estimated; no latency budget)"
    elif estimate <= limit:
        latency = f"latency budget met: {estimate:.3f} ms <= {limit} ms (estimated)"
    elif result.fastest_ms > limit:
        latency = (
            f"latency budget cannot be met: even every node at its fastest precision takes "
            f"{result.fastest_ms:.3f} ms > {limit} ms (estimated)"
        )
    else:
        latency = (
            f"latency budget NOT met: the accuracy budget needs {estimate:.3f} ms > {limit} ms "
            f"(estimated); the fastest choice ({result.fastest_ms:.3f} ms) misses the accuracy "
            f"budget: the two budgets cannot both hold on this backend"
        )
    return f"{accuracy}; {latency}"


def choose_precision(  # noqa: PLR0913  # the fallback's five inputs, the rest keyword-only
    model: nn.Module,
    qconfig_mapping: QConfigMapping,
    example_inputs: tuple[Any, ...],
    calibration_data: Iterable[Any],
    budget: Budget | float,
    *,
    max_latency_ms: float | None = None,
    backend_config: BackendConfig | None = None,
    lowered: bool = True,
    timings: Mapping[str, Mapping[str, float]] | None = None,
    repeats: int = 20,
) -> PrecisionResult:
    """Choose int8, bf16 or fp32 per Linear/Conv node to meet an accuracy and a latency budget.

    Args:
        model: the float model, in eval mode (not modified).
        qconfig_mapping: the mapping to start from: its qconfig is a node's int8.
        example_inputs: as for ``prepare_fx``.
        calibration_data: batches of positional inputs; they calibrate every try, feed
            the cosine budget, and give each node the input it is timed on.
        budget: the accuracy budget: a :class:`Budget`, or a minimum mean cosine to float.
        max_latency_ms: the latency budget of the whole model (estimated from the
            per-node timings); None: no latency budget.
        backend_config: the backend (None: this host's native one, as ``prepare_fx``).
            bf16 is offered for a node where its patterns accept ``bfloat16_static_qconfig``.
        lowered: score the ``convert_fx`` model (default) or the reference one.
        timings: the ms of each node in each precision (``result.to_dict()``'s
            ``choices``), instead of measuring them; the latency estimate is then their sum.
        repeats: timed calls per node and precision (their median is taken).

    Returns:
        A :class:`PrecisionResult`: per node the choice, why, and the measured ms of
        each precision; the score, the latency estimate and a verdict on both budgets.

    Raises:
        ConfigError: empty ``calibration_data``, a ``max_latency_ms`` that is not a
            positive number, ``timings`` lacking a node or a precision.
        ConfigTypeError: ``budget`` is neither a ``Budget`` nor a number.

    Example:
        >>> import torch, fxquant
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
        >>> data = [torch.randn(8, 4) for _ in range(2)]
        >>> result = choose_precision(model, fxquant.get_default_qconfig_mapping("reference"),
        ...     (data[0],), data, 0.9, backend_config=fxquant.get_backend_config("reference"),
        ...     timings={"0": {"int8": 0.1, "fp32": 0.3}}, max_latency_ms=1.0)
        >>> [(c.node, c.precision) for c in result.choices], result.met
        ([('0', 'int8')], True)
    """
    accuracy = as_budget(budget)
    if max_latency_ms is not None and not is_budget(max_latency_ms):
        msg = (
            f"max_latency_ms must be None or a positive number of milliseconds, got "
            f"{max_latency_ms!r}"
        )
        raise ConfigError(msg)
    batches = _batches(calibration_data)
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    evaluate = accuracy.evaluate or cosine_score(model, batches)
    setup = _Setup(
        model, example_inputs, batches, backend_config, lowered, evaluate, accuracy.min_score
    )
    offered = _offered(setup, qconfig_mapping)
    if timings is None:
        measured, rest = _measure(setup, offered, repeats), _rest_ms(setup, offered, repeats)
    else:
        measured, rest = _checked_timings(timings, offered), 0.0
    state = _search(setup, qconfig_mapping, offered, measured)
    return _result(qconfig_mapping, offered, measured, state, (rest, max_latency_ms, setup))


def _rest_ms(setup: _Setup, offered: Offered, repeats: int) -> float:
    """The float model's measured ms less its candidate nodes' (the part no choice changes)."""
    measured = _measure(setup, {n: {"fp32": None} for n in offered}, repeats)
    whole = median_ms(lambda: setup.model(*setup.batches[0]), repeats)
    return max(0.0, whole - sum(ms["fp32"] for ms in measured.values()))


def _result(
    mapping: QConfigMapping,
    offered: Offered,
    measured: dict[str, dict[str, float]],
    state: _Search,
    latency: tuple[float, float | None, _Setup],
) -> PrecisionResult:
    rest, limit, setup = latency
    choices = tuple(PrecisionChoice(n, state.choice[n], state.why[n], measured[n]) for n in offered)
    result = PrecisionResult(
        _mapping_for(mapping, state.choice, offered),
        state.model,
        choices,
        state.score,
        setup.min_score,
        rest + sum(c.chosen_ms for c in choices),
        limit,
        rest + sum(min(ms.values()) for ms in measured.values()),
    )
    return PrecisionResult(**{**result.__dict__, "verdict": _verdict(result)})
