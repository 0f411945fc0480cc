"""The fxquant hook implementations of the ``fbgemm`` backend: its data, on the fbgemm engine.

The hooks are :func:`fxquant_quantized_engine.engine_plugin`'s (the same code serves qnnpack);
what is fbgemm's own is in ``patterns.py`` and ``qconfig.py``.
"""

from __future__ import annotations

from fxquant_quantized_engine import engine_plugin

from fxquant_fbgemm.patterns import pattern_configs
from fxquant_fbgemm.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1

BACKEND = "fbgemm"

hooks = engine_plugin(
    BACKEND, pattern_configs=pattern_configs, default_qconfig_mapping=default_qconfig_mapping
)
fxquant_pattern_configs = hooks.fxquant_pattern_configs
fxquant_lowering_kernels = hooks.fxquant_lowering_kernels
fxquant_default_qconfig_mapping = hooks.fxquant_default_qconfig_mapping
