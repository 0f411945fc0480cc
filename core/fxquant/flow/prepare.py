"""Prepare: plan where observers go (pure), then insert them in one edit of the graph.

    fused gm --swap QAT modules--> match (one matcher) --plan_observers--> ObserverPlan
             --insert_observers--> gm with activation_post_process_N nodes, graph.lint()

Planning, per node in graph order: a node of a quantized match asks for its
external float-tensor inputs in the qconfig's dtype (weights/bias of functional
ops by ``_input_type_to_index``); a producer whose output already has that dtype
(its own output observer) serves it, else one input observer per (producer,
observer class, dtype) serves every consumer. The anchor gets an output
observer per ObservationType; OUTPUT_SHARE_OBSERVER_WITH_INPUT joins its input's
group, so the group is one observer instance. Values that are not float
tensors (shapes, sizes, integer/bool tensors) never get observers, and values
carrying an additive attention mask stay in float (their -1e4s would set the range).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import getitem
from typing import Any

import torch
from torch import fx, nn

from fxquant.config.backend import BackendConfig, BackendPatternConfig, DTypeConfig, ObservationType
from fxquant.config.pattern import pattern_str
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.dtypes import canonical_dtype
from fxquant.factory import factory_parts
from fxquant.flow.context import FlowContext
from fxquant.flow.dtype_check import (
    QConfigProbe,
    cast_output,
    float_output,
    float_side,
    observable,
    select_dtype_config,
)
from fxquant.flow.match import Match, PatternIndex, match_graph, module_table, root_node
from fxquant.flow.names import attribute_value, unique_name
from fxquant.flow.qat_swap import (
    float_class_of,
    missing_qat_config,
    qat_pattern_configs,
    swap_qat_modules,
)
from fxquant.flow.qconfig_assign import QConfigAssignment, assign_qconfigs, qconfig_mismatch
from fxquant.flow.report import NodeReport, NodeStatus, Reason, ReasonCode, Report
from fxquant.flow.state import node_info, update_info
from fxquant.flow.values import (
    ValueKind,
    constant_nodes,
    node_args,
    positioned_args,
    splits,
    value_kinds,
)
from fxquant.numerics.fake_quantize import FakeQuantize, FixedQParamsFakeQuantize
from fxquant.numerics.observer import (
    FixedQParamsObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    PlaceholderObserver,
)

# modules returning a tuple: (output, state) or (output, attention weights)
_TUPLE_MODULES = (nn.RNNBase, nn.MultiheadAttention)

__all__ = [
    "Decision",
    "ObserverPlan",
    "ObserverSite",
    "insert_observers",
    "plan_observers",
]

Ctor = Callable[[], nn.Module]


@dataclass(frozen=True, slots=True)
class Decision:
    """What prepare decided for one match.

    Example:
        >>> Decision(None, None, None, None).quantized
        False
    """

    match: Match[BackendPatternConfig] | None
    qconfig: QConfig | None
    dtype_config: DTypeConfig | None
    reason: Reason | None

    @property
    def quantized(self) -> bool:
        """True when the pattern gets observers."""
        return self.dtype_config is not None and self.qconfig is not None

    @property
    def status(self) -> NodeStatus:
        """``quantized``; ``float`` when left float as intended (its reason is one of
        ``_INTENDED``, or none); ``skipped`` for any other reason."""
        if self.quantized:
            return NodeStatus.QUANTIZED
        intended = self.reason is None or self.reason.code in _INTENDED
        return NodeStatus.FLOAT if intended else NodeStatus.SKIPPED


# the reasons of a node left float as the user's mapping and model mean it (not skipped)
_INTENDED = frozenset(
    {
        ReasonCode.QCONFIG_NONE,
        ReasonCode.NON_FLOAT_TENSOR,
        ReasonCode.CONSTANT,
        ReasonCode.ADDITIVE_MASK,
    }
)


@dataclass(frozen=True, slots=True)
class ObserverSite:
    """One observer node to insert: on ``producer``'s output, read by ``consumers``.

    ``consumers`` None means every user of the producer (an output observer).
    Sites with the same ``group`` share one observer instance.

    Example:
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> ObserverSite(x, None, nn.Identity, 0).consumers is None
        True
    """

    producer: fx.Node
    consumers: tuple[fx.Node, ...] | None
    ctor: Ctor
    group: int


@dataclass(frozen=True, slots=True)
class ObserverPlan:
    """The whole plan: sites in insertion order and the decision per node.

    Example:
        >>> ObserverPlan((), {}, Report()).sites
        ()
    """

    sites: tuple[ObserverSite, ...]
    decisions: Mapping[fx.Node, Decision]
    report: Report


@dataclass
class _Planner:
    """Mutable scratch state of :func:`plan_observers` (never escapes it)."""

    ctx: FlowContext
    kinds: Mapping[fx.Node, ValueKind]
    modules: Mapping[str, nn.Module]
    constants: set[fx.Node] = field(default_factory=set)  # values that read no activation
    decisions: dict[fx.Node, Decision] = field(default_factory=dict)
    input_roles: Mapping[object, Mapping[str, int]] = field(default_factory=dict)
    probes: dict[int, QConfigProbe] = field(default_factory=dict)
    out_site: dict[fx.Node, int] = field(default_factory=dict)
    out_dtype: dict[fx.Node, torch.dtype] = field(default_factory=dict)
    edge_site: dict[tuple[fx.Node, type, torch.dtype], int] = field(default_factory=dict)
    site_of_edge: dict[tuple[fx.Node, fx.Node], int] = field(default_factory=dict)
    sites: list[tuple[fx.Node, list[fx.Node] | None, Ctor]] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)

    def probe(self, qconfig: QConfig) -> QConfigProbe:
        key = id(qconfig)
        if key not in self.probes:
            self.probes[key] = QConfigProbe.of(qconfig)
        return self.probes[key]

    def new_site(self, producer: fx.Node, consumers: list[fx.Node] | None, ctor: Ctor) -> int:
        self.sites.append((producer, consumers, ctor))
        self.parent.append(len(self.parent))
        return len(self.sites) - 1

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(b)] = self.find(a)


def _qconfig_label(qconfig: QConfig | None) -> str | None:
    if qconfig is None:
        return None

    act, weight = factory_parts(qconfig.activation)[0], factory_parts(qconfig.weight)[0]
    label = f"{act.__name__}/{weight.__name__}"
    if qconfig.output_dtype is not None:
        label += f" -> {str(qconfig.output_dtype).removeprefix('torch.')}"
    return label


def _unmatched_reason(
    node: fx.Node, qconfig: QConfig | None, planner: _Planner, label: str
) -> Reason:
    info, custom = node_info(node), planner.ctx.prepare_custom_config
    if node.op == "call_module" and (
        str(node.target) in custom.standalone_module_names
        or info.module_type in custom.standalone_module_classes
    ):
        words = (
            f"{label}: standalone module kept as one float call; quantizing standalone "
            "modules on their own is not supported yet"
        )
        return Reason(ReasonCode.STANDALONE_MODULE, words)
    no_value = _no_value(node, planner, label)
    if no_value is not None:
        return no_value
    if qconfig is None:
        return Reason(ReasonCode.QCONFIG_NONE, f"{label}: qconfig is None")
    if node in planner.constants:
        words = (
            "computed from the model's attributes and the inputs' shapes only, never from "
            "an activation: a constant, nothing to calibrate (an op taking it as its weight "
            "quantizes it there)"
        )
        return Reason(ReasonCode.CONSTANT, f"{label}: {words}")
    if info.fusion_reason is not None:  # its pattern was refused and nothing shorter matches
        return info.fusion_reason
    words = f"{label}: no pattern in backend {planner.ctx.backend_config.name!r} matches it"
    return Reason(ReasonCode.NO_PATTERN, words)


# what a node no pattern matched computes instead of a float value, by its kind
_NO_VALUE = {
    ValueKind.SCALAR: "returns no tensor (a size, a dtype, a device, a Python number)",
    ValueKind.INT: "computes an integer or boolean tensor (indices, a comparison), not a float one",
}


def _no_value(node: fx.Node, planner: _Planner, label: str) -> Reason | None:
    """Why an op no pattern matched holds no float value to quantize, or None when it does.

    Every such node gets its reason, so that no float row of ``explain`` goes unexplained
    (its summary counts them) and strict mode counts none of them.
    """
    kind = planner.kinds.get(node)
    if kind in _NO_VALUE:
        words = f"{label}: {_NO_VALUE[kind]}: nothing to quantize"
        return Reason(ReasonCode.NON_FLOAT_TENSOR, words)
    if kind in (ValueKind.MASK, ValueKind.MASKED):  # a bfloat16 side reaches here
        name = planner.ctx.backend_config.name
        words = f"carries an additive attention mask, and no pattern in backend {name!r} runs it"
        return Reason(ReasonCode.ADDITIVE_MASK, f"{label}: {words}: kept in float32")
    return None


def _decide(
    node: fx.Node,
    match: Match[BackendPatternConfig] | None,
    qconfig: QConfig | None,
    planner: _Planner,
    label: str,
) -> DTypeConfig | Reason:
    """The backend's dtype config that quantizes ``node``'s pattern, or why it stays float."""
    # a bfloat16 side observes no range (float32's exponent: -1e4 stays -1e4), so a mask
    # sets nothing there and attention runs in bfloat16 as the mapping asks
    bfloat16 = qconfig is not None and planner.probe(qconfig).activation.dtype == torch.bfloat16
    if not bfloat16 and any(
        planner.kinds.get(n) in (ValueKind.MASK, ValueKind.MASKED) for n in (node, *node_args(node))
    ):
        words = (
            f"{label}: carries an additive attention mask (large negative values); kept in "
            "float so the mask does not set the observer's range"
        )
        return Reason(ReasonCode.ADDITIVE_MASK, words)
    if match is None:
        return _unmatched_reason(node, qconfig, planner, label)
    config = match.payload
    shown = pattern_str(config.pattern or match.pattern)
    if not label.endswith(f"({shown})"):  # "gate (Sigmoid) Sigmoid" said the op twice
        label = f"{label} {shown}"
    floats = (ValueKind.FLOAT, None, *((ValueKind.MASKED,) if bfloat16 else ()))
    if planner.kinds.get(match.anchor) not in floats:
        # a tensor-info pattern (x.size(), x.shape) too: it reads a shape, never a value
        words = f"{label}: computes on shapes or integer tensors, not float tensors"
        if config.observation_type is ObservationType.INPUT_OUTPUT_NOT_OBSERVED:
            words = f"{label}: reads the tensor's shape, not its values: nothing to quantize"
        return Reason(ReasonCode.NON_FLOAT_TENSOR, words)
    if qconfig is None:
        return Reason(ReasonCode.QCONFIG_NONE, f"{label}: qconfig is None")
    return select_dtype_config(config, planner.probe(qconfig), label)


def _decide_and_plan(
    gm: fx.GraphModule,
    matches: Mapping[fx.Node, Match[BackendPatternConfig]],
    qconfigs: Mapping[fx.Node, QConfig | None],
    planner: _Planner,
) -> None:
    """Decide each node's fate and plan its observers, in one walk in graph order."""
    for node in gm.graph.nodes:  # a match's nodes are all decided at its first one
        if node.op.startswith("call") and node not in planner.decisions:
            match = matches.get(node)
            anchor = match.anchor if match is not None else node
            qconfig = qconfigs.get(anchor)
            label = f"{anchor.name} ({_op_name(anchor, planner.modules, qualified=False)})"
            outcome = _decide(anchor, match, qconfig, planner, label)
            dtype_config = outcome if isinstance(outcome, DTypeConfig) else None
            reason = outcome if isinstance(outcome, Reason) else None
            decision = Decision(match, qconfig, dtype_config, reason)
            for covered in match.nodes if match is not None else (node,):
                planner.decisions[covered] = decision
        _plan_node(node, planner)  # its producers were planned before it
    _name_unmatched_chains(gm, planner)


