"""What a backend can run: ``BackendConfig`` and the records it is built from.

    BackendConfig ── BackendPatternConfig (one per pattern, keyed by its complex form)
                         ├── ObservationType      where observers go
                         ├── DTypeConfig*         dtypes of input/output/weight/bias
                         │     └── DTypeWithConstraints   dtype + quant/scale range limits
                         └── modules and fusers   root/QAT/reference/fused module, fuser

The public classes keep torch.ao's fluent setters, attribute names and dict
keys, so configs written for torch.ao port by changing imports. Unlike
torch.ao, every setter validates its argument and leaves the object unchanged
when it raises, and dtypes compare by storage (``torch.quint8 == torch.uint8``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Final

import torch

from fxquant.config import pattern as patterns
from fxquant.config import serialize
from fxquant.config.checks import check_dict_form, check_module_class, check_real, check_str
from fxquant.config.pattern import Pattern
from fxquant.dtypes import canonical_dtype, dtype_name
from fxquant.errors import ConfigError, ConfigTypeError, wrong_type

__all__ = [
    "BackendConfig",
    "BackendPatternConfig",
    "DTypeConfig",
    "DTypeWithConstraints",
    "ObservationType",
]


class ObservationType(enum.Enum):
    """Where the prepare step puts observers around a matched pattern.

    Example:
        >>> ObservationType["OUTPUT_SHARE_OBSERVER_WITH_INPUT"].value
        1
    """

    OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT = 0
    """Input and output each get their own observer (linear, conv, softmax)."""
    OUTPUT_SHARE_OBSERVER_WITH_INPUT = 1
    """The output reuses the input's observer instance (cat, max_pool, reshape)."""
    INPUT_OUTPUT_NOT_OBSERVED = 2
    """Neither input nor output is observed (``x.shape``, ``x.size()``)."""


def _check_observation_type(value: object, argument: str) -> ObservationType:
    if isinstance(value, ObservationType):
        return value
    # torch.ao's enum (from its dicts) carries the same member names
    if type(value).__name__ == "ObservationType" and isinstance(value, enum.Enum):
        return ObservationType[value.name]
    choices = ", ".join(f"ObservationType.{m.name}" for m in ObservationType)
    msg = f"{argument} must be an ObservationType, got {value!r}; choose one of {choices}"
    raise ConfigTypeError(msg)


def _check_dtype(value: object, argument: str) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    hint = "; e.g. torch.uint8, torch.int8, torch.float16"
    raise wrong_type(value, argument, "a torch.dtype or None", hint)


def _check_number(value: object, argument: str, kinds: tuple[type, ...]) -> None:
    if value is None or (isinstance(value, kinds) and not isinstance(value, bool)):
        return
    expected = " or ".join(k.__name__ for k in kinds)
    raise wrong_type(value, argument, f"{expected} or None")


