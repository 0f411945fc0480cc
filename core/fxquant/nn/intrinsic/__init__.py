"""Fused float modules: a chain of float modules kept together as one unit.

Fusion replaces a matched chain (``Conv2d -> ReLU``) with one container
(``ConvReLU2d``) so the rest of the flow sees a single node: one observer on
its output, one QAT module, one reference module. The containers are plain
``nn.Sequential`` subclasses, so their numerics are exactly those of the
modules inside; the constructor only checks the parts have the right types.

    before: x -> Conv2d -> ReLU -> y        after: x -> ConvReLU2d[Conv2d, ReLU] -> y

``ConvAdd2d`` and ``ConvAddReLU2d`` take a second tensor that is added to the
convolution's output (the oneDNN ``conv + add`` fusion).

The QAT versions live in ``fxquant.nn.intrinsic.qat``, loaded on first access
(``import fxquant.nn.intrinsic`` then ``fxquant.nn.intrinsic.qat`` works, as
``fxquant.nn.qat`` does after ``import fxquant.nn``); an eager import would be
circular, since the QAT modules build on these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn
from torch.nn.utils.parametrize import type_before_parametrizations

from fxquant.errors import ConfigTypeError
from fxquant.nn import lazy_submodules

__all__ = [
    "BNReLU2d",
    "BNReLU3d",
    "ConvAdd2d",
    "ConvAddReLU2d",
    "ConvBn1d",
    "ConvBn2d",
    "ConvBn3d",
    "ConvBnReLU1d",
    "ConvBnReLU2d",
    "ConvBnReLU3d",
    "ConvReLU1d",
    "ConvReLU2d",
    "ConvReLU3d",
    "FusedModule",
    "LinearBn1d",
    "LinearReLU",
    "check_module_type",
    "qat",
    "relu_module",
    "type_label",
]

AddFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


# the submodule imports this package, so it cannot be imported eagerly here
__getattr__ = lazy_submodules(__name__, ["qat"])


def type_label(cls: type) -> str:
    """``torch.nn.Conv2d`` rather than ``torch.nn.modules.conv.Conv2d``, for messages.

    Example:
        >>> type_label(nn.Conv2d)
        'torch.nn.Conv2d'
    """
    if getattr(nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def check_module_type(owner: str, arg: str, value: object, expected: type[nn.Module]) -> None:
    """Raise ``ConfigTypeError`` unless ``value`` is exactly an ``expected`` module.

    The check is exact (subclasses are refused) because a subclass such as a
    QAT ``Conv2d`` has different numerics from the float module it extends.
    Parametrized modules are judged by their original type.

    Example:
        >>> check_module_type("ConvReLU2d", "relu", nn.ReLU(), nn.ReLU)
    """
    actual = type_before_parametrizations(value) if isinstance(value, nn.Module) else type(value)
    if actual is not expected:
        msg = (
            f"{owner} argument {arg!r} must be a {type_label(expected)}, got {value!r} of type "
            f"{type_label(actual)}; pass the module that matches the fused pattern"
        )
        raise ConfigTypeError(msg)


_RELU_FUNCTIONS: tuple[object, ...] = (torch.relu, torch.nn.functional.relu)


def relu_module(owner: str, relu: object) -> nn.ReLU:
    """``relu`` as an ``nn.ReLU`` module: patterns may match ``F.relu`` where a module is kept.

    Raises:
        ConfigTypeError: ``relu`` is neither an ``nn.ReLU`` nor ``F.relu``/``torch.relu``.

    Example:
        >>> relu_module("ConvAddReLU2d", torch.nn.functional.relu)
        ReLU()
    """
    if any(relu is fn for fn in _RELU_FUNCTIONS):
        return nn.ReLU()
    check_module_type(owner, "relu", relu, nn.ReLU)
    return relu  # type: ignore[return-value]  # checked just above


class FusedModule(nn.Sequential):
    """Base of every fused float module; the flow treats instances as one leaf node.

    Subclasses list their parts in ``PARTS`` as ``(argument name, module type)``; the
    constructor takes them by position or by that name, and checks each one's type.

    Example:
        >>> m = ConvReLU2d(nn.Conv2d(1, 2, 3), nn.ReLU())
        >>> isinstance(m, FusedModule), len(m)
        (True, 2)
        >>> ConvBnReLU2d(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), relu=nn.ReLU())(
        ...     torch.randn(2, 2, 8, 8)
        ... ).shape
        torch.Size([2, 4, 6, 6])
    """

    PARTS: ClassVar[tuple[tuple[str, type[nn.Module]], ...]] = ()

    def __init__(self, *modules: nn.Module, **named: nn.Module) -> None:
        names = [arg for arg, _ in self.PARTS]
        given = dict(zip(names, modules, strict=False)) | named
        if len(modules) > len(names) or sorted(given) != sorted(names):
            msg = (
                f"{type(self).__name__} takes its parts {', '.join(names)} (by position or "
                f"name), got {len(modules)} by position and {sorted(named)} by name"
            )
            raise TypeError(msg)
        for arg, expected in self.PARTS:
            check_module_type(type(self).__name__, arg, given[arg], expected)
        super().__init__(*(given[arg] for arg in names))


# torch.ao spells the base with an underscore; keep that name working for ported code.
_FusedModule = FusedModule


_RELU = ("relu", nn.ReLU)


class ConvReLU1d(FusedModule):
    """``Conv1d`` then ``ReLU``, fused into one node."""

    PARTS = (("conv", nn.Conv1d), _RELU)


class ConvReLU2d(FusedModule):
    """``Conv2d`` then ``ReLU``, fused into one node."""

    PARTS = (("conv", nn.Conv2d), _RELU)


class ConvReLU3d(FusedModule):
    """``Conv3d`` then ``ReLU``, fused into one node."""

    PARTS = (("conv", nn.Conv3d), _RELU)


# kept apart for QAT (fxquant.nn.intrinsic.qat folds BN into the weight as it trains)
class ConvBn1d(FusedModule):
    """``Conv1d`` then ``BatchNorm1d``, fused into one node."""

    PARTS = (("conv", nn.Conv1d), ("bn", nn.BatchNorm1d))


class ConvBn2d(FusedModule):
    """``Conv2d`` then ``BatchNorm2d``, fused into one node."""

    PARTS = (("conv", nn.Conv2d), ("bn", nn.BatchNorm2d))


class ConvBn3d(FusedModule):
    """``Conv3d`` then ``BatchNorm3d``, fused into one node."""

    PARTS = (("conv", nn.Conv3d), ("bn", nn.BatchNorm3d))


class ConvBnReLU1d(FusedModule):
    """``Conv1d`` then ``BatchNorm1d`` then ``ReLU``, fused into one node."""

    PARTS = (("conv", nn.Conv1d), ("bn", nn.BatchNorm1d), _RELU)


class ConvBnReLU2d(FusedModule):
    """``Conv2d`` then ``BatchNorm2d`` then ``ReLU``, fused into one node."""

    PARTS = (("conv", nn.Conv2d), ("bn", nn.BatchNorm2d), _RELU)


class ConvBnReLU3d(FusedModule):
    """``Conv3d`` then ``BatchNorm3d`` then ``ReLU``, fused into one node."""

    PARTS = (("conv", nn.Conv3d), ("bn", nn.BatchNorm3d), _RELU)


class LinearReLU(FusedModule):
    """``Linear`` then ``ReLU``, fused into one node."""

    PARTS = (("linear", nn.Linear), _RELU)


class LinearBn1d(FusedModule):
    """``Linear`` then ``BatchNorm1d``, fused into one node."""

    PARTS = (("linear", nn.Linear), ("bn", nn.BatchNorm1d))


class BNReLU2d(FusedModule):
    """``BatchNorm2d`` then ``ReLU``, fused into one node."""

    PARTS = (("batch_norm", nn.BatchNorm2d), _RELU)


class BNReLU3d(FusedModule):
    """``BatchNorm3d`` then ``ReLU``, fused into one node."""

    PARTS = (("batch_norm", nn.BatchNorm3d), _RELU)


def _check_add(owner: str, add: object) -> None:
    if isinstance(add, nn.Module) or not callable(add):
        msg = (
            f"{owner} argument 'add' must be an add function such as torch.add or "
            f"operator.add, got {add!r}"
        )
        raise ConfigTypeError(msg)


class _ConvAdd(FusedModule):
    """``add(conv(x1), x2)``, then ``self.relu`` where the subclass has one."""

    PARTS = (("conv", nn.Conv2d),)

    def __init__(self, conv: nn.Conv2d, add: AddFn) -> None:
        _check_add(type(self).__name__, add)
        super().__init__(conv)
        self.add = add

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]  # two inputs, unlike Sequential
        """Convolve ``x1`` and add ``x2`` (then apply ReLU, for ``ConvAddReLU2d``)."""
        out: torch.Tensor = self.add(self[0](x1), x2)
        relu = getattr(self, "relu", None)
        return out if relu is None else relu(out)


class ConvAdd2d(_ConvAdd):
    """``Conv2d`` whose output is added to a second input: ``add(conv(x1), x2)``.

    Args:
        conv: the convolution, stored as ``self[0]``.
        add: the add function of the matched pattern (``torch.add``, ``operator.add``).

    Example:
        >>> m = ConvAdd2d(nn.Conv2d(2, 2, 1), torch.add)
        >>> x = torch.randn(1, 2, 4, 4)
        >>> torch.equal(m(x, x), m[0](x) + x)
        True
    """


class ConvAddReLU2d(_ConvAdd):
    """``relu(add(conv(x1), x2))``: ``ConvAdd2d`` followed by a ``ReLU``.

    Args:
        conv: the convolution, stored as ``self[0]``.
        add: the add function of the matched pattern.
        relu: the ``nn.ReLU`` module (or ``F.relu``, replaced by one), stored as ``self.relu``.

    Example:
        >>> m = ConvAddReLU2d(nn.Conv2d(2, 2, 1), torch.add, nn.ReLU())
        >>> x = torch.randn(1, 2, 4, 4)
        >>> torch.equal(m(x, x), torch.relu(m[0](x) + x))
        True
    """

    def __init__(self, conv: nn.Conv2d, add: AddFn, relu: nn.ReLU) -> None:
        # arguments are checked in order (add, relu, then conv): a user sees the first wrong one
        _check_add(type(self).__name__, add)
        relu = relu_module(type(self).__name__, relu)
        super().__init__(conv, add)
        self.relu = relu
