"""Which observers were calibrated, and what convert does with those that were not.

An activation observer that never saw a finite value still holds the range of a
fresh observer (``inf``, ``-inf``): quantizing with it would use ``scale=1.0,
zero_point=0``, a wrong number with no warning. ``convert_fx`` and
``convert_to_reference_fx`` instead keep every node next to such an observer
float (the pattern it belongs to, whole), report it ``skipped`` with the reason
code ``not_calibrated``, and warn once naming the observers and nodes;
``convert_fx(strict=True)`` raises :class:`fxquant.QuantizationSkipped`.

Only activation observers (the ``activation_post_process_N`` modules on the
graph's edges) count: weight observers are run on the weights at convert.
Fixed-qparams, placeholder and dynamic observers never need calibration
(:func:`fxquant.observer.is_calibrated`).

Prepare also names every observer after its place in the graph
(:func:`label_observers`), so that an observer's own warnings (non-finite
values) say which edge it watches.

An observer that saw one value only (every calibration batch constant on its edge,
e.g. data of zeros) is calibrated, but its range is a point: every other value at
run time is clamped to it. Convert quantizes it as asked and warns, naming the
observers and the value (:func:`single_valued`). An edge the model makes constant
itself (``torch.zeros_like(x)``, ``y.fill_(0.5)``, ``torch.tensor(1.0, dtype=x.dtype)``,
a ``get_attr``: :func:`fxquant.flow.values.constant_nodes`) is one value by design and is
not named.

An observer whose range was set by one batch far beyond every other (a corrupt or
unnormalized batch: one value of 1e30 among values near 1) quantizes every other value into
a few steps, near 0 dB, with no error anywhere. Convert warns, naming the observers and
both peaks (:func:`outlier_batches`); it cannot tell such a batch from real data, so it
quantizes as asked.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping

import torch
from torch import nn
from torch.fx import GraphModule, Node

from fxquant.errors import CalibrationWarning
from fxquant.flow.convert_copy import observed_constant
from fxquant.flow.convert_modules import is_observer, observer_node
from fxquant.flow.state import node_info
from fxquant.flow.values import constant_nodes
from fxquant.numerics.observer import is_calibrated

__all__ = [
    "OUTLIER_RATIO",
    "label_observers",
    "outlier_batches",
    "single_valued",
    "uncalibrated",
    "warn_calibration",
    "within_one_step",
]

OUTLIER_RATIO = 1000.0
"""A batch whose peak is this many times the largest peak of every other batch is named."""


def _observers(gm: GraphModule, modules: Mapping[str, nn.Module]) -> list[tuple[Node, nn.Module]]:
    observers = [node for node in gm.graph.nodes if observer_node(node, modules) is not None]
    return [(node, modules[str(node.target)]) for node in observers]


def label_observers(gm: GraphModule) -> None:
    """Name each observer (and fake quantize) of ``gm`` for its messages.

    Example:
        >>> import torch, fxquant
        >>> m = torch.nn.Sequential(torch.nn.ReLU()).eval()
        >>> gm = fxquant.prepare_fx(m, fxquant.get_default_qconfig_mapping("reference"),
        ...                         (torch.randn(2),))
        >>> gm.activation_post_process_0._fxquant_name  # ReLU shares its input's observer
        "activation_post_process_0 (output of node 'input_1')"
    """
    modules = dict(gm.named_modules())
    for node, module in _observers(gm, modules):
        if getattr(module, "_fxquant_name", None) is not None:
            continue  # an observer shared by several edges keeps its first one
        observed = node.args[0] if node.args else None
        label = str(node.target)
        if isinstance(observed, Node):
            source = node_info(observed).source
            label += f" (output of node {observed.name!r}" + (f" at {source})" if source else ")")
        _set_label(module, label)
    for path, module in modules.items():  # weight fake quants inside QAT modules
        if path and is_observer(module) and getattr(module, "_fxquant_name", None) is None:
            _set_label(module, path)


def _set_label(module: nn.Module, label: str) -> None:
    # a plain attribute (nn.Module keeps it in __dict__): kept by deepcopy and pickling
    object.__setattr__(module, "_fxquant_name", label)
    inner = getattr(module, "activation_post_process", None)
    if isinstance(inner, nn.Module):
        object.__setattr__(inner, "_fxquant_name", label)


def uncalibrated(gm: GraphModule, modules: Mapping[str, nn.Module]) -> dict[str, list[str]]:
    """Never-calibrated activation observers: observer name -> the quantized nodes next to it.

    The nodes are every node of the patterns the observer's producer and consumers
    belong to (a fused pattern stays float as a whole).

    Example:
        >>> # see tests/flow/test_not_calibrated.py
    """
    found: dict[str, list[str]] = {}
    anchors: dict[str, list[str]] = {}
    for node in gm.graph.nodes:
        info = node_info(node)
        if info.qconfig is not None and info.anchor is not None:
            anchors.setdefault(info.anchor, []).append(node.name)
    for node, module in _observers(gm, modules):
        if is_calibrated(module) or observed_constant(node):
            continue  # a functional's weight is observed at convert
        target = str(node.target)
        names = dict.fromkeys(found.get(target, ()))  # ordered, each once (a shared observer)
        for neighbour in (*node.all_input_nodes, *node.users):
            info = node_info(neighbour)
            if info.qconfig is not None:
                names.update(dict.fromkeys(anchors.get(info.anchor or "", [neighbour.name])))
        if names:
            found[target] = list(names)
    return found


def _calibrated_ranges(
    gm: GraphModule, modules: Mapping[str, nn.Module]
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor, nn.Module]]:
    """(label, min_val, max_val, observer) of each calibrated activation observer with finite
    statistics, but those of constants (one value by design). The label names the observer,
    the node it watches and that node's module: the name ``set_module_name`` takes."""
    observers = _observers(gm, modules)
    constants = constant_nodes(gm.graph, through={node for node, _ in observers})
    for node, module in observers:
        source = node.args[0] if node.args else None
        if source in constants or not is_calibrated(module):
            continue  # one value by design (a get_attr too: a functional's weight)
        inner = getattr(module, "activation_post_process", module)
        low, high = getattr(inner, "min_val", None), getattr(inner, "max_val", None)
        if not isinstance(low, torch.Tensor) or not isinstance(high, torch.Tensor):
            continue  # fixed qparams, placeholders: no statistics to be degenerate
        if low.numel() and bool(torch.isfinite(low).all() and torch.isfinite(high).all()):
            yield _label(node, source), low, high, inner