@dataclass(frozen=True, eq=False)
class DTypeWithConstraints:
    """A dtype plus the limits a backend puts on quantization parameters using it.

    ``quant_min``/``quant_max`` of the user's observer must lie within
    ``[quant_min_lower_bound, quant_max_upper_bound]``; its minimum scale (``eps``) must
    be at least ``scale_min_lower_bound``; ``scale_exact_match`` and
    ``zero_point_exact_match`` together ask for fixed qparams (sigmoid, tanh).
    ``zero_point_exact_match`` alone asks for symmetric quantization around that
    zero point (an observer with a ``*_symmetric`` qscheme: 0 for int8), which
    kernels that ignore a zero point need (XNNPACK's weights, TensorRT).
    Equality treats ``torch.quint8`` and ``torch.uint8`` (etc.) as the same dtype.

    Raises:
        ConfigTypeError: for a non-dtype ``dtype`` or non-numeric bounds.
        ConfigError: for a lower bound above its upper bound, or constraints without a dtype.

    Example:
        >>> c = DTypeWithConstraints(torch.quint8, quant_min_lower_bound=0,
        ...                          quant_max_upper_bound=255, scale_min_lower_bound=2**-12)
        >>> c == DTypeWithConstraints(torch.uint8, 0, 255, 2**-12)
        True
    """

    dtype: torch.dtype | None = None
    quant_min_lower_bound: int | float | None = None
    quant_max_upper_bound: int | float | None = None
    scale_min_lower_bound: int | float | None = None
    scale_max_upper_bound: int | float | None = None
    scale_exact_match: float | None = None
    zero_point_exact_match: int | None = None

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, "DTypeWithConstraints dtype")
        for name in ("quant_min_lower_bound", "quant_max_upper_bound"):
            _check_number(getattr(self, name), name, (int, float))
            # a NaN bound compares False both ways: it silently switched the check off
            check_real(getattr(self, name), f"DTypeWithConstraints {name}", optional=True)
        for name in ("scale_min_lower_bound", "scale_max_upper_bound", "scale_exact_match"):
            _check_number(getattr(self, name), name, (int, float))
            check_real(
                getattr(self, name), f"DTypeWithConstraints {name}", positive=True, optional=True
            )
        _check_number(self.zero_point_exact_match, "zero_point_exact_match", (int,))
        self._check_order("quant_min_lower_bound", "quant_max_upper_bound")
        self._check_order("scale_min_lower_bound", "scale_max_upper_bound")
        if self.dtype is None and any(v is not None for v in self._constraints()):
            msg = (
                f"DTypeWithConstraints sets constraints {self!r} but dtype is None; "
                "constraints apply to a dtype: pass dtype=torch.uint8 (or the dtype meant)"
            )
            raise ConfigError(msg)

    def _check_order(self, low_name: str, high_name: str) -> None:
        low, high = getattr(self, low_name), getattr(self, high_name)
        if low is not None and high is not None and low > high:
            msg = (
                f"{low_name}={low!r} is greater than {high_name}={high!r}; "
                f"the lower bound must not exceed the upper bound"
            )
            raise ConfigError(msg)

    def _constraints(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if f.name != "dtype")

    def _key(self) -> tuple[Any, ...]:
        dtype = None if self.dtype is None else canonical_dtype(self.dtype)
        return (dtype, *self._constraints())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DTypeWithConstraints):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @classmethod
    def coerce(cls, value: object, argument: str) -> DTypeWithConstraints:
        """Accept a dtype, None, a DTypeWithConstraints (fxquant's or torch.ao's).

        Example:
            >>> DTypeWithConstraints.coerce(torch.qint8, "weight_dtype").dtype
            torch.qint8
        """
        if isinstance(value, DTypeWithConstraints):
            return value
        if value is None or isinstance(value, torch.dtype):
            return cls(dtype=value)
        if type(value).__name__ == "DTypeWithConstraints":  # torch.ao's record, same fields
            names = [f.name for f in fields(cls)]
            if all(hasattr(value, n) for n in names):
                return cls(**{n: getattr(value, n) for n in names})
        raise wrong_type(value, argument, "a torch.dtype, a DTypeWithConstraints or None")


_CONSTRAINED_KEYS: Final = ("input_dtype", "output_dtype", "weight_dtype")
_DTYPE_CONFIG_KEYS: Final = (*_CONSTRAINED_KEYS, "bias_dtype", "is_dynamic")


def _check_keys(data: object, valid: Iterable[str], owner: str) -> Mapping[str, Any]:
    data = check_dict_form(data, owner)
    valid = tuple(valid)
    unknown = [k for k in data if k not in valid]
    if unknown:
        listed = ", ".join(repr(k) for k in valid)
        bad = ", ".join(map(repr, unknown))
        msg = f"{owner}.from_dict got unknown key(s) {bad}; valid keys: {listed}"
        raise ConfigError(msg)
    return data


