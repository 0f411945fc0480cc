"""Linear patterns: the module and functional, fusions with ReLU and BatchNorm1d.

Linear | qat.Linear | F.linear                          weighted op
(Linear, ReLU) -> LinearReLU -> qat.LinearReLU          fusion, then weighted op
(F.linear, ReLU)                                        observed as one op
(Linear, BatchNorm1d) -> LinearBn1d -> qat.LinearBn1d   fusion (BN folded in eval)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.nn import fusers, intrinsic, qat, reference
from fxquant.nn.intrinsic import qat as intrinsic_qat
from fxquant.patterns.builders import fusion_config, module_config, op_config, relu_fusion_configs

__all__ = ["linear_configs"]


def linear_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """Every linear pattern (12 configs).

    Args:
        dtype_configs: the dtypes the backend accepts for linear; static,
            dynamic and fp16 configs may be mixed.

    Example:
        >>> import torch
        >>> configs = linear_configs([])
        >>> [c.pattern for c in configs][:2] == [torch.nn.Linear, qat.Linear]
        True
    """
    root = {"root": nn.Linear, "reference": reference.Linear}
    # F.linear(input, weight, bias): weight and bias are positional inputs 1 and 2
    functional = op_config(F.linear, dtype_configs, inputs={"weight": 1, "bias": 2})
    relu_fusions = relu_fusion_configs(
        (nn.Linear,), dtype_configs, fuser=fusers.fuse_linear_relu, fused=intrinsic.LinearReLU
    )
    return [
        module_config(nn.Linear, dtype_configs, qat=qat.Linear, **root),
        module_config(qat.Linear, dtype_configs, **root),
        functional,
        *relu_fusions,
        module_config(intrinsic.LinearReLU, dtype_configs, qat=intrinsic_qat.LinearReLU, **root),
        module_config(intrinsic_qat.LinearReLU, dtype_configs, **root),
        op_config((F.linear, nn.ReLU), dtype_configs),
        op_config((F.linear, F.relu), dtype_configs),
        fusion_config(
            (nn.Linear, nn.BatchNorm1d),
            dtype_configs,
            fuser=fusers.fuse_linear_bn,
            fused=intrinsic.LinearBn1d,
        ),
        module_config(intrinsic.LinearBn1d, dtype_configs, qat=intrinsic_qat.LinearBn1d, **root),
        module_config(intrinsic_qat.LinearBn1d, dtype_configs, **root),
    ]
