"""FlowContext: everything a flow step reads besides the graph, frozen.

Built once per public call (``prepare_fx`` ...) from the user's arguments.
It is also where every config argument's torch.ao dict form (``BackendConfig.
to_dict()`` output, a qconfig dict, a custom config dict) becomes its class:
the flow functions keep the seed's signatures and nothing past this module sees
a dict. The backend comes in resolved: the entry point asks the registry once
(``fxquant.registry.resolve_backend``) and the context holds the answer, a
``ResolvedBackend`` (the pattern configs, lowering rules, deployment, graph modes
and how ``None`` was resolved); the steps read it from here and ask nobody.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fxquant.config.backend import BackendConfig
from fxquant.config.custom import FuseCustomConfig, PrepareCustomConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigTypeError, wrong_type
from fxquant.lowering import LoweringRule
from fxquant.registry.resolution import ResolvedBackend

__all__ = ["FlowContext", "as_backend_config", "as_config"]


def as_backend_config(backend_config: object) -> BackendConfig | None:
    """``backend_config`` as a ``BackendConfig`` (its dict form converted), or ``None``.

    Raises:
        ConfigTypeError: neither a ``BackendConfig``, its dict form nor ``None``.

    Example:
        >>> as_backend_config({"name": "mine", "configs": []}).name
        'mine'
    """
    if backend_config is None:
        return None  # this host's native backend, which the registry resolves
    expected = (
        "a fxquant.BackendConfig, its dict form (BackendConfig.to_dict()) "
        "or None (this host's native backend)"
    )
    return as_config(backend_config, BackendConfig, "backend_config", expected)


def _resolved(backend: ResolvedBackend | BackendConfig) -> ResolvedBackend:
    # a config given by hand: no kernels, no graph modes
    return backend if isinstance(backend, ResolvedBackend) else ResolvedBackend(backend)


_Config = TypeVar("_Config")


def as_config(value: object, cls: type[_Config], argument: str, expected: str = "") -> _Config:
    """``value`` as a ``cls`` (a config class with ``from_dict``); ``None`` gives ``cls()``.

    ``expected``: the error's words for what ``argument`` takes, when not the generic ones.

    Raises:
        ConfigTypeError: ``value`` is neither a ``cls``, its dict form nor ``None``.

    Example:
        >>> from fxquant.config.custom import ConvertCustomConfig
        >>> config = as_config({"preserved_attributes": ["a"]}, ConvertCustomConfig, "c")
        >>> config.preserved_attributes
        ['a']
    """
    if value is None:
        return cls()
    if isinstance(value, Mapping) and not isinstance(value, cls):
        # torch.ao's dict form; every config class has from_dict
        config: _Config = cls.from_dict(value)  # type: ignore[attr-defined]
        return config
    if not isinstance(value, cls):
        expected = expected or f"a fxquant.{cls.__name__}, its dict form or None"
        raise wrong_type(value, argument, expected)
    return value


def _check_concrete_args(value: object) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return dict(value)
    msg = (
        f"concrete_args must be a dict from forward() parameter names to the values to "
        f"trace with (e.g. {{'attention_mask': None}}) or None, got {value!r} of type "
        f"{type(value).__name__}"
    )
    raise ConfigTypeError(msg)


@dataclass(frozen=True, slots=True)
class FlowContext:
    """The inputs of one flow call, checked and resolved.

    ``backend`` is what the entry point's one registry call resolved ``backend_config``
    to: lowering rules, deployment, graph modes, how ``None`` was resolved. A context
    built by hand (tests) holds ``ResolvedBackend(config)``: no kernels, no graph modes;
    the ``for_*`` builders take the ``BackendConfig`` alone too.

    Example:
        >>> from fxquant.config.backend import BackendConfig
        >>> ctx = FlowContext.for_fuse(None, BackendConfig("mine"))
        >>> ctx.backend_config.name, ctx.is_qat, ctx.lowering_rules
        ('mine', False, ())
    """

    backend: ResolvedBackend
    qconfig_mapping: QConfigMapping | None = None
    prepare_custom_config: PrepareCustomConfig = field(default_factory=PrepareCustomConfig)
    preserved_attributes: tuple[str, ...] = ()
    is_qat: bool = False
    strict: bool = False
    example_inputs: tuple[Any, ...] = ()
    concrete_args: Mapping[str, Any] | None = None

    @property
    def backend_config(self) -> BackendConfig:
        """The pattern configs the flow quantizes with: the resolution's."""
        return self.backend.config

    @property
    def lowering_rules(self) -> tuple[LoweringRule, ...]:
        """The rules ``lower`` replaces reference patterns with."""
        return self.backend.lowering_rules

    @property
    def deployed(self) -> bool:
        """The backend runs its models outside PyTorch (a ``Deployment``)."""
        return self.backend.deployed

    @classmethod
    def for_fuse(
        cls,
        fuse_custom_config: FuseCustomConfig | Mapping[str, Any] | None,
        backend: ResolvedBackend | BackendConfig,
    ) -> FlowContext:
        """The context of ``fuse_fx``.

        Example:
            >>> FlowContext.for_fuse(None, BackendConfig("b")).qconfig_mapping is None
            True
        """
        custom = as_config(fuse_custom_config, FuseCustomConfig, "fuse_custom_config")
        return cls(_resolved(backend), preserved_attributes=tuple(custom.preserved_attributes))

    @classmethod
    def for_prepare(  # noqa: PLR0913  # the seed's four arguments, the two modes, concrete_args
        cls,
        qconfig_mapping: QConfigMapping | Mapping[str, Any],
        example_inputs: Any,
        prepare_custom_config: PrepareCustomConfig | Mapping[str, Any] | None,
        backend: ResolvedBackend | BackendConfig,
        *,
        is_qat: bool,
        strict: bool,
        concrete_args: object = None,
    ) -> FlowContext:
        """The context of ``prepare_fx`` / ``prepare_qat_fx``.

        ``concrete_args``: prepare's ``forward`` parameters to trace with fixed values.

        Raises:
            ConfigTypeError: for a qconfig mapping or custom config of the wrong type, or
                ``concrete_args`` not a dict keyed by parameter names.

        Example:
            >>> ctx = FlowContext.for_prepare(QConfigMapping(), (), None, BackendConfig("b"),
            ...                               is_qat=True, strict=False)
            >>> ctx.is_qat
            True
        """
        mapping = as_config(qconfig_mapping, QConfigMapping, "qconfig_mapping")
        custom = as_config(prepare_custom_config, PrepareCustomConfig, "prepare_custom_config")
        if not isinstance(example_inputs, tuple):
            example_inputs = (example_inputs,)  # torch.ao accepts a lone tensor too
        return cls(
            _resolved(backend),
            qconfig_mapping=mapping,
            prepare_custom_config=custom,
            preserved_attributes=tuple(custom.preserved_attributes),
            is_qat=bool(is_qat),
            strict=bool(strict),
            example_inputs=example_inputs,
            concrete_args=_check_concrete_args(concrete_args),
        )

    @classmethod
    def for_convert(cls, backend: ResolvedBackend | BackendConfig, *, strict: bool) -> FlowContext:
        """The context of ``convert_fx``: the backend and the kernels it lowers with.

        ``convert_fx`` passes the resolution prepare recorded (or, for a config named
        after another backend, its own); nothing here looks anything up.

        Example:
            >>> ctx = FlowContext.for_convert(BackendConfig("mine"), strict=False)
            >>> ctx.lowering_rules, ctx.deployed
            ((), False)
        """
        return cls(_resolved(backend), strict=bool(strict))