@dataclass(frozen=True, init=False, eq=True)
class DTypeConfig:
    """The dtypes a pattern supports: input/output activations, weight, bias.

    ``input_dtype`` is the dtype of the quantize op before the pattern,
    ``output_dtype`` the one after it (float for dynamic quantization, where the
    output is not quantized). A static config with a quantized ``input_dtype`` and a
    float ``output_dtype`` (fxquant's extension) is an int8-in, float-out kernel:
    the pattern's output gets no observer and stays float in the reference model, as
    the kernel returns it; a quantized consumer quantizes it on its own input. Each of
    input/output/weight may be a plain dtype or a :class:`DTypeWithConstraints`.

    Args:
        input_dtype: dtype (or constrained dtype) of the input activation.
        output_dtype: dtype (or constrained dtype) of the output activation.
        weight_dtype: dtype (or constrained dtype) of the weight.
        bias_dtype: dtype of the bias (float32 or float16).
        is_dynamic: True when activations are quantized on the fly (dynamic quantization).

    Example:
        >>> config = DTypeConfig(input_dtype=torch.quint8, output_dtype=torch.quint8,
        ...                      weight_dtype=torch.qint8, bias_dtype=torch.float)
        >>> config.weight_dtype
        torch.qint8
    """

    input_dtype_with_constraints: DTypeWithConstraints
    output_dtype_with_constraints: DTypeWithConstraints
    weight_dtype_with_constraints: DTypeWithConstraints
    bias_dtype: torch.dtype | None
    is_dynamic: bool | None

    def __init__(  # torch.ao's signature, kept for drop-in use
        self,
        input_dtype: torch.dtype | DTypeWithConstraints | None = None,
        output_dtype: torch.dtype | DTypeWithConstraints | None = None,
        weight_dtype: torch.dtype | DTypeWithConstraints | None = None,
        bias_dtype: torch.dtype | None = None,
        is_dynamic: bool | None = None,
    ) -> None:
        # frozen: the fields are set through object.__setattr__
        given = (input_dtype, output_dtype, weight_dtype)
        for key, value in zip(_CONSTRAINED_KEYS, given, strict=True):
            checked = DTypeWithConstraints.coerce(value, key)
            object.__setattr__(self, f"{key}_with_constraints", checked)
        object.__setattr__(self, "bias_dtype", _check_dtype(bias_dtype, "bias_dtype"))
        if is_dynamic is not None and not isinstance(is_dynamic, bool):
            msg = f"is_dynamic must be True, False or None, got {is_dynamic!r}"
            raise ConfigTypeError(msg)
        object.__setattr__(self, "is_dynamic", is_dynamic)

    @property
    def input_dtype(self) -> torch.dtype | None:
        """The input activation's dtype, without constraints."""
        return self.input_dtype_with_constraints.dtype

    @property
    def output_dtype(self) -> torch.dtype | None:
        """The output activation's dtype, without constraints."""
        return self.output_dtype_with_constraints.dtype

    @property
    def weight_dtype(self) -> torch.dtype | None:
        """The weight's dtype, without constraints."""
        return self.weight_dtype_with_constraints.dtype

    def to_dict(self) -> dict[str, Any]:
        """The dict form (torch.ao's keys); unset entries are left out.

        Example:
            >>> DTypeConfig(bias_dtype=torch.float16).to_dict()
            {'bias_dtype': torch.float16}
        """
        # input/output/weight: the dtype decides whether the entry is set; the entry is the
        # dtype with its constraints
        return {
            key: getattr(self, f"{key}_with_constraints" if key in _CONSTRAINED_KEYS else key)
            for key in _DTYPE_CONFIG_KEYS
            if getattr(self, key) is not None
        }

    @classmethod
    def from_dict(cls, dtype_config_dict: Mapping[str, Any]) -> DTypeConfig:
        """Build from the dict form (keys as :meth:`to_dict` writes them, all optional).

        Raises:
            ConfigError: for an unknown key (the message lists the valid ones).

        Example:
            >>> DTypeConfig.from_dict({"input_dtype": torch.quint8}).input_dtype
            torch.quint8
        """
        data = _check_keys(dtype_config_dict, _DTYPE_CONFIG_KEYS, "DTypeConfig")
        return cls(**{k: data[k] for k in _DTYPE_CONFIG_KEYS if k in data})

    @classmethod
    def coerce(cls, value: object, argument: str) -> DTypeConfig:
        """Accept a DTypeConfig or its dict form (as torch.ao's dicts hold).

        Example:
            >>> DTypeConfig.coerce({"bias_dtype": torch.float}, "dtype_configs[0]").bias_dtype
            torch.float32
        """
        if isinstance(value, DTypeConfig):
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        raise wrong_type(value, argument, "a DTypeConfig (or its dict form)")


def _check_callable(value: object, argument: str) -> Callable[..., Any] | None:
    if value is None or callable(value):
        return value
    raise wrong_type(value, argument, "a function or None")


def _check_index_map(value: object, argument: str, key_type: type) -> dict[Any, Any]:
    if not isinstance(value, Mapping):
        raise wrong_type(value, argument, "a dict")
    for key in value:
        if not isinstance(key, key_type) or isinstance(key, bool):
            msg = (
                f"{argument} keys must be {key_type.__name__}, got key {key!r} "
                f"of type {type(key).__name__}"
            )
            raise ConfigTypeError(msg)
    return dict(value)


def _check_observation_types(value: object, argument: str) -> dict[int, ObservationType]:
    checked = _check_index_map(value, argument, int)
    return {k: _check_observation_type(v, f"{argument}[{k!r}]") for k, v in checked.items()}


def _check_input_type_to_index(value: object, argument: str) -> dict[str, int]:
    checked = _check_index_map(value, argument, str)
    for key, index in checked.items():
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            msg = f"{argument}[{key!r}] must be an argument index (int >= 0), got {index!r}"
            raise ConfigError(msg)
    return checked


def _check_dtype_configs(value: object, argument: str) -> list[DTypeConfig]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise wrong_type(value, argument, "a list of DTypeConfig")
    return [DTypeConfig.coerce(c, f"{argument}[{i}]") for i, c in enumerate(value)]


