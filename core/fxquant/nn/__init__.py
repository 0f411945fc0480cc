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
from collections.abc import Callable, Iterable
from types import ModuleType

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
