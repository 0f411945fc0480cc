"""The ``*_custom_config`` arguments of the flow: exceptions to the normal rules.

    FuseCustomConfig      attributes to keep on the fused model
    PrepareCustomConfig   standalone modules, custom module swaps, untraceable modules,
                          inputs/outputs already quantized, attributes to keep
    ConvertCustomConfig   observed -> quantized custom module swaps, attributes to keep

Setters and dict keys are torch.ao's (``input_quantized_idxs``,
``float_to_observed_custom_module_class``...), so existing dicts load unchanged.
Every setter validates and leaves the config unchanged when it raises.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, NamedTuple, TypeVar

import torch  # noqa: F401  # the docstring examples run in this module's namespace

from fxquant.config.backend import BackendConfig
from fxquant.config.checks import (
    check_dict_form,
    check_entries,
    check_module_class,
    check_str,
    unknown_keys,
)
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.config.serialize import DictForm
from fxquant.errors import ConfigError, ConfigTypeError, wrong_type

__all__ = [
    "ConvertCustomConfig",
    "FuseCustomConfig",
    "PrepareCustomConfig",
    "QuantType",
    "StandaloneModuleConfigEntry",
]

T = TypeVar("T")
P = TypeVar("P", bound="_Preserved")


class QuantType(enum.Enum):
    """The kind of quantization a custom module mapping applies to.

    Example:
        >>> QuantType("static") is QuantType.STATIC
        True
    """

    DYNAMIC = "dynamic"
    STATIC = "static"
    QAT = "qat"
    WEIGHT_ONLY = "weight_only"

    @classmethod
    def coerce(cls, value: object) -> QuantType:
        """Accept a QuantType, its string name, or torch.ao's QuantType (same member names).

        Example:
            >>> QuantType.coerce("qat")
            <QuantType.QAT: 'qat'>
        """
        if isinstance(value, QuantType):
            return value
        if isinstance(value, str) and value in {m.value for m in cls}:
            return cls(value)
        if isinstance(value, enum.Enum) and value.name in cls.__members__:
            return cls[value.name]
        choices = ", ".join(repr(m.value) for m in cls)
        msg = f"quant_type must be a QuantType or one of {choices}, got {value!r}"
        raise ConfigTypeError(msg)


def _index(value: object, argument: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise wrong_type(value, argument, "an int")
    if value < 0:
        msg = f"{argument} must be >= 0 (a position in the model's inputs/outputs), got {value!r}"
        raise ConfigError(msg)
    return value


def _list_of(values: object, argument: str, check: Callable[[object, str], T]) -> list[T]:
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise wrong_type(values, argument, "a list")
    return [check(v, f"{argument}[{i}]") for i, v in enumerate(values)]


def _optional(value: Any, cls: type[T], argument: str) -> T | None:
    """None, an instance of ``cls``, or its dict form (built with ``cls.from_dict``)."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        built: T = cls.from_dict(value)  # type: ignore[attr-defined]  # every config class has it
        return built
    raise wrong_type(value, argument, f"a {cls.__name__}, its dict form, or None")


@dataclass(frozen=True)
class StandaloneModuleConfigEntry:
    """How to quantize one standalone module: it is prepared as a model of its own.

    Example:
        >>> entry = StandaloneModuleConfigEntry(None, (torch.randn(1, 3),), None, None)
        >>> entry.example_inputs[0].shape
        torch.Size([1, 3])
    """

    qconfig_mapping: QConfigMapping | None
    example_inputs: tuple[Any, ...]
    prepare_custom_config: PrepareCustomConfig | None
    backend_config: BackendConfig | None

    def __post_init__(self) -> None:
        for name, cls in (
            ("qconfig_mapping", QConfigMapping),
            ("prepare_custom_config", PrepareCustomConfig),
            ("backend_config", BackendConfig),
        ):
            object.__setattr__(self, name, _optional(getattr(self, name), cls, name))
        if not isinstance(self.example_inputs, tuple):
            msg = (
                f"example_inputs must be a tuple of the module's positional inputs, got "
                f"{self.example_inputs!r}; wrap a single input as (x,)"
            )
            raise ConfigTypeError(msg)

    def as_tuple(self, key: object) -> tuple[Any, ...]:
        """The dict-form entry ``(key, qconfig dict, example_inputs, prepare dict, backend)``."""
        return (
            key,
            self.qconfig_mapping.to_dict() if self.qconfig_mapping is not None else None,
            self.example_inputs,
            self.prepare_custom_config.to_dict() if self.prepare_custom_config else None,
            self.backend_config,
        )