def _refuse_second_format(given: tuple[str, Pattern], held: tuple[str, Pattern | None]) -> None:
    """A config holds its pattern in one format: refuse setting ``given`` over ``held``."""
    if held[1] is not None:
        msg = (
            f"cannot set {given[0]} {patterns.pattern_str(given[1])}: this config already has "
            f"{held[0]} {patterns.pattern_str(held[1])}; "
            "only one of 'pattern' or 'pattern_complex_format' can be set"
        )
        raise ConfigError(msg)


class BackendPatternConfig(serialize.DictForm):
    """How a backend quantizes one pattern: observers, dtypes, fusion, module swaps.

    Set the pattern with :meth:`set_pattern` (simple format) or
    :meth:`_set_pattern_complex_format` (reversed nested tuples), never both.
    Every setter returns ``self`` for chaining and leaves the config unchanged when
    it raises. ``normalized_pattern`` is the complex form, the key a
    :class:`BackendConfig` stores the config under.

    Args:
        pattern: optional simple-format pattern, same as calling :meth:`set_pattern`.

    Example:
        >>> int8 = DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)
        >>> config = (BackendPatternConfig((torch.nn.Conv2d, torch.nn.ReLU))
        ...     .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
        ...     .add_dtype_config(int8))
        >>> patterns.pattern_str(config.normalized_pattern)
        '(ReLU, Conv2d)'
    """

    def __init__(self, pattern: Pattern | None = None) -> None:
        self.pattern: Pattern | None = None
        self.observation_type = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
        self.dtype_configs: list[DTypeConfig] = []
        self.root_module: type[torch.nn.Module] | None = None
        self.qat_module: type[torch.nn.Module] | None = None
        self.reference_quantized_module: type[torch.nn.Module] | None = None
        self.fused_module: type[torch.nn.Module] | None = None
        self.fuser_method: Callable[..., Any] | None = None
        self._root_node_getter: Callable[..., Any] | None = None
        self._extra_inputs_getter: Callable[..., Any] | None = None
        self._num_tensor_args_to_observation_type: dict[int, ObservationType] = {}
        self._input_type_to_index: dict[str, int] = {}
        self._pattern_complex_format: Pattern | None = None
        if pattern is not None:
            self.set_pattern(pattern)

    @property
    def normalized_pattern(self) -> Pattern:
        """The pattern in complex (reversed nested tuple) format; hashable.

        Raises:
            ConfigError: when no pattern was set.
        """
        if self._pattern_complex_format is not None:
            return patterns.validate_complex(self._pattern_complex_format)
        if self.pattern is not None:
            return patterns.simple_to_complex(self.pattern)
        msg = (
            "this BackendPatternConfig has no pattern; call set_pattern(...) "
            "(or _set_pattern_complex_format(...)) first"
        )
        raise ConfigError(msg)

    def set_pattern(self, pattern: Pattern) -> BackendPatternConfig:
        """Set the pattern in the simple format: an op, or a tuple of 2 or 3 ops in order.

        Raises:
            ConfigError: when a complex-format pattern is already set, or the tuple
                is not 2 or 3 flat ops.

        Example:
            >>> BackendPatternConfig().set_pattern((torch.nn.Linear, torch.nn.ReLU)).pattern[1]
            <class 'torch.nn.modules.activation.ReLU'>
        """
        _refuse_second_format(
            ("pattern", pattern), ("pattern_complex_format", self._pattern_complex_format)
        )
        return self._set("pattern", pattern)

    def _set_pattern_complex_format(self, pattern: Pattern) -> BackendPatternConfig:
        """Set the pattern in the reversed nested tuple format (see ``fxquant.config.pattern``).

        Example:
            >>> c = BackendPatternConfig()._set_pattern_complex_format(
            ...     (torch.nn.ReLU, (torch.nn.BatchNorm2d, torch.nn.Conv2d)))
            >>> c.pattern is None
            True
        """
        _refuse_second_format(("pattern_complex_format", pattern), ("pattern", self.pattern))
        return self._set("pattern_complex_format", pattern)

    def set_observation_type(self, observation_type: ObservationType) -> BackendPatternConfig:
        """Set where observers go (default: OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT).

        Example:
            >>> BackendPatternConfig("cat").set_observation_type(
            ...     ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT).observation_type.value
            1
        """
        return self._set("observation_type", observation_type)

    def add_dtype_config(self, dtype_config: DTypeConfig) -> BackendPatternConfig:
        """Add one supported set of dtypes.

        Example:
            >>> len(BackendPatternConfig("relu").add_dtype_config(DTypeConfig()).dtype_configs)
            1
        """
        checked = DTypeConfig.coerce(dtype_config, "dtype_config")
        self.dtype_configs.append(checked)
        return self

    def set_dtype_configs(self, dtype_configs: Iterable[DTypeConfig]) -> BackendPatternConfig:
        """Replace the supported dtype sets.

        Example:
            >>> BackendPatternConfig("relu").set_dtype_configs([DTypeConfig()]).dtype_configs
            [DTypeConfig(input_dtype_with_constraints=..., ...)]
        """
        return self._set("dtype_configs", dtype_configs)

    def set_root_module(self, root_module: type[torch.nn.Module] | None) -> BackendPatternConfig:
        """Set the module class the reference module replaces (e.g. Linear for LinearReLU).

        Example:
            >>> BackendPatternConfig("x").set_root_module(torch.nn.Linear).root_module.__name__
            'Linear'
        """
        return self._set("root_module", root_module)

    def set_qat_module(self, qat_module: type[torch.nn.Module] | None) -> BackendPatternConfig:
        """Set the QAT module class for this pattern.

        Example:
            >>> BackendPatternConfig("x").set_qat_module(None).qat_module is None
            True
        """
        return self._set("qat_module", qat_module)

    def set_reference_quantized_module(
        self, reference_quantized_module: type[torch.nn.Module] | None
    ) -> BackendPatternConfig:
        """Set the reference quantized module class that replaces the root module.

        Example:
            >>> BackendPatternConfig("x").set_reference_quantized_module(torch.nn.Linear
            ...     ).reference_quantized_module.__name__
            'Linear'
        """
        return self._set("reference_quantized_module_for_root", reference_quantized_module)

    def set_fused_module(self, fused_module: type[torch.nn.Module] | None) -> BackendPatternConfig:
        """Set the fused module class the fuser produces (e.g. ConvReLU2d).

        Example:
            >>> c = BackendPatternConfig("x").set_fused_module(torch.nn.Sequential)
            >>> c.fused_module.__name__
            'Sequential'
        """
        return self._set("fused_module", fused_module)

    def set_fuser_method(self, fuser_method: Callable[..., Any] | None) -> BackendPatternConfig:
        """Set the function ``f(is_qat, *modules) -> fused module`` for this pattern.

        With a simple-format pattern the modules come in execution order
        (``f(is_qat, conv, bn, relu)``); with a complex one, in pattern order.

        Example:
            >>> def fuse(is_qat, linear, relu):
            ...     return torch.nn.Sequential(linear, relu)
            >>> BackendPatternConfig((torch.nn.Linear, torch.nn.ReLU)).set_fuser_method(fuse
            ...     ).fuser_method is fuse
            True
        """
        return self._set("fuser_method", fuser_method)

    def _set_root_node_getter(
        self, root_node_getter: Callable[..., Any] | None
    ) -> BackendPatternConfig:
        """Set the function that picks the root node of a matched complex pattern."""
        return self._set("root_node_getter", root_node_getter)

    def _set_extra_inputs_getter(
        self, extra_inputs_getter: Callable[..., Any] | None
    ) -> BackendPatternConfig:
        """Set the function returning extra inputs appended to the fused module's args."""
        return self._set("extra_inputs_getter", extra_inputs_getter)

    def _set_num_tensor_args_to_observation_type(
        self, num_tensor_args_to_observation_type: Mapping[int, ObservationType]
    ) -> BackendPatternConfig:
        """Set the observation type per number of tensor arguments (e.g. add with 1 or 2)."""
        return self._set("num_tensor_args_to_observation_type", num_tensor_args_to_observation_type)

    def _set_input_type_to_index(
        self, input_type_to_index: Mapping[str, int]
    ) -> BackendPatternConfig:
        """Set which argument index holds each input kind, e.g. {"weight": 1, "bias": 2}."""
        return self._set("input_type_to_index", input_type_to_index)

    def _set(self, key: str, value: object) -> BackendPatternConfig:
        """Set the field of dict key ``key`` to ``value`` checked by its :data:`_FIELDS` check."""
        attribute, check, _, _ = _FIELDS[key]
        setattr(self, attribute, check(value, attribute.lstrip("_")))
        return self

    def copy(self) -> BackendPatternConfig:
        """A copy whose lists and dicts can be changed without touching this one.

        Example:
            >>> a = BackendPatternConfig("relu")
            >>> b = a.copy().add_dtype_config(DTypeConfig())
            >>> len(a.dtype_configs), len(b.dtype_configs)
            (0, 1)
        """
        # fields, not from_dict(to_dict()): this config is valid already, and the registry
        # copies every pattern at assembly and on each get_backend_config; the
        # DTypeConfigs in the list are frozen, so new lists and dicts make a full copy
        copied = object.__new__(type(self))
        fresh = {k: v.copy() if isinstance(v, (list, dict)) else v for k, v in vars(self).items()}
        copied.__dict__.update(fresh)
        return copied

    def to_dict(self) -> dict[str, Any]:
        """The dict form with torch.ao's keys; unset entries are left out.

        Example:
            >>> sorted(BackendPatternConfig(torch.nn.Linear).to_dict())
            ['dtype_configs', 'observation_type', 'pattern']
        """
        result: dict[str, Any] = {}
        for key, (attribute, *_) in _FIELDS.items():
            value = getattr(self, attribute)
            if key == "dtype_configs":
                value = [c.to_dict() for c in value]
            if value is not None and value != {}:
                result[key] = dict(value) if isinstance(value, dict) else value
        return result

    @classmethod
    def from_dict(cls, backend_pattern_config_dict: Mapping[str, Any]) -> BackendPatternConfig:
        """Build from the dict form (see :meth:`to_dict`); torch.ao's dicts are accepted.

        Raises:
            ConfigError: for an unknown key (the message lists the valid ones).

        Example:
            >>> BackendPatternConfig.from_dict({"pattern": torch.nn.Linear}).pattern.__name__
            'Linear'
        """
        data = _check_keys(backend_pattern_config_dict, _FROM_DICT_ORDER, cls.__name__)
        config = cls()
        for key in _FROM_DICT_ORDER:
            if key in data:  # through the setter: set_pattern refuses a second format
                _FIELDS[key][3](config, data[key])
        return config


