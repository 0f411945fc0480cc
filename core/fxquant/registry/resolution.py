"""What a flow entry point learns about its ``backend_config``, in one registry call.

``Registry.resolve(backend_config, step)`` is the only question the flow asks the
registry. ``None`` becomes this host's native backend (``fxquant.registry.native``);
a config's *name* picks the plugins whose lowering rules and deployment ``convert_fx``
uses (CONTRACT: "the kernels of the backend named by backend_config.name ... resolved
once, when the flow starts"), so a config read from JSON as ``"x86"`` lowers with x86's
kernels and a config named after no installed backend gets none. The answer, a frozen
``ResolvedBackend``, travels in the ``FlowContext`` and in the prepared model's flow
state: convert lowers with what prepare resolved, and only this record calls a hook
after the entry point (``fxquant_graph_mode``, which needs the traced graph).

To lower with another backend's kernels, name the config after that backend
(``config.set_name("x86")``): the name is the one switch, and the report shows it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fxquant.config.backend import BackendConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import MissingDefaultQConfigError
from fxquant.lowering import LoweringRule
from fxquant.registry.answers import Deployment, GraphMode
from fxquant.registry.assembly import AssembledBackend, default_qconfig_mapping, graph_mode
from fxquant.registry.native import NativeBackend

__all__ = ["ResolvedBackend"]


@dataclass(frozen=True, slots=True)
class ResolvedBackend:
    """A ``backend_config`` resolved by the registry at a flow entry point.

    Build one with ``Registry.resolve``; a context built by hand for a test holds
    ``ResolvedBackend(config)``: no kernels, no deployment, no graph modes.

    Example:
        >>> resolved = ResolvedBackend(BackendConfig("mine"))
        >>> resolved.name, resolved.lowering_rules, resolved.notes()
        ('mine', (), ())
    """

    config: BackendConfig
    """The pattern configs the flow quantizes with: the user's, or the native backend's."""
    lowering_rules: tuple[LoweringRule, ...] = ()
    deployment: Deployment | None = None
    sources: tuple[str, ...] = ()
    """The plugins (distributions, or registered objects) the rules and deployment came from;
    empty when no installed plugin provides the config's name."""
    native: NativeBackend | None = None
    """How ``backend_config=None`` was resolved; ``None`` when the user passed a config."""
    assembled: AssembledBackend | None = field(default=None, repr=False, compare=False)
    """The backend the name resolved to, asked for graph modes once the graph is traced."""

    @classmethod
    def of(
        cls, config: BackendConfig, assembled: AssembledBackend | None, native: NativeBackend | None
    ) -> ResolvedBackend:
        """What ``config`` gets from ``assembled`` (the backend its name resolved to, if any).

        Example:
            >>> ResolvedBackend.of(BackendConfig("mine"), None, None).sources
            ()
        """
        if assembled is None:
            return cls(config, native=native)
        sources = {origin.source for origin in assembled.kernel_origins.values()}
        if not sources or assembled.deployment is not None:
            sources |= {plugin.source for plugin in assembled.plugins}
        rules = assembled.lowering_rules
        return cls(config, rules, assembled.deployment, tuple(sorted(sources)), native, assembled)

    @property
    def name(self) -> str:
        """The backend's name: the config's, which chose the kernels."""
        return str(self.config.name)

    @property
    def deployed(self) -> bool:
        """The backend runs its models outside PyTorch (a ``Deployment``)."""
        return self.deployment is not None

    def notes(self) -> tuple[str, ...]:
        """The report's lines about ``None``'s resolution: one for ``None``, none otherwise."""
        return () if self.native is None else (self.native.line(),)

    def kernels_note(self) -> str:
        """The report's line saying where ``convert_fx``'s kernels came from.

        Example:
            >>> ResolvedBackend(BackendConfig("mine")).kernels_note()[:55]
            "kernels: no installed plugin provides backend 'mine': n"
        """
        if not self.sources:
            return (
                f"kernels: no installed plugin provides backend {self.name!r}: no lowering "
                "rules (a config lowers with the kernels of the backend it is named after)"
            )
        count = len(self.lowering_rules)
        what = f"{count} lowering rule{'s' if count != 1 else ''}"
        if self.deployed:
            what += " and its deployment"
        return (
            f"kernels: backend {self.name!r} (by the config's name) -> {what} "
            f"from {', '.join(self.sources)}"
        )

    def with_config(self, config: BackendConfig) -> ResolvedBackend:
        """The same resolution for another config of the same name (one ``convert_fx`` got).

        Example:
            >>> ResolvedBackend(BackendConfig("b")).with_config(BackendConfig("b")).name
            'b'
        """
        assert config.name == self.name  # the kernels are the name's
        return dataclasses.replace(self, config=config, native=None)

    def graph_mode(
        self, model: Any, mapping: QConfigMapping, is_qat: bool
    ) -> tuple[GraphMode, QConfigMapping] | None:
        """The mode the backend's plugins pick for ``model``'s graph, with their default mapping.

        Asked whatever mapping the user passed: prepare merges the mode into it
        (``fxquant.flow.graph_mode.compose``), the default mapping being the base
        the mode's parts are told by. A backend no installed plugin provides, or
        whose plugins implement no ``fxquant_graph_mode``, gets no mode; one with
        a mode but no default mapping gets an empty base.

        Raises:
            PluginError: a plugin's ``fxquant_graph_mode`` raised or answered wrongly.

        Example:
            >>> ResolvedBackend(BackendConfig("b")).graph_mode(None, QConfigMapping(), False)
        """
        if self.assembled is None:
            return None
        mode = graph_mode(self.assembled, model, mapping, is_qat)
        if mode is None:
            return None
        try:
            base: QConfigMapping = default_qconfig_mapping(self.assembled, is_qat)
        except MissingDefaultQConfigError:
            base = QConfigMapping()
        return mode, base

    def __deepcopy__(self, memo: dict[int, Any]) -> ResolvedBackend:
        # a record of the registry's answers, shared by copies of a prepared model: the
        # assembled backend holds plugin modules and a plugin manager, which do not copy
        return self
