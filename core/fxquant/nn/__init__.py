"""fxquant's modules: fused float (``intrinsic``), QAT (``qat``, ``intrinsic.qat``), reference.

    fxquant.nn.intrinsic      ConvReLU2d, ConvBn2d, LinearReLU, ...   fused float containers
    fxquant.nn.intrinsic.qat  QAT versions of the fused modules (BN folded while training)
    fxquant.nn.qat            Linear, Conv1d/2d/3d, Embedding, EmbeddingBag with weight fake-quant
    fxquant.nn.reference      float ops on quantize->dequantized weights (what convert emits)
    fxquant.nn.recurrent      reference dynamic int8 LSTM / GRU / cells (also named in reference)
    fxquant.nn.fusers         fuser methods ``(is_qat, *modules)`` and BN folding

The submodules load on first access, so ``import fxquant.nn`` stays cheap and
``fxquant.nn.qat`` works without an explicit import.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, ClassVar

from torch import nn

__all__ = ["fusers", "intrinsic", "is_leaf_module", "qat", "recurrent", "reference"]

_SUBMODULES = frozenset({"fusers", "intrinsic", "qat", "recurrent", "reference"})


def lazy_submodules(package: str, names: Iterable[str]) -> Callable[[str], ModuleType]:
    """A module ``__getattr__`` (PEP 562) for ``package`` importing its submodules ``names``
    on first access: for the packages of this folder, whose submodules import them back.

    Example:
        >>> lazy_submodules("fxquant.nn", ["qat"])("qat").__name__
        'fxquant.nn.qat'
    """
    known = frozenset(names)

    def load(name: str) -> ModuleType:
        if name in known:
            return importlib.import_module(f"{package}.{name}")
        msg = f"module {package!r} has no attribute {name!r}"
        raise AttributeError(msg)

    return load


__getattr__ = lazy_submodules(__name__, _SUBMODULES)


def is_leaf_module(module: nn.Module) -> bool:
    """True for fxquant's own modules, which FX tracing must keep as single nodes.

    torch.fx only keeps modules defined under ``torch.nn`` as leaves; fused,
    QAT and reference modules live here and must not be traced through, or
    the flow would see their insides (a fused ``ConvReLU2d`` as conv + relu).

    Example:
        >>> from fxquant.nn.intrinsic import LinearReLU
        >>> is_leaf_module(LinearReLU(nn.Linear(2, 2), nn.ReLU()))
        True
        >>> is_leaf_module(nn.Sequential())
        False
    """
    return type(module).__module__.startswith(f"{__name__}.")


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