class BackendConfig(serialize.DictForm):
    """The patterns a backend can quantize, one :class:`BackendPatternConfig` each.

    Configs are keyed by their ``normalized_pattern``: setting a config for a
    pattern that is already there replaces it and keeps its original position.

    Args:
        name: the backend's name (e.g. ``"x86"``).

    Example:
        >>> linear = BackendPatternConfig(torch.nn.Linear).add_dtype_config(
        ...     DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float))
        >>> backend = BackendConfig("my_backend").set_backend_pattern_config(linear)
        >>> [patterns.pattern_str(c.pattern) for c in backend.configs]
        ['Linear']
    """

    def __init__(self, name: str = "") -> None:
        self.name = check_str(name, "BackendConfig name")
        self._pattern_complex_format_to_config: dict[Pattern, BackendPatternConfig] = {}

    def set_name(self, name: str) -> BackendConfig:
        """Set the backend's name.

        Example:
            >>> BackendConfig().set_name("x86").name
            'x86'
        """
        self.name = check_str(name, "BackendConfig name")
        return self

    def set_backend_pattern_config(self, config: BackendPatternConfig) -> BackendConfig:
        """Add ``config``, replacing any config for the same (normalized) pattern.

        Raises:
            ConfigTypeError: when ``config`` is not a BackendPatternConfig.
            ConfigError: when ``config`` has no pattern.

        Example:
            >>> b = BackendConfig().set_backend_pattern_config(BackendPatternConfig("relu"))
            >>> len(b.configs)
            1
        """
        if not isinstance(config, BackendPatternConfig):
            raise wrong_type(config, "config", "a BackendPatternConfig")
        self._pattern_complex_format_to_config[config.normalized_pattern] = config
        return self

    def set_backend_pattern_configs(self, configs: Iterable[BackendPatternConfig]) -> BackendConfig:
        """Add several configs (see :meth:`set_backend_pattern_config`); all or nothing.

        Example:
            >>> b = BackendConfig().set_backend_pattern_configs(
            ...     [BackendPatternConfig("relu"), BackendPatternConfig("relu")])
            >>> len(b.configs)
            1
        """
        if isinstance(configs, (BackendPatternConfig, str, Mapping)) or not isinstance(
            configs, Iterable
        ):
            msg = f"configs must be a list of BackendPatternConfig, got {configs!r}"
            raise ConfigTypeError(msg)
        staged = BackendConfig(self.name)
        staged._pattern_complex_format_to_config = dict(self._pattern_complex_format_to_config)
        for config in configs:
            staged.set_backend_pattern_config(config)
        self._pattern_complex_format_to_config = staged._pattern_complex_format_to_config
        return self

    @property
    def configs(self) -> list[BackendPatternConfig]:
        """A copy of the list of configs, in order of first insertion."""
        return list(self._pattern_complex_format_to_config.values())

    @property
    def configs_by_pattern(self) -> dict[Pattern, BackendPatternConfig]:
        """A copy of the configs keyed by their normalized (complex-format) pattern."""
        return dict(self._pattern_complex_format_to_config)

    def to_dict(self) -> dict[str, Any]:
        """The dict form: ``{"name": ..., "configs": [pattern config dicts]}``.

        Example:
            >>> BackendConfig("b").to_dict()
            {'name': 'b', 'configs': []}
        """
        return {"name": self.name, "configs": [c.to_dict() for c in self.configs]}

    @classmethod
    def from_dict(cls, backend_config_dict: Mapping[str, Any]) -> BackendConfig:
        """Build from the dict form; configs may be dicts or BackendPatternConfigs.

        Raises:
            ConfigError: for an unknown key (the message lists the valid ones).

        Example:
            >>> BackendConfig.from_dict({"name": "b", "configs": [{"pattern": "relu"}]}).name
            'b'
        """
        data = _check_keys(backend_config_dict, ("name", "configs"), cls.__name__)
        backend = cls(data.get("name", ""))
        configs = data.get("configs", [])
        if not isinstance(configs, (list, tuple)):
            msg = f"BackendConfig 'configs' must be a list, got {configs!r}"
            raise ConfigTypeError(msg)
        for i, item in enumerate(configs):
            if isinstance(item, Mapping):
                item = BackendPatternConfig.from_dict(item)
            elif not isinstance(item, BackendPatternConfig):
                raise wrong_type(item, f"configs[{i}]", "a BackendPatternConfig or its dict form")
            backend.set_backend_pattern_config(item)
        return backend

    def to_json(self) -> str:
        """The JSON form: ops, modules and functions by qualified name (see ``serialize``).

        Raises:
            UnsafeNameError: for a value that cannot be named safely (a lambda, a
                function outside fxquant and its plugins).

        Example:
            >>> BackendConfig("b").to_json()
            '{"name": "b", "configs": []}'
        """
        return serialize.to_json(self.to_dict(), _BACKEND_CONFIG_JSON)

    @classmethod
    def from_json(cls, text: str) -> BackendConfig:
        """Build from :meth:`to_json`'s output, resolving names only in trusted modules.

        Raises:
            UnsafeNameError: for a name outside torch, operator, fxquant and its plugins.

        Example:
            >>> BackendConfig.from_json('{"name": "b", "configs": []}').name
            'b'
        """
        return cls.from_dict(serialize.from_json(text, "BackendConfig", _BACKEND_CONFIG_JSON))

    def __repr__(self) -> str:
        return f"BackendConfig(name={self.name!r}, configs={self.configs!r})"


