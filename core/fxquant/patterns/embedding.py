"""Embedding patterns: weight-only quantization of lookup tables.

An embedding's input is integer indices and its output is float rows, so
only the weight is quantized (dtype configs with float input/output and an
integer weight, e.g. ``weight_dtype=torch.quint8`` or ``torch.quint4x2``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.nn import qat, reference
from fxquant.patterns.builders import module_config, op_config

__all__ = ["embedding_configs"]


def embedding_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """Embedding and EmbeddingBag with their QAT modules, and ``F.embedding`` (5 configs).

    Example:
        >>> [c.pattern for c in embedding_configs([])][:2] == [nn.Embedding, qat.Embedding]
        True
    """
    configs: list[BackendPatternConfig] = []
    for float_module, qat_module, reference_module in (
        (nn.Embedding, qat.Embedding, reference.Embedding),
        (nn.EmbeddingBag, qat.EmbeddingBag, reference.EmbeddingBag),
    ):
        root = {"root": float_module, "reference": reference_module}
        configs.append(module_config(float_module, dtype_configs, qat=qat_module, **root))
        configs.append(module_config(qat_module, dtype_configs, **root))
    # F.embedding(input, weight, ...): the table is positional input 1
    return [*configs, op_config(F.embedding, dtype_configs, inputs={"weight": 1})]
