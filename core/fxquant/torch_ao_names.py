"""torch.ao objects recognised by name, so configs and models written for torch.ao keep working.

fxquant never imports ``torch.ao`` (PyTorch is removing it), yet users' configs
name its classes (the seed tutorial sets ``torch.ao.nn.intrinsic.ConvReLU2d`` as
a fused module) and their models may contain its fused modules. This module is
the one place that knows torch.ao's module names; nothing here imports torch.ao.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from fxquant.errors import torch_ao_hint

__all__ = [
    "as_fxquant_class",
    "is_torch_ao_match_all",
    "is_torch_ao_module_class",
    "top_level_names",
    "torch_ao_hint",
]

# The names a torch.ao script imports from `torch.ao.quantization` itself that fxquant keeps in
# a submodule: `from fxquant import default_dynamic_qconfig` works as the torch.ao import did,
# without these names joining the contract's `fxquant.__all__` (resolved lazily by
# `fxquant.__getattr__`). tests/docs/test_migration.py checks them against torch.ao.
# Modules whose whole `__all__` torch.ao has too, but for the names fxquant added:
_ALL_BUT = {
    "fxquant.fake_quantize": (),
    "fxquant.observer": ("BatchReducer", "PerTokenObserver", "is_calibrated"),
    "fxquant.config.defaults": ("bfloat16_static_qconfig",),
}
# Modules of which torch.ao has a few names only:
_ONLY = {
    "fxquant.config": ("QConfigAny", "QuantType"),
    "fxquant.registry": (
        "get_default_qat_qconfig",
        "get_default_qat_qconfig_mapping",
        "get_default_qconfig",
    ),
}


@functools.cache
def top_level_names() -> Mapping[str, str]:
    """torch.ao.quantization's top-level name -> the fxquant module that has it.

    Imports the modules it reads (by name: they sit above this one), so ``fxquant``
    calls it only when an attribute it lacks is asked for.

    Example:
        >>> top_level_names()["MinMaxObserver"]
        'fxquant.observer'
    """
    names = {name: module for module, kept in _ONLY.items() for name in kept}
    for module, added in _ALL_BUT.items():
        public = importlib.import_module(module).__all__
        names.update((name, module) for name in public if name not in added)
    return MappingProxyType(names)


# torch.ao module prefix -> the fxquant module with the class of the same name (longest first);
# fxquant's modules are named, not imported: they sit above this one (config.pattern imports it)
_AO_TO_FXQUANT = (
    ("torch.ao.nn.intrinsic.qat", "fxquant.nn.intrinsic.qat"),
    ("torch.ao.nn.intrinsic", "fxquant.nn.intrinsic"),
    ("torch.ao.nn.qat", "fxquant.nn.qat"),
    ("torch.ao.nn.quantized.reference", "fxquant.nn.reference"),
    ("torch.ao.quantization.utils", "fxquant.config.pattern"),  # MatchAllNode
)
_AO_NN = "torch.ao.nn."
_AO_MATCH_ALL = ("torch.ao.quantization.utils", "MatchAllNode")


def is_torch_ao_module_class(cls: type) -> bool:
    """True for a module class defined under ``torch.ao.nn`` (fused, QAT, reference...).

    Example:
        >>> import torch
        >>> is_torch_ao_module_class(torch.nn.Conv2d)
        False
    """
    return cls.__module__.startswith(_AO_NN)


def is_torch_ao_match_all(op: object) -> bool:
    """True for torch.ao's ``MatchAllNode`` sentinel (pattern configs may hold it).

    Example:
        >>> is_torch_ao_match_all(object)
        False
    """
    return isinstance(op, type) and (op.__module__, op.__name__) == _AO_MATCH_ALL


def as_fxquant_class(op: Any, extra_modules: Sequence[str] = ()) -> Any:
    """A torch.ao class (or a nested pattern of them) as the fxquant class of the same name.

    Args:
        op: an op, a torch.ao class, or a tuple pattern of them.
        extra_modules: modules to look in when fxquant has no class of that name
            (a plugin's own fused modules, e.g. ``"fxquant_onednn.patterns"``).

    Other ops (torch functions, ``nn`` modules, method names), and torch.ao classes
    that have no counterpart, are returned as they are.

    Example:
        >>> import torch
        >>> as_fxquant_class((torch.nn.ReLU, "relu"))
        (<class 'torch.nn.modules.activation.ReLU'>, 'relu')
    """
    if isinstance(op, tuple):
        return tuple(as_fxquant_class(part, extra_modules) for part in op)
    if not isinstance(op, type):
        return op
    for prefix, target in _AO_TO_FXQUANT:
        if op.__module__.startswith(prefix):
            for module in (target, *extra_modules):
                found = getattr(importlib.import_module(module), op.__name__, None)
                if isinstance(found, type):
                    return found
            break
    return op