# ---------------------------------------------------------------- the JSON form
# the codecs of the dict form's keys; config/serialize.py's to_json/from_json apply them
# (QConfigMapping's table is in config/qconfig_mapping.py)


def _encode_constrained(value: DTypeWithConstraints, path: str) -> dict[str, Any]:
    # DTypeConfig.to_dict writes input/output/weight as a DTypeWithConstraints, and only those
    # whose dtype is set: the dtype by name, then the bounds that are set
    items = ((f.name, getattr(value, f.name)) for f in fields(value))
    return {k: dtype_name(v) if k == "dtype" else v for k, v in items if v is not None}


def _decode_constrained(data: object, path: str) -> Any:
    if isinstance(data, str):
        return serialize.decode_dtype(data, path)
    if isinstance(data, Mapping):
        valid = [f.name for f in fields(DTypeWithConstraints)]
        unknown = set(data) - set(valid)
        if unknown:
            msg = f"{path}: unknown key(s) {sorted(unknown)}; valid keys: {', '.join(valid)}"
            raise ConfigError(msg)
        dtype = data.get("dtype")
        bounds = {k: v for k, v in data.items() if k != "dtype"}
        decoded = None if dtype is None else serialize.decode_dtype(dtype, f"{path}.dtype")
        return serialize.with_path(path, lambda b: DTypeWithConstraints(dtype=decoded, **b), bounds)
    msg = f"{path}: expected a dtype name or an object of dtype constraints, got {data!r}"
    raise ConfigError(msg)


