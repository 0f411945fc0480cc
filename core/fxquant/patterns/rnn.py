"""Recurrent modules: LSTM, GRU and their cells, for dynamic quantization.

Dynamic quantization computes the activation qparams at run time, so these
patterns are meant for dynamic dtype configs (``is_dynamic=True``, float
output) or fp16 weights. Where ``fxquant.nn.reference`` provides a reference
module for one of them, convert swaps it in; otherwise the module stays float.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.nn import reference
from fxquant.patterns.builders import module_config

__all__ = ["RNN_MODULES", "rnn_configs"]

RNN_MODULES: tuple[type[nn.Module], ...] = (
    nn.GRUCell,
    nn.LSTMCell,
    nn.RNNCell,
    nn.LSTM,
    nn.GRU,
)
"""The recurrent modules :func:`rnn_configs` covers."""


def rnn_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """One config per module in :data:`RNN_MODULES` (5 configs).

    Example:
        >>> [c.pattern for c in rnn_configs([])][3] is nn.LSTM
        True
    """
    return [
        module_config(
            module,
            dtype_configs,
            root=module,
            # same class name in fxquant.nn.reference when it has one
            reference=getattr(reference, module.__name__, None),
        )
        for module in RNN_MODULES
    ]