def _op_name(node: fx.Node, modules: Mapping[str, nn.Module], *, qualified: bool = True) -> str:
    if node.op == "call_module":
        cls = type(modules[str(node.target)])
        # qat.Linear is also named "Linear": say which one
        qat = qualified and float_class_of(cls) is not None
        return f"{cls.__module__}.{cls.__name__}" if qat else cls.__name__
    return pattern_str(node.target)


def _name_unmatched_chains(gm: fx.GraphModule, planner: _Planner) -> None:
    """Say ``conv -> bn -> relu: ... matches (Conv2d, BatchNorm2d, ReLU)`` for unmatched chains.

    A chain links an unmatched node to its first input when that input is unmatched
    too and has no other user: what a fusion pattern would have covered.
    """
    chains: dict[fx.Node, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        decision = planner.decisions.get(node)
        if decision is None or decision.reason is None or decision.reason.code != "no_pattern":
            continue
        first = next(iter(node_args(node)), None)
        chain = chains.pop(first, None) if first is not None and len(first.users) == 1 else None
        chains[node] = [*(chain or []), node]
    name, modules = planner.ctx.backend_config.name, planner.modules
    for chain in chains.values():
        ops = [_op_name(n, modules) for n in chain]
        shown = f"({', '.join(ops)})" if len(ops) > 1 else ops[0]
        words = (
            f"{' -> '.join(n.name for n in chain)}: no pattern in backend {name!r} matches {shown}"
        )
        qat = {type(modules[str(n.target)]) for n in chain if n.op == "call_module"}
        hints = [missing_qat_config(cls, planner.ctx.backend_config) for cls in qat]
        hints += [_kept_whole(n, gm) for n in chain]
        words = "; ".join([words, *sorted(h for h in hints if h)])
        reason = Reason(ReasonCode.NO_PATTERN, words, field="pattern", bound=None)
        for node in chain:
            planner.decisions[node] = dataclasses.replace(planner.decisions[node], reason=reason)


def _kept_whole(node: fx.Node, root: nn.Module) -> str | None:
    """What a library function traced as one call hides: the layers whose parameters it takes
    (torchvision's Swin attention takes its qkv and proj Linears' weights) run in float."""
    target = node.target
    if node.op != "call_function" or not inspect.isfunction(target):
        return None
    weights = [
        str(n.target)
        for n in node.all_input_nodes
        if isinstance(attribute_value(root, n), nn.Parameter)  # a layer's, not a mask buffer
    ]
    if not weights or target.__module__.startswith("torch."):  # torch's functions: their ops
        return None
    shown = ", ".join(weights[:3]) + (", ..." if len(weights) > 3 else "")
    count = f"{len(weights)} parameters" if len(weights) > 1 else "parameter"
    return (
        f"torch.fx traced {target.__qualname__} as one call, not into it: it runs in float "
        f"with the {count} it takes ({shown})"
    )


def _observation_type(
    match: Match[BackendPatternConfig], kinds: Mapping[fx.Node, ValueKind]
) -> ObservationType:
    config = match.payload
    table = config._num_tensor_args_to_observation_type
    if not table:
        return config.observation_type
    root = root_node(match)
    count = sum(1 for a in root.args if isinstance(a, fx.Node) and kinds.get(a) == ValueKind.FLOAT)
    kind = table.get(count, config.observation_type)
    if count == 1 and kind is ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT:
        # x * 50 sharing x's observer (torch.ao's table) widens x's range 50 times: x would
        # be quantized on a grid 50 times too coarse (0.6 dB from float, with no warning).
        # The output gets its own observer; the kernels requantize into it
        return ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    return kind


def input_roles_by_op(backend_config: BackendConfig) -> dict[object, Mapping[str, int]]:
    """Weight/bias argument positions of each single-op functional pattern (F.conv2d: 1, 2).

    Example:
        >>> import fxquant, torch
        >>> input_roles_by_op(fxquant.get_backend_config("reference"))[torch.conv2d]
        {'weight': 1, 'bias': 2}
    """
    return {
        config.normalized_pattern: config._input_type_to_index
        for config in backend_config.configs
        if config._input_type_to_index and not isinstance(config.normalized_pattern, tuple)
    }


def _roles(
    node: fx.Node, match: Match[BackendPatternConfig], planner: _Planner
) -> Mapping[str, int]:
    # An op's weight/bias positions are a property of the op, as in torch.ao: F.conv2d
    # inside (F.conv2d, F.relu) still takes its weight at 1, although that fused pattern's
    # config names no positions (without this, its weight would be observed as an activation).
    own = planner.input_roles.get(node.target)
    if own is not None:
        return own
    return match.payload._input_type_to_index if node is root_node(match) else {}


def _edge_request(
    node: fx.Node, position: int, arg: fx.Node, decision: Decision, planner: _Planner
) -> tuple[Ctor, torch.dtype] | None:
    """The observer ``node`` wants on input ``arg`` (at ``position``), or None."""
    qconfig = decision.qconfig
    assert qconfig is not None
    assert decision.match is not None
    probe = planner.probe(qconfig)
    roles = _roles(node, decision.match, planner) if node.op == "call_function" else {}
    if position == roles.get("weight"):
        # a backend that keeps the weight in float (layer_norm's affine weight) wants
        # no observer on it, whatever the qconfig's weight observer is
        wanted = decision.dtype_config.weight_dtype if decision.dtype_config else None
        observed = observable(wanted) and observable(probe.weight.dtype)
        return (qconfig.weight, probe.weight.dtype) if observed else None
    if position == roles.get("bias"):  # observed only as a static float16 bias (torch.ao)
        half = probe.bias_dtype == torch.float16
        return (PlaceholderObserver.with_args(dtype=torch.float16), torch.float16) if half else None
    dtype = probe.activation.dtype
    if probe.activation.is_dynamic:
        return (qconfig.activation, dtype) if position == 0 else None
    if not observable(dtype) or planner.out_dtype.get(arg) == dtype:
        return None
    return _input_observer(qconfig.activation), dtype


def _input_observer(ctor: Ctor) -> Ctor:
    """The observer for a float input of an op whose qconfig activation is ``ctor``.

    A fixed-qparams activation (sigmoid's 0..1 grid) fixes the op's output, never its
    input: on the input it clipped every negative value to 0 with no warning (torch.ao
    does the same). The input gets a calibrated observer of the same dtype and range.
    """
    cls, kwargs = factory_parts(ctor)
    if cls is FixedQParamsFakeQuantize:
        inner = factory_parts(kwargs.get("observer", FixedQParamsObserver))[1]
        return FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, **_grid(inner))
    if cls is FixedQParamsObserver:
        return MinMaxObserver.with_args(**_grid(kwargs))
    return ctor