def _observation_type_name(value: object, path: str) -> str:
    if isinstance(value, ObservationType):
        return value.name
    raise serialize.unsafe(path, value, "is not an ObservationType")


def _observation_type(data: object, path: str) -> ObservationType:
    if isinstance(data, str) and data in ObservationType.__members__:
        return ObservationType[data]
    choices = ", ".join(ObservationType.__members__)
    msg = f"{path}: expected one of {choices}, got {data!r}"
    raise ConfigError(msg)


def _encode_num_args(value: Mapping[int, ObservationType], path: str) -> dict[str, str]:
    return {str(k): _observation_type_name(v, f"{path}.{k}") for k, v in value.items()}


def _decode_num_args(data: object, path: str) -> dict[int, ObservationType]:
    if not isinstance(data, Mapping):
        msg = f"{path}: expected an object of argument count -> observation type, got {data!r}"
        raise ConfigError(msg)
    decoded = {}
    for key, value in data.items():
        if not (isinstance(key, str) and key.isdigit()):
            msg = f"{path}: keys must be argument counts like '2', got {key!r}"
            raise ConfigError(msg)
        decoded[int(key)] = _observation_type(value, f"{path}.{key}")
    return decoded


def _record_codec(codecs: serialize.Codecs, build: Callable[[Any], Any] | None) -> serialize.Codec:
    """A dict form inside the JSON; ``build`` makes its object on reading (errors get the path)."""

    def decode(data: object, path: str) -> Any:
        decoded = serialize.coded(data, path, codecs, 1)
        return decoded if build is None else serialize.with_path(path, build, decoded)

    return (lambda value, path: serialize.coded(value, path, codecs, 0), decode)


