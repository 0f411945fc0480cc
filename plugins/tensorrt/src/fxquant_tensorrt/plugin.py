"""The fxquant hook implementations of the ``tensorrt`` backend (hooks only).

No ``fxquant_lowering_kernels``: TensorRT is not called from PyTorch, so
``convert_fx`` returns the reference model, which runs on CPU.
:func:`fxquant_deployment` exports it as a Q/DQ ONNX model and runs it in
onnxruntime (the ONNX toolchain is imported only when a model is deployed).
"""

from __future__ import annotations

from typing import Any

from fxquant.registry import Deployment
from fxquant.registry.backend_hooks import backend_hooks

from fxquant_tensorrt.graph_mode import graph_mode
from fxquant_tensorrt.patterns import pattern_configs
from fxquant_tensorrt.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "tensorrt"
RUNTIME = "onnxruntime CPU (ONNX Q/DQ for TensorRT)"


def _deploy(model: Any, example_inputs: tuple[Any, ...]) -> Any:
    from fxquant_tensorrt.runtime import deploy  # onnx, onnxruntime: only when deploying

    return deploy(model, example_inputs)


def _deployment() -> Deployment:
    """The exported ONNX model in onnxruntime, with the TensorRT placement check as its report."""
    return Deployment(RUNTIME, deploy=_deploy)


# the patterns TensorRT runs in int8, with its explicit-quantization constraints; int8
# symmetric activations and per-channel weights, norms and softmax float; a transformer
# (Linear -> residual add -> LayerNorm) gets the ``transformer`` mode
hooks = backend_hooks(
    BACKEND,
    pattern_configs=pattern_configs,
    default_qconfig_mapping=default_qconfig_mapping,
    deployment=_deployment,
    graph_mode=graph_mode,
)
fxquant_pattern_configs = hooks.fxquant_pattern_configs
fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping
fxquant_graph_mode = hooks.fxquant_graph_mode
fxquant_deployment = hooks.fxquant_deployment