def _grid(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: kwargs[k] for k in ("dtype", "quant_min", "quant_max") if k in kwargs}


_TENSORS = (ValueKind.FLOAT, ValueKind.MASK, ValueKind.MASKED)


def _carries(kind: ValueKind | None, dtype: torch.dtype) -> bool:
    """Whether a value of ``kind`` gets an observer of ``dtype``: a float tensor does; a mask
    only as bfloat16, which rounds it without observing a range (float32's exponent)."""
    return kind is ValueKind.FLOAT or (kind in _TENSORS and dtype == torch.bfloat16)


def _plan_inputs(node: fx.Node, decision: Decision, planner: _Planner) -> None:

    assert decision.match is not None
    inside = set(decision.match.nodes)
    for position, arg in positioned_args(node):
        if arg in inside or planner.kinds.get(arg) not in _TENSORS or _returns_pieces(arg, planner):
            continue  # a tuple has no range: its pieces are observed after their getitem
        request = _edge_request(node, position, arg, decision, planner)
        if request is None or not _carries(planner.kinds.get(arg), request[1]):
            continue
        ctor, dtype = request
        key = (arg, factory_parts(ctor)[0], canonical_dtype(dtype))
        if key not in planner.edge_site:
            planner.edge_site[key] = planner.new_site(arg, [], ctor)
        site = planner.edge_site[key]
        consumers = planner.sites[site][1]
        assert consumers is not None  # an input site lists its consumers
        consumers.append(node)
        planner.site_of_edge[(arg, node)] = site


