"""fxquant: BackendConfig-driven FX graph mode quantization, one plugin per backend.

The names here are the public contract (../shared/CONTRACT.md); everything
else lives in submodules: ``fxquant.observer``, ``fxquant.fake_quantize``,
``fxquant.nn.intrinsic``, ``fxquant.nn.qat``, ``fxquant.nn.reference``.
The names a torch.ao script imports from ``torch.ao.quantization`` itself
(``default_dynamic_qconfig``, ``MinMaxObserver``, ``get_default_qconfig``...)
import from ``fxquant`` too, without being listed in ``__all__``.

Example:
    >>> import torch, fxquant
    >>> int8 = fxquant.DTypeConfig(input_dtype=torch.uint8, output_dtype=torch.uint8,
    ...                            weight_dtype=torch.int8, bias_dtype=torch.float)
    >>> linear = fxquant.BackendPatternConfig(torch.nn.Linear).add_dtype_config(int8)
    >>> fxquant.BackendConfig("my_backend").set_backend_pattern_config(linear).name
    'my_backend'
"""

from __future__ import annotations

from fxquant import moved as _moved
from fxquant.config import (
    BackendConfig,
    BackendPatternConfig,
    ConvertCustomConfig,
    DTypeConfig,
    DTypeWithConstraints,
    FuseCustomConfig,
    ObservationType,
    PrepareCustomConfig,
    QConfig,
    QConfigMapping,
)
from fxquant.errors import PluginConflictError, PluginError, QuantizationSkipped
from fxquant.flow import (
    convert_fx,
    convert_to_reference_fx,
    explain,
    fuse_fx,
    prepare_fx,
    prepare_qat_fx,
)
from fxquant.registry import (
    get_backend_config,
    get_default_qconfig_mapping,
    hookimpl,
    hookspec,
    list_backends,
    refresh,
    register_plugin,
    unregister_plugin,
)
from fxquant.torch_ao_names import top_level_names as _top_level_names
from fxquant.version import VERSION

__version__ = VERSION
# the installed optional parts that trace other libraries' models register their tracers with
# the flow (fxquant-transformers): no mechanism module imports them, so the facade does
_moved.import_tracers()

# importable from the top level without joining the contract's __all__: torch.ao.quantization's
# top-level names fxquant keeps in submodules (fxquant.torch_ao_names.top_level_names),
# the seed's default_equalization_qconfig, and the numerics package
_LAZY = {
    "default_equalization_qconfig": "fxquant.flow.equalization.observers",
    "numerics": "fxquant.numerics",
}


def __getattr__(name: str) -> object:
    """torch.ao.quantization's top-level names, from the submodule that has them (PEP 562)."""
    import importlib

    module = _LAZY.get(name) or _top_level_names().get(name)
    if module is None and f"fxquant.{name}" in {**_moved.MOVED, **_moved.CONTRACT_PATHS}:
        # ``import fxquant; fxquant.observer.MinMaxObserver`` worked while the package
        # imported its submodules itself, so the attribute still answers
        module = f"fxquant.{name}"
    if module is None:
        msg = f"module 'fxquant' has no attribute {name!r}"
        raise AttributeError(msg)
    loaded = importlib.import_module(module)
    value: object = loaded if module.endswith(f".{name}") else getattr(loaded, name)
    globals()[name] = value  # found once
    return value


def __dir__() -> list[str]:

    return sorted({*globals(), *_LAZY, *_top_level_names()})


__all__ = [
    "BackendConfig",
    "BackendPatternConfig",
    "ConvertCustomConfig",
    "DTypeConfig",
    "DTypeWithConstraints",
    "FuseCustomConfig",
    "ObservationType",
    "PluginConflictError",
    "PluginError",
    "PrepareCustomConfig",
    "QConfig",
    "QConfigMapping",
    "QuantizationSkipped",
    "convert_fx",
    "convert_to_reference_fx",
    "explain",
    "fuse_fx",
    "get_backend_config",
    "get_default_qconfig_mapping",
    "hookimpl",
    "hookspec",
    "list_backends",
    "prepare_fx",
    "prepare_qat_fx",
    "refresh",
    "register_plugin",
    "unregister_plugin",
]
