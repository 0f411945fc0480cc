"""What the flow's entry points ask the registry, once, before any step runs.

``fuse_fx``/``prepare_fx``/``prepare_qat_fx`` get ``backend_config=None`` as this host's
native backend, as torch.ao does (``x86`` on an x86 CPU, ``qnnpack`` on ARM:
``fxquant.registry.native``); prepare records it in the flow state, so ``convert_fx``
without ``backend_config`` lowers with it. ``convert_fx`` gets the lowering rules and the
deployment of the backend *named* by its ``BackendConfig`` (CONTRACT: "the kernels of the
backend named by backend_config.name ... resolved once, when the flow starts"), so a
config read from JSON as ``"x86"`` lowers with x86's kernels, and a config named after no
installed backend gets none. The answers travel in the frozen ``FlowContext``; no step
past the entry point looks anything up by name, and the report says which backend
``None`` resolved to and which plugins' kernels the name resolved to.

``prepare_fx``/``prepare_qat_fx`` also ask, once the graph is traced, whether the backend
picks a mode of its own for it (``backend_graph_mode``, the ``fxquant_graph_mode`` hook),
and the backend's default mapping, the base ``fxquant.flow.graph_mode`` merges the
mode into the user's mapping from.

To lower with another backend's kernels, name the config after that backend
(``config.set_name("x86")``): the name is the one switch, and the report shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import fx

from fxquant import registry
from fxquant.config.backend import BackendConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import MissingDefaultQConfigError, UnknownBackendError
from fxquant.flow.context import as_backend_config
from fxquant.lowering import LoweringRule
from fxquant.registry.answers import GraphMode
from fxquant.registry.assembly import default_qconfig_mapping, graph_mode
from fxquant.registry.native import NativeBackend, host_native_backend

__all__ = [
    "BackendKernels",
    "GivenBackend",
    "backend_graph_mode",
    "backend_kernels",
    "given_backend",
]


@dataclass(frozen=True, slots=True)
class GivenBackend:
    """The backend an entry point resolved ``backend_config`` to, and what explain says of it.

    Example:
        >>> GivenBackend(BackendConfig("mine")).notes()
        ()
    """

    config: BackendConfig
    native: NativeBackend | None = None
    """How ``backend_config=None`` was resolved (``fxquant.registry.native``)."""

    def notes(self) -> tuple[str, ...]:
        """The report's lines about the resolution: one for ``None``, none otherwise."""
        return () if self.native is None else (self.native.line(),)


def given_backend(backend_config: object, step: str) -> GivenBackend:
    """``backend_config`` as a ``BackendConfig``; ``None`` is this host's native backend.

    ``None`` means what it means in torch.ao: the native backend of this CPU, lowered
    (``x86`` on an x86 CPU, ``qnnpack`` on ARM), among the installed backends; with none
    installed, the ``reference`` backend and a ``NativeBackendWarning`` naming the plugin
    to install (``fxquant.registry.native``).

    Raises:
        ConfigTypeError: neither a ``BackendConfig``, its dict form nor ``None``.

    Example:
        >>> given_backend({"name": "mine"}, "prepare_fx").config.name
        'mine'
    """
    resolved = as_backend_config(backend_config)
    if resolved is not None:
        return GivenBackend(resolved)
    native = host_native_backend(registry.list_backends(), step)
    config: BackendConfig = registry.get_backend_config(native.name)
    return GivenBackend(config, native)


@dataclass(frozen=True, slots=True)
class BackendKernels:
    """What ``convert_fx`` lowers with: the rules and deployment of the named backend.

    Example:
        >>> kernels = BackendKernels("mine", (), False, ())
        >>> kernels.note().startswith("kernels: no installed plugin provides backend 'mine'")
        True
    """

    backend: str
    rules: tuple[LoweringRule, ...]
    deployed: bool
    sources: tuple[str, ...]
    """The plugins (distributions, or registered objects) the rules and deployment came from;
    empty when no installed plugin provides the name."""

    def note(self) -> str:
        """The report's line saying where the kernels came from (``fxquant.explain``)."""
        if not self.sources:
            return (
                f"kernels: no installed plugin provides backend {self.backend!r}: no lowering "
                "rules (a config lowers with the kernels of the backend it is named after)"
            )
        what = f"{len(self.rules)} lowering rule{'s' if len(self.rules) != 1 else ''}"
        if self.deployed:
            what += " and its deployment"
        return (
            f"kernels: backend {self.backend!r} (by the config's name) -> {what} "
            f"from {', '.join(self.sources)}"
        )


def backend_kernels(backend_config: BackendConfig) -> BackendKernels:
    """The lowering rules and deployment the plugins of ``backend_config.name`` contribute.

    Example:
        >>> kernels = backend_kernels(BackendConfig("reference"))
        >>> kernels.rules, kernels.deployed, kernels.sources
        ((), False, ('fxquant',))
    """
    name = backend_config.name
    if not name:
        return BackendKernels(name, (), False, ())  # an unnamed config has no plugins
    try:
        assembled = registry.default_registry().assembled(name)
    except UnknownBackendError:
        return BackendKernels(name, (), False, ())
    sources = {origin.source for origin in assembled.kernel_origins.values()}
    if not sources or assembled.deployment is not None:
        sources |= {plugin.source for plugin in assembled.plugins}
    return BackendKernels(
        name, assembled.lowering_rules, assembled.deployment is not None, tuple(sorted(sources))
    )


def backend_graph_mode(
    backend_config: BackendConfig, model: fx.GraphModule, mapping: QConfigMapping, is_qat: bool
) -> tuple[GraphMode, QConfigMapping] | None:
    """The mode the plugins of ``backend_config.name`` pick for ``model``, with their default.

    Asked whatever mapping the user passed: prepare merges the mode into it
    (``fxquant.flow.graph_mode.compose``), the default mapping being the base the
    mode's parts are told by. A backend no installed plugin provides, or whose plugins
    implement no ``fxquant_graph_mode``, gets no mode; one with a mode but no default
    mapping gets an empty base.

    Raises:
        PluginError: a plugin's ``fxquant_graph_mode`` raised or answered wrongly.

    Example:
        >>> import torch
        >>> model = fx.symbolic_trace(torch.nn.Linear(2, 2))
        >>> mapping = registry.get_default_qconfig_mapping("reference")
        >>> backend_graph_mode(BackendConfig("reference"), model, mapping, False) is None
        True
    """
    name = backend_config.name
    if not name:
        return None
    try:
        assembled = registry.default_registry().assembled(name)
    except UnknownBackendError:
        return None
    mode = graph_mode(assembled, model, mapping, is_qat)
    if mode is None:
        return None
    try:
        base: QConfigMapping = default_qconfig_mapping(assembled, is_qat)
    except MissingDefaultQConfigError:
        base = QConfigMapping()
    return mode, base