def _label(observer: Node, source: object) -> str:
    if not isinstance(source, Node):
        return str(observer.target)
    path = node_info(source).module_path  # a called module's own path, else its caller's
    return f"{observer.target} on {source.name}" + (f" (module {path!r})" if path else "")


def single_valued(gm: GraphModule, modules: Mapping[str, nn.Module]) -> dict[str, float]:
    """Calibrated activation observers whose range is one point: label (the observer, the node
    it watches, its module) -> the value.

    Such an observer saw the same value everywhere (a constant edge in the calibration
    data); quantizing with its range clamps every other value to that point.

    Example:
        >>> # see tests/flow/test_not_calibrated.py
    """
    ranges = _calibrated_ranges(gm, modules)
    return {name: float(low.flatten()[0]) for name, low, high, _ in ranges if low.equal(high)}


def within_one_step(
    gm: GraphModule, modules: Mapping[str, nn.Module]
) -> dict[str, tuple[float, float, float]]:
    """Calibrated activation observers whose values, zero included, span less than their
    ``eps`` (the smallest scale they choose): label (as :func:`single_valued`'s) -> (min,
    max, eps).

    Every value on such an edge quantizes to the zero point or the step next to it: the
    output of an untrained or mis-scaled layer (activations around 1e-8) becomes zeros.

    Example:
        >>> # see tests/flow/test_not_calibrated.py
    """
    found: dict[str, tuple[float, float, float]] = {}
    for name, low, high, observer in _calibrated_ranges(gm, modules):
        span = float(high.max().clamp(min=0) - low.min().clamp(max=0))
        eps = float(getattr(observer, "eps", 0.0))
        if not low.equal(high) and 0 < span < eps:
            found[name] = (float(low.min()), float(high.max()), eps)
    return found