def _input_sites(node: fx.Node, planner: _Planner) -> list[int]:
    """The observers of the first tensor input (all of a list's) of ``node``: each input's
    own observer for ``node``, else its producer's output observer; none when the first
    input has none."""
    first = next((a for a in node.args if isinstance(a, (fx.Node, list, tuple))), None)
    args = list(first) if isinstance(first, (list, tuple)) else [first]
    found = [
        planner.site_of_edge.get((a, node), planner.out_site.get(a))
        for a in args
        if isinstance(a, fx.Node)
    ]
    return [s for s in found if s is not None] if found and found[0] is not None else []


def _plan_node(node: fx.Node, planner: _Planner) -> None:
    decision = planner.decisions.get(node)
    if decision is None or not decision.quantized or decision.match is None:
        return
    kind = _observation_type(decision.match, planner.kinds)
    if kind is ObservationType.INPUT_OUTPUT_NOT_OBSERVED:
        return
    _plan_inputs(node, decision, planner)
    assert decision.qconfig is not None
    probe = planner.probe(decision.qconfig)
    dtype = probe.activation.dtype
    if node is not decision.match.anchor or probe.activation.is_dynamic:
        return
    if float_output(decision.dtype_config):
        return  # an int8-in, float-out kernel: its consumers quantize what they need
    ctor = decision.qconfig.activation
    rounded = cast_output(decision.dtype_config)
    if rounded is not None:  # int8 in, bf16 out: the output is rounded to bf16, not observed
        ctor, dtype = PlaceholderObserver.with_args(dtype=rounded), rounded
    if not _carries(planner.kinds.get(node), dtype) or not observable(dtype):
        return
    shared = kind is ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT and rounded is None
    joined = _input_sites(node, planner) if shared else []
    # a tuple has no range: each tensor piece gets the output observer
    for value in _pieces(node) if _returns_pieces(node, planner) else [node]:
        if value in planner.out_site:
            continue  # a piece its tuple's op already observes
        planner.out_dtype[value] = dtype
        if shared and not joined:
            continue  # nothing to share with: torch.ao drops it too
        site = planner.out_site[value] = planner.new_site(value, None, ctor)
        for other in joined:  # one observer instance for the output and its inputs
            planner.union(other, site)