def _class_mapping_calls(value: object, key: str) -> list[tuple[type, type, QuantType]]:
    """The setter calls ``(from_class, to_class, quant_type)`` that a class mapping's dict
    form stands for."""
    if not isinstance(value, Mapping):
        msg = f"{key!r} must be a dict of quant type name -> {{class: class}}, got {value!r}"
        raise ConfigTypeError(msg)
    calls = []
    for quant_type, mapping in value.items():
        if not isinstance(mapping, Mapping):
            msg = f"{key}[{quant_type!r}] must be a dict of class -> class, got {mapping!r}"
            raise ConfigTypeError(msg)
        calls += [(a, b, QuantType.coerce(quant_type)) for a, b in mapping.items()]
    return calls


def _standalone_calls(entries: object, key: str) -> Iterator[Any]:
    """The setter calls that a list of standalone module entries stands for."""
    shape = "a tuple (key, qconfig_mapping, example_inputs, prepare_custom_config, backend_config)"
    return check_entries(entries, key, 5, "a list", shape)


class _Form(NamedTuple):
    """How a field of a custom config is written to its dict form and read back."""

    write: Callable[[Any], Any]
    """The attribute's value -> the dict form's."""
    calls: Callable[[Any, str], Iterable[Any]]
    """The dict form's value and key -> the argument tuples of the setter calls it stands for."""


_LIST: Final = _Form(list, lambda value, _: [(value,)])
_CLASSES: Final = _Form(
    lambda mappings: {kind.value: dict(classes) for kind, classes in mappings.items()},
    _class_mapping_calls,
)
_ENTRIES: Final = _Form(
    lambda entries: [e.as_tuple(k) for k, e in entries.items()], _standalone_calls
)


class _Preserved(DictForm):
    """Shared by the three custom configs: preserved attributes, the dict form, equality.

    ``from_dict`` takes torch.ao's dicts unchanged; an unknown key raises ``ConfigError``
    with ``strict=True``, and otherwise gives one ``ConfigWarning`` naming it (torch.ao
    ignores it).
    """

    def __init__(self) -> None:
        self.preserved_attributes: list[str] = []

    def set_preserved_attributes(self: T, attributes: Iterable[str]) -> T:
        """Names of attributes to copy onto the resulting GraphModule.

        Example:
            >>> FuseCustomConfig().set_preserved_attributes(["scale"]).preserved_attributes
            ['scale']
        """
        checked = _list_of(attributes, "preserved_attributes", check_str)
        self.preserved_attributes = checked  # type: ignore[attr-defined]  # T is a _Preserved
        return self

    # dict key (torch.ao's, in its order) -> (attribute, form, the setter from_dict calls,
    # for a standalone module once per module)
    _FIELDS: ClassVar[dict[str, tuple[str, _Form, Callable[..., Any]]]] = {
        "preserved_attributes": ("preserved_attributes", _LIST, set_preserved_attributes)
    }

    def to_dict(self) -> dict[str, Any]:
        """The dict form with torch.ao's keys; empty settings are left out."""
        fields = self._FIELDS.items()
        return {k: form.write(getattr(self, a)) for k, (a, form, _) in fields if getattr(self, a)}

    @classmethod
    def _build(cls: type[P], data: object, strict: bool) -> P:
        data = check_dict_form(data, cls.__name__)
        # the warning's stacklevel points at the caller of from_dict, two frames up
        unknown_keys(data, tuple(cls._FIELDS), f"{cls.__name__}.from_dict", strict)
        config = cls()
        for key, (_, form, setter) in cls._FIELDS.items():
            for arguments in form.calls(data[key], key) if key in data else ():
                setter(config, *arguments)
        return config


class FuseCustomConfig(_Preserved):
    """Custom settings for ``fuse_fx``: attributes to keep.

    Example:
        >>> FuseCustomConfig().set_preserved_attributes(["attr1"]).to_dict()
        {'preserved_attributes': ['attr1']}
    """

    @classmethod
    def from_dict(
        cls, fuse_custom_config_dict: Mapping[str, Any], *, strict: bool = False
    ) -> FuseCustomConfig:
        """Build from the dict form (key ``"preserved_attributes"``).

        Example:
            >>> FuseCustomConfig.from_dict({}).preserved_attributes
            []
        """
        return cls._build(fuse_custom_config_dict, strict)


