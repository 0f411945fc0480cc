"""The fxquant hook implementations of the ``tensorrt`` backend (hooks only).

No ``fxquant_lowering_kernels``: TensorRT is not called from PyTorch, so
``convert_fx`` returns the reference model, which runs on CPU.
:func:`fxquant_deployment` exports it as a Q/DQ ONNX model and runs it in
onnxruntime (the ONNX toolchain is imported only when a model is deployed).
"""

from __future__ import annotations

from typing import Any

import fxquant.registry
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.registry import Deployment, GraphMode
from torch import fx

from fxquant_tensorrt.graph_mode import graph_mode
from fxquant_tensorrt.patterns import pattern_configs
from fxquant_tensorrt.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "tensorrt"
RUNTIME = "onnxruntime CPU (ONNX Q/DQ for TensorRT)"


def _deploy(model: Any, example_inputs: tuple[Any, ...]) -> Any:
    from fxquant_tensorrt.runtime import deploy  # onnx, onnxruntime: only when deploying

    return deploy(model, example_inputs)


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    """The patterns TensorRT runs in int8, with its explicit-quantization constraints."""
    return pattern_configs()


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    """int8 symmetric activations, int8 symmetric per-channel weights, float norms/softmax."""
    return default_qconfig_mapping(is_qat)


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_graph_mode(
    backend: str, model: fx.GraphModule, qconfig_mapping: QConfigMapping, is_qat: bool
) -> GraphMode | None:
    """A transformer (Linear -> residual add -> LayerNorm) gets the ``transformer`` mode."""
    del qconfig_mapping  # the flow merges the mode under the user's entries (the hookspec)
    return graph_mode(model, is_qat)


@fxquant.registry.hookimpl
@fxquant.registry.only_for(BACKEND)
def fxquant_deployment(backend: str) -> Deployment | None:
    """The exported ONNX model in onnxruntime, with the TensorRT placement check as its report."""
    return Deployment(RUNTIME, deploy=_deploy)
