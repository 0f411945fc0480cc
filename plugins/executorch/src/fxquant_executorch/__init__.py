"""fxquant-executorch: the ``executorch`` backend of fxquant (see README.md).

Quantize with the backend's patterns and default mapping, convert, then make
the ExecuTorch program::

    import fxquant
    from fxquant_executorch import to_executorch

    config = fxquant.get_backend_config("executorch")
    mapping = fxquant.get_default_qconfig_mapping("executorch")
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    prepared(x)                                  # calibrate
    program = to_executorch(fxquant.convert_fx(prepared), (x,))
    program.save("model.pte")                    # for the ExecuTorch runtime on device
    program(x)                                   # or run it here, in ExecuTorch's runtime
    program.explain()                            # what XNNPACK took, and why not the rest
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["ExecuTorchProgram", "ProgramInputError", "deploy", "to_executorch"]

if TYPE_CHECKING:
    from fxquant_executorch.program import (
        ExecuTorchProgram,
        ProgramInputError,
        deploy,
        to_executorch,
    )


def __getattr__(name: str) -> Any:
    # executorch is heavy to import: only when the program route is used, not to list backends
    if name in __all__:
        from fxquant_executorch import program

        return getattr(program, name)
    msg = f"module 'fxquant_executorch' has no attribute {name!r}"
    raise AttributeError(msg)
