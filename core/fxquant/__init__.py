"""fxquant: BackendConfig-driven FX graph mode quantization, one plugin per backend.

The names here are the public contract (../shared/CONTRACT.md); everything
else lives in submodules: ``fxquant.observer``, ``fxquant.fake_quantize``,
``fxquant.nn.intrinsic``, ``fxquant.nn.qat``, ``fxquant.nn.reference``.

Example:
    >>> import torch, fxquant
    >>> int8 = fxquant.DTypeConfig(input_dtype=torch.uint8, output_dtype=torch.uint8,
    ...                            weight_dtype=torch.int8, bias_dtype=torch.float)
    >>> linear = fxquant.BackendPatternConfig(torch.nn.Linear).add_dtype_config(int8)
    >>> fxquant.BackendConfig("my_backend").set_backend_pattern_config(linear).name
    'my_backend'
"""

from __future__ import annotations

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

__version__ = "0.1.0"

# importable from the top level without joining the contract's __all__ (#23): the seed
# exports default_equalization_qconfig from torch.ao.quantization, and fxquant.numerics is
# the numerics package
_LAZY = {
    "default_equalization_qconfig": "fxquant.numerics.equalization",
    "numerics": "fxquant.numerics",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module 'fxquant' has no attribute {name!r}"
        raise AttributeError(msg)
    import importlib

    loaded = importlib.import_module(module)
    return loaded if module.endswith(name) else getattr(loaded, name)


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