def _returns_pieces(node: fx.Node, planner: _Planner) -> bool:
    """Whether ``node`` returns a tuple (``chunk``, ``split``, ``unbind``, an RNN module...)."""
    module = planner.modules.get(str(node.target)) if node.op == "call_module" else None
    return isinstance(module, _TUPLE_MODULES) or splits(node)


def _pieces(node: fx.Node) -> list[fx.Node]:
    """The getitem readers of tuple-returning ``node`` that are tensors: every piece of a
    ``chunk``; only the output sequence (index 0) of a module (an RNN, attention), whose
    index 1 is a state or a tuple of them."""
    pieces = [
        u
        for u in node.users
        if u.op == "call_function" and u.target is getitem and not isinstance(u.args[1], slice)
    ]  # chunk(...)[::-1] is a tuple again: an observer of it failed at calibration
    if not splits(node):
        pieces = [u for u in pieces if len(u.args) > 1 and u.args[1] == 0]
    return pieces


def _plan_outputs(gm: fx.GraphModule, planner: _Planner) -> None:
    indexes = planner.ctx.prepare_custom_config.output_quantized_indexes
    mapping = planner.ctx.qconfig_mapping
    if not indexes or mapping is None or mapping.global_qconfig is None:
        return
    output = gm.graph.output_node()
    values = output.args[0]
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    for i in indexes:
        value = values[i] if i < len(values) else None
        if not isinstance(value, fx.Node) or planner.kinds.get(value) != ValueKind.FLOAT:
            continue
        if value not in planner.out_site:
            planner.new_site(value, [output], mapping.global_qconfig.activation)


