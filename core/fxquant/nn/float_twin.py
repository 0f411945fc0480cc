"""The float class a QAT or reference class twins, and rebuilding its configuration.

A QAT or reference class (``fxquant.nn.qat.Linear``, ``fxquant.nn.reference.Conv2d``)
converts from and back to one public ``torch.nn`` class: :class:`FloatTwin` finds that
class among its bases, and :func:`init_arguments` reads a module's constructor
arguments off its attributes so ``from_float`` / ``to_float`` rebuild it with every setting;
:func:`rebuilt` makes a reference module that way, its tensors copied from the float module.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Any, ClassVar

import torch
from torch import nn

__all__ = ["FloatTwin", "init_arguments", "rebuilt"]

# Set while rebuilt() builds a module whose parameters it then copies from the float module:
# the reference modules skip their random init, which would be thrown away (half of convert's
# time); see fxquant.nn.reference.ReferenceQuantizedModule.reset_parameters.
COPYING_PARAMS: ContextVar[bool] = ContextVar("fxquant_reference_copying_params", default=False)


class FloatTwin:
    """Mixin of the QAT and reference classes: ``_float_class`` is the public ``torch.nn``
    class among the class's direct bases, the float class it rebuilds and copies from.

    A concrete class names it by mixing it in (``class Linear(_Reference, nn.Linear)``);
    a family's base (``_QATConv``) or a user's subclass of a concrete class mixes none
    in, and keeps what it inherits. (A family base deriving from a public torch base, as
    the recurrent ``_Sequence`` from ``nn.RNNBase``, names that one; its concrete classes
    name their own.)

    Example:
        >>> from fxquant.nn.reference import Linear
        >>> Linear._float_class
        <class 'torch.nn.modules.linear.Linear'>
    """

    _float_class: ClassVar[type[nn.Module]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__bases__:
            public = not base.__name__.startswith("_") and base is not nn.Module
            if public and base.__module__.startswith("torch.nn.modules."):
                cls._float_class = base
                return


def init_arguments(module: nn.Module, float_class: type[nn.Module]) -> dict[str, Any]:
    """The keyword arguments that rebuild ``module``'s configuration as a ``float_class``.

    Each of the constructor's parameters is read off ``module``'s attribute of
    the same name (torch.nn keeps them all) and passed where it differs from the
    default; a ``bias`` tensor becomes ``True``/``False``. Parameters with no
    attribute (``device``, ``dtype``, ``Embedding``'s ``_weight``) are left out.

    Example:
        >>> init_arguments(nn.Linear(2, 3, bias=False), nn.Linear)
        {'in_features': 2, 'out_features': 3, 'bias': False}
        >>> init_arguments(nn.GRU(2, 3, batch_first=True), nn.GRU)
        {'input_size': 2, 'hidden_size': 3, 'batch_first': True}
    """
    # nn.LSTM / nn.GRU take RNNBase's parameters after ``mode``, which they pass themselves
    recurrent = issubclass(float_class, nn.RNNBase)
    init = nn.RNNBase.__init__ if recurrent else float_class.__init__
    arguments: dict[str, Any] = {}
    for param in list(inspect.signature(init).parameters.values())[2 if recurrent else 1 :]:
        if param.name in ("device", "dtype") or not hasattr(module, param.name):
            continue
        value = getattr(module, param.name)
        if param.name == "bias" and not isinstance(value, bool):
            value = value is not None
        if value != param.default:
            arguments[param.name] = value
    return arguments


def rebuilt(cls: Any, mod: nn.Module, names: Iterable[str], **kwargs: Any) -> Any:
    """A ``cls`` (a :class:`FloatTwin`) with ``mod``'s configuration and ``kwargs``, on the
    device and dtype of ``mod``'s first tensor of ``names``, its tensors ``names`` copied.

    Each of ``mod``'s attributes ``names`` that is a tensor becomes a new Parameter (a copy)
    of the same name; ``cls`` skips its random init meanwhile where it reads ``COPYING_PARAMS``.

    Example:
        >>> from fxquant.nn.reference import Linear
        >>> linear = nn.Linear(2, 3, bias=False)
        >>> ref = rebuilt(Linear, linear, ["weight", "bias"], weight_qparams=None)
        >>> torch.equal(ref.weight, linear.weight), ref.weight is linear.weight, ref.bias
        (True, False, None)
    """
    tensors = {name: getattr(mod, name, None) for name in names}
    like = next(t for t in tensors.values() if isinstance(t, torch.Tensor))
    token = COPYING_PARAMS.set(True)
    try:
        twin = cls(
            **init_arguments(mod, cls._float_class), device=like.device, dtype=like.dtype, **kwargs
        )
    finally:
        COPYING_PARAMS.reset(token)
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor):
            setattr(twin, name, nn.Parameter(value.detach().clone()))
    return twin
