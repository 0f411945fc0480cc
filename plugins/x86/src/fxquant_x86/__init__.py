"""fxquant-x86: the ``x86`` backend for fxquant (see README.md).

``convert_fx`` gives the eager model on oneDNN's int8 kernels; :func:`deploy` compiles it
with inductor (the deployed-object protocol: call, ``report``, ``explain()``,
``save(path)``, ``CompiledModel.load(path)``)::

    from fxquant_x86 import CompiledModel, deploy

    compiled = deploy(fxquant.convert_fx(prepared), (x,))
    compiled(x)
    compiled.save("model.pt2")
    CompiledModel.load("model.pt2")(x)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["CompiledModel", "compile_quantized", "deploy"]

if TYPE_CHECKING:
    from fxquant_x86.compiled import CompiledModel, compile_quantized, deploy


def __getattr__(name: str) -> Any:
    # inductor is heavy to import: only when a model is deployed, not to list backends
    if name in __all__:
        from fxquant_x86 import compiled

        return getattr(compiled, name)
    msg = f"module 'fxquant_x86' has no attribute {name!r}"
    raise AttributeError(msg)
