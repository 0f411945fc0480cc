"""Input-weight equalization: its qconfig, its two observers and the scale they give (#23).

A Linear computes ``y = x @ W.T``; for any positive vector ``s`` over the input
channels, ``(x * s) @ (W / s).T`` is the same product. Equalization picks ``s``
so that the input channels with outliers shrink and the weight columns that
meet them grow, which narrows the per-tensor range the input is quantized with::

    x -> Linear(W)          becomes          x * s -> Linear(W / s)

``s_j = range(W[:, j]) ** (1 - alpha) / range(x[..., j]) ** alpha`` over the
calibration data. ``alpha = 0.5`` is torch.ao FX's input-weight equalization
(``sqrt(weight range / input range)``); SmoothQuant's migration strength (Xiao
et al. 2023) is the general ``alpha``. A zero, infinite or undefined scale is 1.
The graph side (where observers go, where ``s`` is folded) is
``fxquant.flow.equalize``.
"""

from __future__ import annotations

from typing import Any

import torch

from fxquant.config.qconfig import Constructor, QConfig
from fxquant.errors import ConfigError
from fxquant.factory import ModuleFactory
from fxquant.numerics.observer import PerChannelMinMaxObserver

__all__ = [
    "EqualizationQConfig",
    "InputEqualizationObserver",
    "WeightEqualizationObserver",
    "default_equalization_qconfig",
    "equalization_scale",
    "input_equalization_observer",
    "weight_equalization_observer",
]


def _column_observer(dtype: torch.dtype, qscheme: object) -> PerChannelMinMaxObserver:
    per_channel = str(qscheme).replace("per_tensor", "per_channel").removeprefix("torch.")
    return PerChannelMinMaxObserver(ch_axis=-1, dtype=dtype, qscheme=per_channel)


class _ColumnRanges(torch.nn.Module):
    """Per column (last axis) min and max; not a quantization observer (convert never
    turns it into quantize/dequantize: the flow removes it first)."""

    def __init__(self, dtype: torch.dtype, qscheme: object) -> None:
        super().__init__()
        self.dtype = dtype
        self.qscheme = qscheme
        self.columns = _column_observer(dtype, qscheme)

    @classmethod
    def with_args(cls, **kwargs: Any) -> ModuleFactory:
        """A factory building this observer with ``kwargs`` bound."""
        return ModuleFactory(cls, kwargs)

    @property
    def min_val(self) -> torch.Tensor:
        """Per column minimum seen."""
        return self.columns.min_val

    @property
    def max_val(self) -> torch.Tensor:
        """Per column maximum seen."""
        return self.columns.max_val


class InputEqualizationObserver(_ColumnRanges):
    """Records the min and max of every input channel (the last axis) of a Linear.

    Args:
        dtype: the dtype the input is quantized to (kept for torch.ao parity).
        qscheme: a per-tensor qscheme (the input's own quantization is per tensor).
        alpha: migration strength in ``[0, 1]``: how much of the input's range
            moves into the weight (0.5 is torch.ao's equalization).

    Raises:
        ConfigError: ``alpha`` outside ``[0, 1]``.

    Example:
        >>> obs = InputEqualizationObserver()
        >>> _ = obs(torch.tensor([[1.0, -4.0], [3.0, 0.0]]))
        >>> obs.min_val, obs.max_val
        (tensor([ 1., -4.]), tensor([3., 0.]))
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.uint8,
        qscheme: object = "per_tensor_symmetric",
        alpha: float = 0.5,
    ) -> None:
        super().__init__(dtype, qscheme)
        if not 0.0 <= float(alpha) <= 1.0:
            msg = f"alpha={alpha!r}: the migration strength must lie in [0, 1] (0.5 is torch.ao's)"
            raise ConfigError(msg)
        self.alpha = float(alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Record ``x``'s per-channel range; return ``x`` unchanged."""
        if x.dim() < 2:
            msg = (
                f"{type(self).__name__} observes Linear inputs (2-d or more), "
                f"got shape {tuple(x.shape)}"
            )
            raise ConfigError(msg)
        self.columns(x)
        return x


