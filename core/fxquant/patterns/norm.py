"""Normalization patterns: BatchNorm (with ReLU fusion) and LayerNorm.

    (BatchNorm2d, ReLU) -> BNReLU2d       fusion, then observed like an activation
    BatchNorm2d | BNReLU2d                input and output observed
    LayerNorm | F.layer_norm              input and output observed; the affine
                                          weight and bias are inputs 2 and 3 of
                                          F.layer_norm(x, shape, weight, bias)

Instance and group norm have no fusion; they are among the default ops
(:func:`fxquant.patterns.misc.default_op_configs`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import nn

from fxquant.config.backend import BackendPatternConfig, DTypeConfig
from fxquant.nn import fusers, intrinsic
from fxquant.patterns.builders import op_config, relu_fusion_configs

__all__ = ["bn_configs", "ln_configs"]


def bn_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """BatchNorm2d/3d alone, fused with a following ReLU, and the fused modules (8 configs).

    Example:
        >>> [c.pattern for c in bn_configs([])][-1] is intrinsic.BNReLU3d
        True
    """
    configs: list[BackendPatternConfig] = []
    fused_modules = ((nn.BatchNorm2d, intrinsic.BNReLU2d), (nn.BatchNorm3d, intrinsic.BNReLU3d))
    for bn, fused in fused_modules:
        configs += relu_fusion_configs((bn,), dtype_configs, fuser=fusers.fuse_bn_relu, fused=fused)
        configs.append(op_config(bn, dtype_configs))
    configs += [op_config(fused, dtype_configs) for _, fused in fused_modules]
    return configs


def ln_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """``nn.LayerNorm`` and ``F.layer_norm`` (2 configs).

    Kernels usually keep the affine weight in float: pass dtype configs with
    ``weight_dtype=torch.float``.

    Example:
        >>> ln_configs([])[1]._input_type_to_index
        {'weight': 2, 'bias': 3}
    """
    functional = op_config(F.layer_norm, dtype_configs, inputs={"weight": 2, "bias": 3})
    return [op_config(nn.LayerNorm, dtype_configs), functional]