def outlier_batches(
    gm: GraphModule, modules: Mapping[str, nn.Module]
) -> dict[str, tuple[float, float]]:
    """Activation observers whose range one batch set, :data:`OUTLIER_RATIO` times or more
    beyond every other batch's: observer name -> (that batch's peak, the next largest).

    Example:
        >>> # see tests/flow/test_not_calibrated.py
    """
    found: dict[str, tuple[float, float]] = {}
    for node, module in _observers(gm, modules):
        inner = getattr(module, "activation_post_process", module)
        first, second = getattr(inner, "batch_peaks", (0.0, 0.0))
        if second > 0.0 and first >= OUTLIER_RATIO * second:
            found.setdefault(
                getattr(inner, "_fxquant_name", None) or str(node.target), (first, second)
            )
    return found


# what each finding says, then its advice; {n}: how many observers, {ratio}: OUTLIER_RATIO
_NOT_CALIBRATED = (
    "{n} activation observer(s) saw no finite value, so their nodes stay float in the "
    "converted model (reason not_calibrated)",
    "Run the prepared model on representative data before converting (fxquant.tools."
    "calibration.calibrate), or pass strict=True to make this an error",
)
_SINGLE_VALUED = (
    "{n} activation observer(s) saw a single value during calibration, so every other value "
    "on their edge is clamped to it",
    "Calibrate on representative data (inputs that vary), or keep those nodes float "
    "(QConfigMapping().set_module_name(module, None), with the module named)",
)
_WITHIN_ONE_STEP = (
    "{n} activation observer(s) saw values that span less than one quantization step (their "
    "eps), so every value on their edge quantizes to the zero point or next to it",
    "Such small activations come from an untrained or mis-scaled layer (random weights "
    "shrink a deep model's activations): check the model, or keep those nodes float "
    "(QConfigMapping().set_module_name(module, None), with the module named)",
)
_OUTLIER_BATCHES = (
    "the range of {n} activation observer(s) was set by a single calibration batch, "
    "{ratio:g} times or more beyond every other",
    "Every other value on those edges quantizes into a few steps (near 0 dB). Check the "
    "calibration data for a corrupt or unnormalized batch, then calibrate again without "
    "it (prepare anew, or reset_min_max_vals() on those observers)",
)


def warn_calibration(
    step: str,
    not_calibrated: Mapping[str, list[str]],
    single: Mapping[str, float],
    outliers: Mapping[str, tuple[float, float]],
    narrow: Mapping[str, tuple[float, float, float]] | None = None,
) -> None:
    """One :class:`CalibrationWarning` per kind of finding, naming every observer concerned.

    The findings are those of :func:`uncalibrated` (with the nodes kept float),
    :func:`single_valued` (with the value), :func:`outlier_batches` (with both peaks) and
    :func:`within_one_step` (with the range and eps).

    Example:
        >>> warn_calibration("convert_fx", {}, {}, {})  # nothing to say
    """
    stale = [f"{obs} -> {', '.join(nodes)}" for obs, nodes in not_calibrated.items()]
    flat = [f"{obs} saw only {value:g}" for obs, value in single.items()]
    peaks = [
        f"{obs}: one batch reached {peak:.3g}, every other at most {other:.3g}"
        for obs, (peak, other) in outliers.items()
    ]
    small = [
        f"{obs} saw {lo:.3g}..{hi:.3g} (eps {eps:.3g})"
        for obs, (lo, hi, eps) in (narrow or {}).items()
    ]
    findings = (
        (_NOT_CALIBRATED, stale),
        (_SINGLE_VALUED, flat),
        (_WITHIN_ONE_STEP, small),
        (_OUTLIER_BATCHES, peaks),
    )
    for (what, advice), listed in findings:
        if listed:
            said = what.format(n=len(listed), ratio=OUTLIER_RATIO)
            # 4: the user's call of convert_fx / convert_to_reference_fx (through reference_model)
            message = f"{step}: {said}: {'; '.join(listed)}. {advice}"
            warnings.warn(message, CalibrationWarning, stacklevel=4)