class WeightEqualizationObserver(_ColumnRanges):
    """Records the min and max of every column (input channel) of a Linear weight.

    Example:
        >>> obs = WeightEqualizationObserver()
        >>> _ = obs(torch.tensor([[1.0, -2.0], [0.5, 4.0]]))
        >>> obs.min_val, obs.max_val
        (tensor([ 0.5000, -2.0000]), tensor([1., 4.]))
    """

    def __init__(
        self, dtype: torch.dtype = torch.int8, qscheme: object = "per_channel_symmetric"
    ) -> None:
        super().__init__(dtype, qscheme)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        """Record the weight's per-column range; return it unchanged."""
        if weight.dim() != 2:
            msg = (
                f"{type(self).__name__} observes Linear weights (2-d), "
                f"got shape {tuple(weight.shape)}"
            )
            raise ConfigError(msg)
        self.columns(weight)
        return weight


class EqualizationQConfig(QConfig):
    """An entry of ``prepare_fx``'s ``_equalization_config``: the two equalization observers.

    A ``QConfig`` whose ``activation`` is the input observer (also readable as
    ``input_activation``, torch.ao's field name), so a ``QConfigMapping`` holds it
    like any qconfig.

    Example:
        >>> q = EqualizationQConfig(input_activation=InputEqualizationObserver.with_args(alpha=0.8))
        >>> q.input_activation().alpha
        0.8
    """

    def __init__(
        self,
        input_activation: Constructor = InputEqualizationObserver,
        weight: Constructor = WeightEqualizationObserver,
    ) -> None:
        object.__setattr__(self, "activation", input_activation)
        object.__setattr__(self, "weight", weight)
        self.__post_init__()

    @property
    def input_activation(self) -> Constructor:
        """The input equalization observer's constructor (torch.ao's name for ``activation``)."""
        return self.activation

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.activation, self.weight))


input_equalization_observer = InputEqualizationObserver.with_args(
    dtype=torch.uint8, qscheme="per_tensor_symmetric"
)
weight_equalization_observer = WeightEqualizationObserver.with_args(
    dtype=torch.int8, qscheme="per_channel_symmetric"
)
default_equalization_qconfig = EqualizationQConfig(
    input_activation=input_equalization_observer, weight=weight_equalization_observer
)
"""torch.ao's default: equalize with ``alpha = 0.5``."""


def equalization_scale(
    inputs: InputEqualizationObserver, weights: list[WeightEqualizationObserver]
) -> torch.Tensor:
    """The per input channel multiplier ``s`` of the input (the weight columns get ``1 / s``).

    Several weights (Linears reading the same input) share one scale, from the
    union of their column ranges.

    Example:
        >>> x, w = InputEqualizationObserver(), WeightEqualizationObserver()
        >>> _ = x(torch.tensor([[0.0, 0.0], [4.0, 1.0]]))
        >>> _ = w(torch.tensor([[1.0, 0.0], [0.0, 4.0]]))
        >>> equalization_scale(x, [w])
        tensor([0.5000, 2.0000])
    """
    w_min = torch.stack([w.min_val for w in weights]).amin(dim=0)
    w_max = torch.stack([w.max_val for w in weights]).amax(dim=0)
    if w_min.shape != inputs.min_val.shape:
        msg = (
            f"input has {tuple(inputs.min_val.shape)} channels but the weight has "
            f"{tuple(w_min.shape)} columns; equalization needs one scale per input channel"
        )
        raise ConfigError(msg)
    alpha = inputs.alpha
    scale = (w_max - w_min) ** (1.0 - alpha) / (inputs.max_val - inputs.min_val) ** alpha
    scale = torch.nan_to_num(scale, nan=1.0, posinf=1.0, neginf=1.0)
    return torch.where(scale == 0, torch.ones_like(scale), scale)