class PrepareCustomConfig(_Preserved):
    """Custom settings for ``prepare_fx`` / ``prepare_qat_fx``.

    Example:
        >>> config = (PrepareCustomConfig()
        ...     .set_non_traceable_module_names(["decoder"])
        ...     .set_input_quantized_indexes([0])
        ...     .set_preserved_attributes(["vocab"]))
        >>> sorted(config.to_dict())
        ['input_quantized_idxs', 'non_traceable_module_name', 'preserved_attributes']
    """

    def __init__(self) -> None:
        super().__init__()
        self.standalone_module_names: dict[str, StandaloneModuleConfigEntry] = {}
        self.standalone_module_classes: dict[type, StandaloneModuleConfigEntry] = {}
        self.float_to_observed_mapping: dict[QuantType, dict[type, type]] = {}
        self.non_traceable_module_names: list[str] = []
        self.non_traceable_module_classes: list[type] = []
        self.input_quantized_indexes: list[int] = []
        self.output_quantized_indexes: list[int] = []

    def set_standalone_module_name(
        self,
        module_name: str,
        qconfig_mapping: QConfigMapping | None,
        example_inputs: tuple[Any, ...],
        prepare_custom_config: PrepareCustomConfig | None,
        backend_config: BackendConfig | None,
    ) -> PrepareCustomConfig:
        """Prepare the submodule named ``module_name`` as a standalone model.

        Example:
            >>> c = PrepareCustomConfig().set_standalone_module_name(
            ...     "sub", None, (torch.randn(2),), None, None)
            >>> list(c.standalone_module_names)
            ['sub']
        """
        name = check_str(module_name, "module_name")
        entry = StandaloneModuleConfigEntry(
            qconfig_mapping, example_inputs, prepare_custom_config, backend_config
        )
        self.standalone_module_names[name] = entry
        return self

    def set_standalone_module_class(
        self,
        module_class: type,
        qconfig_mapping: QConfigMapping | None,
        example_inputs: tuple[Any, ...],
        prepare_custom_config: PrepareCustomConfig | None,
        backend_config: BackendConfig | None,
    ) -> PrepareCustomConfig:
        """Prepare every submodule of class ``module_class`` as a standalone model.

        Example:
            >>> c = PrepareCustomConfig().set_standalone_module_class(
            ...     torch.nn.LSTM, None, (torch.randn(2, 3),), None, None)
            >>> list(c.standalone_module_classes) == [torch.nn.LSTM]
            True
        """
        cls = check_module_class(module_class, "module_class")
        entry = StandaloneModuleConfigEntry(
            qconfig_mapping, example_inputs, prepare_custom_config, backend_config
        )
        self.standalone_module_classes[cls] = entry
        return self

    def set_float_to_observed_mapping(
        self,
        float_class: type,
        observed_class: type,
        quant_type: QuantType | str = QuantType.STATIC,
    ) -> PrepareCustomConfig:
        """Swap ``float_class`` modules for ``observed_class`` (its ``from_float``) in prepare.

        Raises:
            ConfigError: for a quant type other than static (the only one supported).

        Example:
            >>> c = PrepareCustomConfig().set_float_to_observed_mapping(
            ...     torch.nn.LSTM, torch.nn.LSTM)
            >>> list(c.float_to_observed_mapping)
            [<QuantType.STATIC: 'static'>]
        """
        float_cls = check_module_class(float_class, "float_class")
        observed_cls = check_module_class(observed_class, "observed_class")
        kind = QuantType.coerce(quant_type)
        if kind is not QuantType.STATIC:
            msg = (
                f"set_float_to_observed_mapping supports quant_type=QuantType.STATIC only, "
                f"got {kind!r}; custom modules for QAT or dynamic quantization are not supported"
            )
            raise ConfigError(msg)
        self.float_to_observed_mapping.setdefault(kind, {})[float_cls] = observed_cls
        return self

    def set_non_traceable_module_names(self, module_names: Iterable[str]) -> PrepareCustomConfig:
        """Submodules (by name) that symbolic tracing must not enter.

        Example:
            >>> c = PrepareCustomConfig().set_non_traceable_module_names(["a"])
            >>> c.non_traceable_module_names
            ['a']
        """
        self.non_traceable_module_names = _list_of(module_names, "module_names", check_str)
        return self

    def set_non_traceable_module_classes(
        self, module_classes: Iterable[type]
    ) -> PrepareCustomConfig:
        """Submodule classes that symbolic tracing must not enter.

        Example:
            >>> c = PrepareCustomConfig().set_non_traceable_module_classes([torch.nn.LSTM])
            >>> c.non_traceable_module_classes == [torch.nn.LSTM]
            True
        """
        checked: list[type] = _list_of(module_classes, "module_classes", check_module_class)
        self.non_traceable_module_classes = checked
        return self

    def set_input_quantized_indexes(self, indexes: Iterable[int]) -> PrepareCustomConfig:
        """Model inputs (by position) that arrive already quantized.

        Example:
            >>> PrepareCustomConfig().set_input_quantized_indexes([0]).input_quantized_indexes
            [0]
        """
        self.input_quantized_indexes = _list_of(indexes, "indexes", _index)
        return self

    def set_output_quantized_indexes(self, indexes: Iterable[int]) -> PrepareCustomConfig:
        """Model outputs (by position) to leave quantized.

        Example:
            >>> PrepareCustomConfig().set_output_quantized_indexes([0]).output_quantized_indexes
            [0]
        """
        self.output_quantized_indexes = _list_of(indexes, "indexes", _index)
        return self

    _FIELDS: ClassVar = {
        "standalone_module_name": ("standalone_module_names", _ENTRIES, set_standalone_module_name),
        "standalone_module_class": (
            "standalone_module_classes",
            _ENTRIES,
            set_standalone_module_class,
        ),
        "float_to_observed_custom_module_class": (
            "float_to_observed_mapping",
            _CLASSES,
            set_float_to_observed_mapping,
        ),
        "non_traceable_module_name": (
            "non_traceable_module_names",
            _LIST,
            set_non_traceable_module_names,
        ),
        "non_traceable_module_class": (
            "non_traceable_module_classes",
            _LIST,
            set_non_traceable_module_classes,
        ),
        "input_quantized_idxs": ("input_quantized_indexes", _LIST, set_input_quantized_indexes),
        "output_quantized_idxs": ("output_quantized_indexes", _LIST, set_output_quantized_indexes),
        **_Preserved._FIELDS,
    }

    @classmethod
    def from_dict(
        cls, prepare_custom_config_dict: Mapping[str, Any], *, strict: bool = False
    ) -> PrepareCustomConfig:
        """Build from the dict form (see :meth:`to_dict` and the class's base).

        Example:
            >>> PrepareCustomConfig.from_dict({"input_quantized_idxs": [0]}).input_quantized_indexes
            [0]
        """
        return cls._build(prepare_custom_config_dict, strict)


