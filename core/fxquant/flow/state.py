"""Records the flow keeps on nodes and on the prepared model.

``node.meta["fxquant"]`` holds one :class:`NodeInfo` per node; each step adds
fields with :func:`dataclasses.replace` (never in place). ``gm.meta["fxquant"]``
holds the :class:`FlowState` that convert and ``explain`` read.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

from fxquant.config.backend import BackendConfig, BackendPatternConfig, DTypeConfig
from fxquant.config.custom import PrepareCustomConfig
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigTypeError
from fxquant.flow.kept_reference import materialize
from fxquant.flow.report import NodeStatus, Reason, Report
from fxquant.registry.answers import GraphMode
from fxquant.registry.resolution import ResolvedBackend

__all__ = [
    "META_KEY",
    "FlowMeta",
    "FlowState",
    "NodeInfo",
    "flow_state",
    "is_converted",
    "node_info",
    "raise_if_flow_model",
    "reference_form",
    "update_info",
]

META_KEY = "fxquant"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the flow knows about one node (``node.meta["fxquant"]``).

    Example:
        >>> NodeInfo(module_path="fc", module_type=None, source="model.py:12").is_root
        False
    """

    module_path: str
    module_type: type | None
    source: str | None
    qconfig: QConfig | None = None
    pattern_config: BackendPatternConfig | None = None
    dtype_config: DTypeConfig | None = None
    anchor: str | None = None
    is_root: bool = False
    fused_from: tuple[Any, ...] = ()
    """The ops a fused module replaced (``(Conv2d, ReLU)``), for qconfig lookup by type."""
    fusion_reason: Reason | None = None
    """Why fuse left this node's pattern unfused (``fusion_qconfig_mismatch``)."""
    call_orders: tuple[Any, ...] = ()
    """The ``set_module_name_object_type_order`` keys naming this call, numbered on the
    graph as captured; a fused module keeps those of every module it replaced."""

    @property
    def quantized(self) -> bool:
        """Whether prepare quantized the node: it set a qconfig and the backend's dtype config
        (convert's ``qconfig_mapping`` clears both for a node it turns off)."""
        return self.qconfig is not None and self.dtype_config is not None


@dataclass(frozen=True, slots=True)
class FlowState:
    """The flow's state on prepared and converted models (``gm.meta["fxquant"]``).

    Example:
        >>> from fxquant.flow.report import Report
        >>> state = FlowState(BackendConfig("b"), QConfigMapping(), False, Report(),
        ...                   PrepareCustomConfig())
        >>> state.is_qat
        False
    """

    backend_config: BackendConfig
    qconfig_mapping: QConfigMapping
    is_qat: bool
    report: Report
    prepare_custom_config: PrepareCustomConfig
    graph_mode: GraphMode | None = None
    """The mode the backend picked for this graph (``fxquant_graph_mode``); then
    ``qconfig_mapping`` is the user's mapping with the mode merged in
    (``fxquant.flow.graph_mode``), not the one the user passed."""
    notes: tuple[str, ...] = ()
    """Lines ``fxquant.explain`` prints first under the table: the backend prepare
    resolved ``backend_config=None`` to, the mode and what of it applied."""
    backend: ResolvedBackend | None = dataclasses.field(default=None, repr=False, compare=False)
    """What prepare's entry point resolved ``backend_config`` to (its lowering rules and
    deployment): ``convert_fx`` lowers with it, asking the registry nothing."""
    reference_model: GraphModule | None = dataclasses.field(default=None, repr=False, compare=False)
    """On ``convert_fx``'s model of a backend that both lowers in PyTorch and deploys
    (x86): the model before lowering, which its deployment compiles (see
    :func:`reference_form`)."""


def flow_state(model: object) -> FlowState | None:
    """The flow's state on a model that prepare_fx, prepare_qat_fx or convert_fx returned
    (its backend config, qconfig mapping and report), or None for any other object.

    Public for plugins that deploy converted models: the one lookup of ``META_KEY``.

    Example:
        >>> import torch, fxquant
        >>> m = torch.nn.Sequential(torch.nn.ReLU()).eval()
        >>> gm = fxquant.prepare_fx(m, fxquant.get_default_qconfig_mapping("reference"),
        ...     (torch.randn(2),), backend_config=fxquant.get_backend_config("reference"))
        >>> flow_state(gm).backend_config.name, flow_state(m)
        ('reference', None)
    """
    state = model.meta.get(META_KEY) if isinstance(model, GraphModule) else None
    return state if isinstance(state, FlowState) else None