_DTYPE_CONFIG_JSON: Final[serialize.Codecs] = {
    **dict.fromkeys(_CONSTRAINED_KEYS, (_encode_constrained, _decode_constrained)),
    "bias_dtype": (lambda value, _: dtype_name(value), serialize.decode_dtype),
}
_MODULE: Final = (
    partial(check_module_class, optional=True),
    serialize.name_codec(serialize.MODULE_CLASS),
)
_GETTER: Final = (_check_callable, serialize.name_codec(serialize.GETTER))
_PATTERNS: Final = (serialize.encode_pattern, serialize.decode_pattern)
_OBSERVATION: Final = (_observation_type_name, _observation_type)
_DTYPE_CONFIGS: Final = serialize.list_codec(_record_codec(_DTYPE_CONFIG_JSON, None))

_B = BackendPatternConfig
# BackendPatternConfig's fields, in torch.ao's to_dict order: dict key -> (attribute, the
# setter's check, the JSON codec or None to pass the value through, the setter from_dict
# calls); a setter's argument is named as the attribute
_FIELDS: Final[
    dict[str, tuple[str, Callable[[Any, str], Any], serialize.Codec | None, Callable[..., _B]]]
] = {
    "observation_type": (
        "observation_type",
        _check_observation_type,
        _OBSERVATION,
        _B.set_observation_type,
    ),
    "dtype_configs": ("dtype_configs", _check_dtype_configs, _DTYPE_CONFIGS, _B.set_dtype_configs),
    "pattern": (
        "pattern",
        lambda value, _: patterns.validate_simple(value),
        _PATTERNS,
        _B.set_pattern,
    ),
    "root_module": ("root_module", *_MODULE, _B.set_root_module),
    "qat_module": ("qat_module", *_MODULE, _B.set_qat_module),
    "reference_quantized_module_for_root": (
        "reference_quantized_module",
        *_MODULE,
        _B.set_reference_quantized_module,
    ),
    "fused_module": ("fused_module", *_MODULE, _B.set_fused_module),
    "fuser_method": (
        "fuser_method",
        _check_callable,
        serialize.name_codec(serialize.FUSER),
        _B.set_fuser_method,
    ),
    "root_node_getter": ("_root_node_getter", *_GETTER, _B._set_root_node_getter),
    "extra_inputs_getter": ("_extra_inputs_getter", *_GETTER, _B._set_extra_inputs_getter),
    "num_tensor_args_to_observation_type": (
        "_num_tensor_args_to_observation_type",
        _check_observation_types,
        (_encode_num_args, _decode_num_args),
        _B._set_num_tensor_args_to_observation_type,
    ),
    "input_type_to_index": (
        "_input_type_to_index",
        _check_input_type_to_index,
        None,
        _B._set_input_type_to_index,
    ),
    "pattern_complex_format": (
        "_pattern_complex_format",
        lambda value, _: patterns.validate_complex(value),
        _PATTERNS,
        _B._set_pattern_complex_format,
    ),
}
# from_dict sets the pattern first, as torch.ao does: a bad pattern is the error reported
_FROM_DICT_ORDER: Final = sorted(_FIELDS, key=lambda key: not key.startswith("pattern"))
_BACKEND_CONFIG_JSON: Final[serialize.Codecs] = {
    "configs": serialize.list_codec(
        _record_codec(
            {key: codec for key, (_, _, codec, _) in _FIELDS.items() if codec},
            BackendPatternConfig.from_dict,
        )
    ),
}
