"""Recurrent modules: LSTM, GRU and their cells, for dynamic quantization.

Dynamic quantization computes the activation qparams at run time, so these
patterns are meant for dynamic dtype configs (``is_dynamic=True``, float
output) or fp16 weights. Under a dynamic int8 qconfig convert swaps in the
reference module of ``fxquant.nn.recurrent`` (one set of qparams per weight, the
activation range of the qconfig); fp16 weights and ``proj_size`` stay float.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.nn import recurrent
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
            # the reference module has the float module's class name (fxquant.nn.recurrent)
            reference=getattr(recurrent, module.__name__),
        )
        for module in RNN_MODULES
    ]