class ConvertCustomConfig(_Preserved):
    """Custom settings for ``convert_fx``: custom module swaps and attributes to keep.

    Example:
        >>> config = ConvertCustomConfig().set_observed_to_quantized_mapping(
        ...     torch.nn.LSTM, torch.nn.LSTM)
        >>> list(config.to_dict()["observed_to_quantized_custom_module_class"])
        ['static']
    """

    def __init__(self) -> None:
        super().__init__()
        self.observed_to_quantized_mapping: dict[QuantType, dict[type, type]] = {}

    def set_observed_to_quantized_mapping(
        self,
        observed_class: type,
        quantized_class: type,
        quant_type: QuantType | str = QuantType.STATIC,
    ) -> ConvertCustomConfig:
        """Swap ``observed_class`` modules for ``quantized_class`` (its ``from_observed``).

        Example:
            >>> c = ConvertCustomConfig().set_observed_to_quantized_mapping(
            ...     torch.nn.LSTM, torch.nn.LSTM, "dynamic")
            >>> list(c.observed_to_quantized_mapping)
            [<QuantType.DYNAMIC: 'dynamic'>]
        """
        observed_cls = check_module_class(observed_class, "observed_class")
        quantized_cls = check_module_class(quantized_class, "quantized_class")
        kind = QuantType.coerce(quant_type)
        self.observed_to_quantized_mapping.setdefault(kind, {})[observed_cls] = quantized_cls
        return self

    _FIELDS: ClassVar = {
        "observed_to_quantized_custom_module_class": (
            "observed_to_quantized_mapping",
            _CLASSES,
            set_observed_to_quantized_mapping,
        ),
        **_Preserved._FIELDS,
    }

    @classmethod
    def from_dict(
        cls, convert_custom_config_dict: Mapping[str, Any], *, strict: bool = False
    ) -> ConvertCustomConfig:
        """Build from the dict form (see :meth:`to_dict` and the class's base).

        Example:
            >>> ConvertCustomConfig.from_dict({"preserved_attributes": ["a"]}).preserved_attributes
            ['a']
        """
        return cls._build(convert_custom_config_dict, strict)
