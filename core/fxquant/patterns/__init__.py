"""The generic pattern configs every backend starts from.

Each builder takes the backend's dtype configs and returns a list of
:class:`~fxquant.BackendPatternConfig`; a plugin assembles its backend by
calling the builders it needs with its own dtype configs, instead of copying
pattern tables::

    from fxquant.patterns import conv_configs, linear_configs
    configs = conv_configs([my_int8]) + linear_configs([my_int8, my_dynamic])

The lists are built on each call (nothing is built at import); the registry
caches the backend it assembles. The built-in ``reference`` backend is
:func:`reference_pattern_configs` with :func:`reference_default_qconfig_mapping`.

    module            builders
    conv              conv_configs, conv_transpose_configs
    linear            linear_configs
    binary            binary_op_configs, matmul_configs
    fixed_qparams     fixed_qparams_op_configs, with_fixed_qparams
    share_qparams     share_qparams_op_configs
    norm              bn_configs, ln_configs
    misc              default_op_configs, cat_configs, tensor_info_op_configs
    embedding         embedding_configs
    rnn               rnn_configs
    conv_add          conv_add_configs (oneDNN conv + add fusions)
    getters           root-node / extra-input getters of the complex patterns
    reference         the reference backend's dtype configs and patterns
    qconfigs          reference_default_qconfig_mapping
"""

from __future__ import annotations

from fxquant.patterns.binary import (
    binary_op_configs,
    default_num_tensor_args_to_observation_type,
    matmul_configs,
)
from fxquant.patterns.conv import conv_configs, conv_transpose_configs
from fxquant.patterns.conv_add import conv_add_configs
from fxquant.patterns.embedding import embedding_configs
from fxquant.patterns.fixed_qparams import (
    RANGE_0_TO_1,
    RANGE_NEG1_TO_1,
    FixedQParams,
    fixed_qparams_op_configs,
    fixed_qparams_ops,
    with_fixed_qparams,
)
from fxquant.patterns.generic import reference_pattern_configs
from fxquant.patterns.linear import linear_configs
from fxquant.patterns.misc import (
    cat_configs,
    default_op_configs,
    tensor_info_op_configs,
)
from fxquant.patterns.norm import bn_configs, ln_configs
from fxquant.patterns.qconfigs import reference_default_qconfig_mapping
from fxquant.patterns.rnn import rnn_configs
from fxquant.patterns.share_qparams import share_qparams_op_configs

__all__ = [
    "RANGE_0_TO_1",
    "RANGE_NEG1_TO_1",
    "FixedQParams",
    "binary_op_configs",
    "bn_configs",
    "cat_configs",
    "conv_add_configs",
    "conv_configs",
    "conv_transpose_configs",
    "default_num_tensor_args_to_observation_type",
    "default_op_configs",
    "embedding_configs",
    "fixed_qparams_op_configs",
    "fixed_qparams_ops",
    "linear_configs",
    "ln_configs",
    "matmul_configs",
    "reference_default_qconfig_mapping",
    "reference_pattern_configs",
    "rnn_configs",
    "share_qparams_op_configs",
    "tensor_info_op_configs",
    "with_fixed_qparams",
]
