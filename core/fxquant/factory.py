"""``with_args``: a constructor with some arguments bound, that can be compared and serialized.

torch.ao uses ``functools.partial`` for this, which hides the class and
arguments behind private attributes and compares by identity. fxquant's
:class:`ModuleFactory` keeps them as data, so two QConfigs built the same
way compare equal (fused patterns require their nodes to share a qconfig) and
the JSON form can name the class and its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fxquant.dtypes import dtypes_match
from fxquant.errors import ConfigTypeError

__all__ = ["ModuleFactory", "factory_parts"]


@dataclass(frozen=True, eq=False)
class ModuleFactory:
    """A module class with bound keyword arguments; calling it builds the module.

    Example:
        >>> from fxquant.observer import MinMaxObserver
        >>> make = MinMaxObserver.with_args(quant_min=0, quant_max=127)
        >>> make().quant_max
        127
        >>> make.with_args(quant_max=255)().quant_max
        255
    """

    cls: Callable[..., torch.nn.Module]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not callable(self.cls):
            msg = f"ModuleFactory cls must be callable, got {self.cls!r}"
            raise ConfigTypeError(msg)
        # copy so a caller mutating its dict cannot change a frozen factory
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    def __call__(self, **overrides: Any) -> torch.nn.Module:
        return self.cls(**{**self.kwargs, **overrides})

    def with_args(self, **kwargs: Any) -> ModuleFactory:
        """A new factory with ``kwargs`` added to (and overriding) the bound ones."""
        return ModuleFactory(self.cls, {**self.kwargs, **kwargs})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModuleFactory):
            return NotImplemented
        return self.cls is other.cls and _kwargs_equal(self.kwargs, other.kwargs)

    def __hash__(self) -> int:
        return hash((self.cls, tuple(sorted(self.kwargs))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        name = getattr(self.cls, "__qualname__", repr(self.cls))
        return f"{name}.with_args({args})"


def _kwargs_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a.keys() == b.keys() and all(_values_equal(value, b[key]) for key, value in a.items())


def _values_equal(left: object, right: object) -> bool:
    # == on tensors is elementwise: torch.equal is same shape and same values
    if isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor):
        return bool(torch.equal(left, right))
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        return False
    if isinstance(left, torch.dtype) and isinstance(right, torch.dtype):
        return dtypes_match(left, right)  # quint8 and uint8 are one dtype to fxquant
    return bool(left == right)


def factory_parts(ctor: object) -> tuple[type, dict[str, Any]]:
    """Split a QConfig entry (a class or a :class:`ModuleFactory`) into class and kwargs."""
    if isinstance(ctor, ModuleFactory):
        return ctor.cls, dict(ctor.kwargs)  # type: ignore[return-value]  # cls is a class in practice
    if isinstance(ctor, type):
        return ctor, {}
    msg = f"expected a module class or a .with_args(...) factory, got {ctor!r}"
    raise ConfigTypeError(msg)