def plan_observers(
    gm: fx.GraphModule,
    matches: Mapping[fx.Node, Match[BackendPatternConfig]],
    qconfigs: Mapping[fx.Node, QConfig | None],
    modules: Mapping[str, nn.Module],
    ctx: FlowContext,
) -> ObserverPlan:
    """Decide every node's fate and every observer's place; the graph is not touched.

    Example:
        >>> import fxquant
        >>> from fxquant.flow.context import FlowContext
        >>> from fxquant.registry.resolution import ResolvedBackend
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
        >>> ctx = FlowContext(ResolvedBackend(fxquant.BackendConfig("empty")))
        >>> plan_observers(gm, {}, {}, dict(gm.named_modules()), ctx).sites
        ()
    """
    kinds = value_kinds(gm, modules, ctx.example_inputs)
    roles = input_roles_by_op(ctx.backend_config)
    planner = _Planner(ctx, kinds, modules, constant_nodes(gm.graph), input_roles=roles)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in ctx.prepare_custom_config.input_quantized_indexes:
        if i < len(placeholders):
            planner.out_dtype[placeholders[i]] = torch.uint8  # arrives quantized
    _decide_and_plan(gm, matches, qconfigs, planner)
    _plan_outputs(gm, planner)
    sites = tuple(
        ObserverSite(p, None if c is None else tuple(c), ctor, planner.find(i))
        for i, (p, c, ctor) in enumerate(planner.sites)
    )
    return ObserverPlan(sites, planner.decisions, _report(gm, planner.decisions))