def is_converted(state: FlowState) -> bool:
    """True for the state of a model convert_fx or convert_to_reference_fx returned:
    its report has reference or lowered nodes, where a prepared model's has quantized ones.

    Example:
        >>> from fxquant.flow.report import Report
        >>> is_converted(FlowState(BackendConfig("b"), QConfigMapping(), False, Report(),
        ...                        PrepareCustomConfig()))
        False
    """
    done = (NodeStatus.REFERENCE, NodeStatus.LOWERED)
    return any(entry.status in done for entry in state.report.entries())


def raise_if_flow_model(model: object, step: str) -> None:
    """Refuse a model prepare or convert already returned: ``step`` wants the float model.

    Preparing a prepared model again would observe every value twice (the old
    observers are ops of its graph), and a converted one has no float ops left;
    fusing either would hand prepare such a model.

    Raises:
        ConfigTypeError: ``model`` carries fxquant's flow state; the message says
            what it is and what to pass instead.

    Example:
        >>> import torch
        >>> raise_if_flow_model(torch.nn.ReLU(), "prepare_fx")
    """
    state = flow_state(model)
    if state is None:
        return
    if is_converted(state):
        what = "converted (convert_fx or convert_to_reference_fx returned it)"
        other = "use the converted model as it is"
    else:
        what = "prepared (prepare_fx or prepare_qat_fx returned it, with its observers)"
        other = "calibrate the prepared model and pass it to convert_fx"
    verb = step.split("_")[0]  # prepare, fuse
    msg = (
        f"{step}: the model is already {what}; {step} takes the float model. Pass the "
        f"float model to {verb} it again (the flow leaves it unchanged, so another mapping "
        f"or backend can {verb} it too), or {other}"
    )
    raise ConfigTypeError(msg)


def reference_form(model: object) -> GraphModule | None:
    """The reference form of a converted model: what ``convert_to_reference_fx`` gives.

    ``model`` itself when no node of it was lowered to a kernel (the reference
    model, or ``convert_fx``'s on a backend without kernels); the model
    ``convert_fx`` kept before lowering on a backend that lowers and deploys
    (x86); ``None`` otherwise (a lowered model without it, or not a converted
    model). For deployments that compile the reference form.

    Example:
        >>> import torch, fxquant
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2)).eval()
        >>> reference = fxquant.get_backend_config("reference")
        >>> gm = fxquant.prepare_fx(m, fxquant.get_default_qconfig_mapping("reference"),
        ...                         (torch.randn(1, 2),), backend_config=reference)
        >>> _ = gm(torch.randn(1, 2))
        >>> converted = fxquant.convert_fx(gm)
        >>> reference_form(converted) is converted, reference_form(m)
        (True, None)
    """
    state = flow_state(model)
    if state is None:
        return None
    if state.reference_model is not None:
        assert isinstance(model, GraphModule)  # a flow state lives in a GraphModule's meta
        return materialize(state.reference_model, model)
    lowered = any(entry.status == "lowered" for entry in state.report.entries())
    return None if lowered or not isinstance(model, GraphModule) else model


def node_info(node: Node) -> NodeInfo:
    """The node's :class:`NodeInfo`, or an empty one for nodes the tracer did not make.

    Example:
        >>> import torch
        >>> g = torch.fx.Graph(); x = g.placeholder("x")
        >>> node_info(x).module_path
        ''
    """
    info = node.meta.get(META_KEY)
    if isinstance(info, NodeInfo):
        return info
    return NodeInfo(module_path="", module_type=None, source=None)


def update_info(node: Node, **changes: Any) -> NodeInfo:
    """Replace fields of the node's :class:`NodeInfo` and store the new record.

    Example:
        >>> import torch
        >>> g = torch.fx.Graph(); x = g.placeholder("x")
        >>> update_info(x, anchor="x").anchor
        'x'
    """
    info = dataclasses.replace(node_info(node), **changes)
    node.meta[META_KEY] = info
    return info


class FlowMeta(dict[str, Any]):
    """``gm.meta`` of prepared and converted models: pickling leaves the flow state out.

    ``torch.save`` pickles a GraphModule's ``meta`` (and ``torch.load`` then drops
    it); the flow state holds the backend config, whose patterns may name
    functions pickle cannot find (``F.max_pool2d`` is a local closure).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        kept = [(key, value) for key, value in self.items() if key != META_KEY]
        return (dict, (), None, None, iter(kept))

    def __deepcopy__(self, memo: dict[int, Any]) -> FlowMeta:
        return FlowMeta({k: copy.deepcopy(v, memo) for k, v in self.items()})
