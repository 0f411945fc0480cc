"""Ops whose output range is known in advance, so their qparams are fixed.

sigmoid, hardsigmoid and softmax map into [0, 1]; tanh maps into [-1, 1].
On quint8 (0..255) the grid that covers those ranges exactly is

    [0, 1]:   scale = 1/256, zero_point = 0
    [-1, 1]:  scale = 2/256, zero_point = 128

A backend's kernels for these ops assume that grid, so the activation dtype
configs of these patterns demand it (``scale_exact_match`` /
``zero_point_exact_match``), and a QConfig must use a fixed-qparams observer
with exactly those values to be accepted. Only the dtype configs whose
activation dtype is quint8 are constrained; others (fp16, qint8) are kept as
they are, as PyTorch's backends do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fxquant.config.backend import (
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
)
from fxquant.dtypes import dtypes_match
from fxquant.errors import ConfigError
from fxquant.patterns.builders import Pattern, op_config

__all__ = [
    "RANGE_0_TO_1",
    "RANGE_NEG1_TO_1",
    "FixedQParams",
    "fixed_qparams_op_configs",
    "fixed_qparams_ops",
    "with_fixed_qparams",
]


@dataclass(frozen=True, slots=True)
class FixedQParams:
    """The fixed quantization grid of an op's output.

    Example:
        >>> RANGE_NEG1_TO_1.constraints().zero_point_exact_match
        128
    """

    scale: float
    zero_point: int
    dtype: torch.dtype = torch.uint8
    quant_min: int = 0
    quant_max: int = 255

    def constraints(self) -> DTypeWithConstraints:
        """The activation constraint a backend puts on ops with this grid."""
        return DTypeWithConstraints(
            dtype=self.dtype,
            quant_min_lower_bound=self.quant_min,
            quant_max_upper_bound=self.quant_max,
            scale_exact_match=self.scale,
            zero_point_exact_match=self.zero_point,
        )


RANGE_0_TO_1 = FixedQParams(scale=1.0 / 256.0, zero_point=0)
"""sigmoid, hardsigmoid, softmax: outputs in [0, 1]."""

RANGE_NEG1_TO_1 = FixedQParams(scale=2.0 / 256.0, zero_point=128)
"""tanh: outputs in [-1, 1]."""


def fixed_qparams_ops() -> dict[Pattern, FixedQParams]:
    """Each fixed-qparams pattern (module, function or method name) and its grid.

    Example:
        >>> fixed_qparams_ops()[torch.tanh] == RANGE_NEG1_TO_1
        True
    """
    ops: dict[Pattern, FixedQParams] = {}
    for module, function, method in (
        (nn.Hardsigmoid, nn.functional.hardsigmoid, "hardsigmoid"),
        (nn.Sigmoid, torch.sigmoid, "sigmoid"),
        (nn.Tanh, torch.tanh, "tanh"),
    ):
        grid = RANGE_NEG1_TO_1 if method == "tanh" else RANGE_0_TO_1
        # the in-place method (x.sigmoid_()) has the same output range
        ops.update(dict.fromkeys((module, function, method, f"{method}_"), grid))
    ops[nn.Softmax] = RANGE_0_TO_1
    return ops


def with_fixed_qparams(
    dtype_configs: Sequence[DTypeConfig], qparams: FixedQParams
) -> list[DTypeConfig]:
    """Copies of ``dtype_configs`` whose input and output demand the ``qparams`` grid.

    Activations of another dtype than ``qparams.dtype`` are left unchanged.

    Raises:
        ConfigError: when a matching activation already bounds the scale
            (``scale_min_lower_bound``/``scale_max_upper_bound``): a fixed scale
            cannot honour a bound chosen for observed scales.

    Example:
        >>> from fxquant.config.backend import DTypeConfig
        >>> config = DTypeConfig(input_dtype=torch.uint8, output_dtype=torch.uint8)
        >>> [fixed] = with_fixed_qparams([config], RANGE_0_TO_1)
        >>> fixed.output_dtype_with_constraints.scale_exact_match
        0.00390625
    """
    return [_constrain(config, qparams) for config in dtype_configs]


def _constrain(config: DTypeConfig, qparams: FixedQParams) -> DTypeConfig:
    activations = []
    for side in ("input", "output"):
        original: DTypeWithConstraints = getattr(config, f"{side}_dtype_with_constraints")
        if not dtypes_match(original.dtype, qparams.dtype):
            activations.append(original)
            continue
        for bound in ("scale_min_lower_bound", "scale_max_upper_bound"):
            if getattr(original, bound) is not None:
                msg = (
                    f"{bound}={getattr(original, bound)!r} in the {side} of {config!r} "
                    "cannot apply to a fixed-qparams op (its scale is fixed at "
                    f"{qparams.scale!r}); pass dtype configs without scale bounds"
                )
                raise ConfigError(msg)
        activations.append(qparams.constraints())
    return DTypeConfig(
        input_dtype=activations[0],
        output_dtype=activations[1],
        weight_dtype=config.weight_dtype_with_constraints,
        bias_dtype=config.bias_dtype,
        is_dynamic=config.is_dynamic,
    )


def fixed_qparams_op_configs(dtype_configs: Sequence[DTypeConfig]) -> list[BackendPatternConfig]:
    """One config per fixed-qparams op (13), its quint8 activations constrained to the op's grid.

    Example:
        >>> from fxquant.config.backend import DTypeConfig
        >>> config = DTypeConfig(input_dtype=torch.uint8, output_dtype=torch.uint8)
        >>> tanh = fixed_qparams_op_configs([config])[8]
        >>> tanh.pattern, tanh.dtype_configs[0].output_dtype_with_constraints.zero_point_exact_match
        (<class 'torch.nn.modules.activation.Tanh'>, 128)
    """
    return [
        op_config(op, with_fixed_qparams(dtype_configs, grid))
        for op, grid in fixed_qparams_ops().items()
    ]