def _report(gm: fx.GraphModule, decisions: Mapping[fx.Node, Decision]) -> Report:
    """Each node's entry, and a note per fusion refused for its qconfigs whose parts are
    quantized anyway: each node's entry is "quantized", so without the note the lost fusion
    would go unsaid."""
    entries: list[NodeReport] = []
    notes: dict[str, None] = {}
    for node in gm.graph.nodes:
        d, info = decisions.get(node, _UNDECIDED), node_info(node)
        pattern = None
        if d.match is not None:
            pattern = pattern_str(d.match.payload.pattern or d.match.pattern)
            if d.quantized:
                pattern += _precision_label(d.dtype_config)
        if info.fusion_reason is not None and d.quantized:
            notes[f"not fused: {info.fusion_reason.words}"] = None
        qconfig = _qconfig_label(d.qconfig)
        entries.append(
            NodeReport(node.name, node.op, pattern, qconfig, d.status, d.reason, info.source)
        )
    return Report(entries, notes=list(notes))


_UNDECIDED = Decision(None, None, None, None)  # a placeholder, get_attr or output: no op


def _precision_label(config: DTypeConfig | None) -> str:
    """What runs, where the pattern alone does not say it: a float output of an int8 kernel
    (the reference and the kernel compute it) or a reduced float side."""
    if float_output(config):
        return " (int8 in, float out)"
    side = float_side(config)
    if side is None:
        return ""
    name = str(side).removeprefix("torch.")
    return f" (int8 in, {name} out)" if cast_output(config) is not None else f" ({name})"


