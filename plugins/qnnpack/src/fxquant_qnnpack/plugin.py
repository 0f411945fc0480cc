"""The fxquant hook implementations of the ``qnnpack`` backend: its data, on the qnnpack engine.

The hooks are :func:`fxquant_quantized_engine.engine_plugin`'s (the same code serves fbgemm);
what is qnnpack's own is in ``patterns.py`` and ``qconfig.py``.
"""

from __future__ import annotations

from fxquant_quantized_engine import engine_plugin

from fxquant_qnnpack.patterns import pattern_configs
from fxquant_qnnpack.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "qnnpack"

hooks = engine_plugin(
    BACKEND, pattern_configs=pattern_configs, default_qconfig_mapping=default_qconfig_mapping
)
fxquant_pattern_configs = hooks.fxquant_pattern_configs
fxquant_lowering_kernels = hooks.fxquant_lowering_kernels
fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping
