"""fxquant-tensorrt: the ``tensorrt`` backend of fxquant (see README.md).

Explicit (Q/DQ) int8 quantization as TensorRT consumes it: ``convert_fx`` gives the
reference model (it runs on CPU in PyTorch), :func:`export_onnx` writes it as an
ONNX model with real ``QuantizeLinear``/``DequantizeLinear`` nodes, and
:func:`check_placement` says which Q/DQ TensorRT could not fuse. The ONNX
toolchain (onnx, onnxscript, onnxruntime) is imported on first use only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["OnnxExport", "OnnxRuntimeModel", "check_placement", "deploy", "export_onnx"]

if TYPE_CHECKING:
    from fxquant_tensorrt.onnx_export import OnnxExport, export_onnx
    from fxquant_tensorrt.placement import check_placement
    from fxquant_tensorrt.runtime import OnnxRuntimeModel, deploy

_HOMES = {
    "OnnxExport": "fxquant_tensorrt.onnx_export",
    "export_onnx": "fxquant_tensorrt.onnx_export",
    "check_placement": "fxquant_tensorrt.placement",
    "OnnxRuntimeModel": "fxquant_tensorrt.runtime",
    "deploy": "fxquant_tensorrt.runtime",
}


def __getattr__(name: str) -> Any:
    # lazy: `fxquant backends` imports the plugin module, which must not pull in onnx
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    msg = f"module 'fxquant_tensorrt' has no attribute {name!r}"
    raise AttributeError(msg)