def _record(plan: ObserverPlan) -> None:
    for node, d in plan.decisions.items():
        if d.match is None or not d.quantized:
            continue
        update_info(
            node,
            qconfig=d.qconfig,
            pattern_config=d.match.payload,
            dtype_config=d.dtype_config,
            anchor=d.match.anchor.name,
            is_root=node is root_node(d.match),
        )


def _not(observer: fx.Node) -> Callable[[fx.Node], bool]:
    return lambda user: user is not observer


def insert_observers(gm: fx.GraphModule, plan: ObserverPlan) -> fx.GraphModule:
    """Insert the plan's observers (the only graph edit of prepare); lint and recompile.

    Example:
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.ReLU()))
        >>> insert_observers(gm, ObserverPlan((), {}, Report())) is gm
        True
    """
    graph = gm.graph
    targets: dict[int, str] = {}
    current: dict[fx.Node, fx.Node] = {}
    position = {node: i for i, node in enumerate(graph.nodes)}
    # graph order (names read top to bottom); a producer's output observer before input ones
    ordered = sorted(plan.sites, key=lambda s: (position[s.producer], s.consumers is not None))
    for site in ordered:
        if site.group not in targets:
            # every number below len(targets) is taken: by an observer added here or before
            name = unique_name(gm, "activation_post_process", first=len(targets))
            gm.add_module(name, site.ctor())
            targets[site.group] = name
        source = current.get(site.producer, site.producer)
        with graph.inserting_after(source):
            observer = graph.call_module(targets[site.group], (source,))
        if site.consumers is None:
            source.replace_all_uses_with(observer, delete_user_cb=_not(observer))
            current[site.producer] = observer
        else:
            for consumer in site.consumers:
                consumer.replace_input_with(source, observer)
    _record(plan)
    graph.lint()
    gm.recompile()
    return gm


def observation_index(ctx: FlowContext) -> PatternIndex[BackendPatternConfig]:
    """Every pattern of the backend, and those derived for its QAT modules, indexed.

    Example:
        >>> from fxquant.config.backend import BackendConfig
        >>> from fxquant.registry.resolution import ResolvedBackend
        >>> len(observation_index(FlowContext(ResolvedBackend(BackendConfig("empty")))))
        0
    """
    # the QAT classes prepare_qat_fx swaps in match what their float classes match
    configs = [*ctx.backend_config.configs, *qat_pattern_configs(ctx.backend_config)]
    return PatternIndex.build((c.normalized_pattern, c) for c in configs)


def prepare(
    gm: fx.GraphModule, ctx: FlowContext, assignment: QConfigAssignment | None = None
) -> tuple[fx.GraphModule, Report]:
    """Assign qconfigs, swap QAT modules, match, plan, insert; return gm and its report.

    ``assignment``: the qconfigs fusion already assigned to this graph
    (``fuse_assigned``); ``None`` assigns them here.

    Example:
        >>> import fxquant
        >>> from fxquant.flow.context import FlowContext
        >>> from fxquant.registry.resolution import ResolvedBackend
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.ReLU()))
        >>> config = ResolvedBackend(fxquant.BackendConfig("empty"))
        >>> ctx = FlowContext(config, fxquant.QConfigMapping())
        >>> prepare(gm, ctx)[1].skipped()
        []
    """
    modules = module_table(gm)
    if assignment is None:
        assignment = assign_qconfigs(gm, modules, ctx.qconfig_mapping or QConfigMapping())
    if ctx.is_qat:
        swap_qat_modules(gm, modules, assignment.qconfigs, ctx)
    qconfigs = assignment.qconfigs
    matches = match_graph(
        gm,
        observation_index(ctx),
        modules=modules,
        accept=lambda match: qconfig_mismatch(match, qconfigs) is None,  # shorter ones then
    )
    plan = plan_observers(gm, matches, assignment.qconfigs, modules, ctx)
    return insert_observers(gm, plan), plan.report.with_unused(assignment.unused)
