"""Input-weight equalization: its qconfig, its two observers and the scale they give.

A Linear computes ``y = x @ W.T``; for any positive vector ``s`` over the input
channels, ``(x * s) @ (W / s).T`` is the same product. Equalization picks ``s``
so that the input channels with outliers shrink and the weight columns that
meet them grow, which narrows the per-tensor range the input is quantized with::

    x -> Linear(W)          becomes          x * s -> Linear(W / s)

``s_j = range(W[:, j]) ** (1 - alpha) / range(x[..., j]) ** alpha`` over the
calibration data. ``alpha = 0.5`` is torch.ao FX's input-weight equalization
(``sqrt(weight range / input range)``); SmoothQuant's migration strength (Xiao
et al. 2023) is the general ``alpha``. A zero, infinite or undefined scale is 1.

``alpha="auto"`` picks the strength per input from the calibration statistics
(:func:`choose_alpha`): the one, or no scaling at all, that minimizes the
quantization noise the Linear's output is expected to carry. A fixed strength
tuned on one model's outlier channels can cost another model several dB where
its inputs have none to move.
The graph side (where observers go, where ``s`` is folded) is
``fxquant.flow.equalization.prepare``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import torch

from fxquant.config.qconfig import Constructor, QConfig
from fxquant.errors import ConfigError
from fxquant.factory import ModuleFactory
from fxquant.numerics.observer import PerChannelMinMaxObserver
from fxquant.numerics.saved_shapes import take_saved_shapes

AUTO: Final = "auto"
"""``alpha`` that asks :func:`choose_alpha` for each input's strength."""

REQUIRED_GAIN: Final = 0.25
"""``alpha="auto"`` scales an input only where :func:`estimated_noise` falls to this
fraction of the unscaled one or below (6 dB). The estimate counts rounding on the
calibration data, not the clipping of data calibration did not see, and clipping grows
as equalization brings every channel to the edge of the range: a 64-256-64 MLP at
alpha 1 gains 1.4 dB on its calibration batch and loses 4.6 dB on a fresh one (its
estimate: 2.3 dB less noise). An input with outlier channels clears the bar by far
(the estimate falls 25x for one channel 30-60x the others)."""

ALPHA_CANDIDATES: Final = tuple(i / 20 for i in range(21))
"""The strengths ``alpha="auto"`` weighs (0, 0.05, ..., 1), besides no scaling."""

__all__ = [
    "ALPHA_CANDIDATES",
    "AUTO",
    "REQUIRED_GAIN",
    "EqualizationQConfig",
    "InputEqualizationObserver",
    "WeightEqualizationObserver",
    "choose_alpha",
    "default_equalization_qconfig",
    "equalization_scale",
    "estimated_noise",
    "input_equalization_observer",
    "weight_equalization_observer",
]


class _ColumnRanges(torch.nn.Module):
    """Per column (last axis) min and max; not a quantization observer (convert never
    turns it into quantize/dequantize: the flow removes it first)."""

    def __init__(self, dtype: torch.dtype, qscheme: object) -> None:
        super().__init__()
        self.dtype = dtype
        self.qscheme = qscheme
        per_channel = str(qscheme).replace("per_tensor", "per_channel").removeprefix("torch.")
        self.columns = PerChannelMinMaxObserver(ch_axis=-1, dtype=dtype, qscheme=per_channel)

    @classmethod
    def with_args(cls, **kwargs: Any) -> ModuleFactory:
        """A factory building this observer with ``kwargs`` bound."""
        return ModuleFactory(cls, kwargs)

    def _record(self, x: torch.Tensor, fits: bool, what: str) -> None:
        if not fits:
            msg = f"{type(self).__name__} observes Linear {what}, got shape {tuple(x.shape)}"
            raise ConfigError(msg)
        self.columns(x)

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
            moves into the weight (0.5 is torch.ao's equalization); or ``"auto"``:
            chosen at convert from what was observed (:func:`choose_alpha`), for
            which the observer also keeps each channel's mean square.

    Raises:
        ConfigError: ``alpha`` neither in ``[0, 1]`` nor ``"auto"``.

    Example:
        >>> obs = InputEqualizationObserver()
        >>> _ = obs(torch.tensor([[1.0, -4.0], [3.0, 0.0]]))
        >>> obs.min_val, obs.max_val
        (tensor([ 1., -4.]), tensor([3., 0.]))
    """

    square_sum: torch.Tensor
    rows: torch.Tensor

    def __init__(
        self,
        dtype: torch.dtype = torch.uint8,
        qscheme: object = "per_tensor_symmetric",
        alpha: float | str = 0.5,
    ) -> None:
        super().__init__(dtype, qscheme)
        self.alpha: float | str = _checked_alpha(alpha)
        if self.alpha == AUTO:
            self.register_buffer("square_sum", torch.zeros(0))
            self.register_buffer("rows", torch.zeros(0, dtype=torch.int64))  # per channel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Record ``x``'s per-channel range; return ``x`` unchanged."""
        self._record(x, x.dim() >= 2, "inputs (2-d or more)")
        if self.alpha == AUTO:
            self._add_squares(x.detach().float().reshape(-1, x.shape[-1]))
        return x

    def _add_squares(self, rows: torch.Tensor) -> None:
        finite = torch.isfinite(rows)  # the range observer leaves the others out too
        squares = torch.where(finite, rows, 0.0).square().sum(dim=0)
        if self.square_sum.numel() != squares.numel():
            self.square_sum = torch.zeros_like(squares)
            self.rows = torch.zeros_like(squares, dtype=torch.int64)
        self.square_sum += squares
        self.rows += finite.sum(dim=0)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], *rest: Any
    ) -> None:
        # alpha="auto" only (no buffers otherwise); a fresh observer's are empty
        take_saved_shapes(self, state_dict, prefix, ("square_sum", "rows"))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *rest)

    def mean_square(self) -> torch.Tensor:
        """Each channel's mean of ``x ** 2`` over what was observed (``alpha="auto"`` only)."""
        if self.alpha != AUTO:
            msg = f"mean_square() is kept only with alpha='auto' (this observer: {self.alpha!r})"
            raise ConfigError(msg)
        return self.square_sum / self.rows.clamp(min=1)


def _checked_alpha(alpha: object) -> float | str:
    if alpha == AUTO:
        return AUTO
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 0.0 <= alpha <= 1.0:
        return float(alpha)
    msg = (
        f"alpha={alpha!r}: the migration strength must lie in [0, 1] (0.5 is torch.ao's), "
        f"or be {AUTO!r} to choose it per input from the calibration data"
    )
    raise ConfigError(msg)


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
        self._record(weight, weight.dim() == 2, "weights (2-d)")
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
    inputs: InputEqualizationObserver,
    weights: list[WeightEqualizationObserver],
    alpha: float | None = None,
) -> torch.Tensor:
    """The per input channel multiplier ``s`` of the input (the weight columns get ``1 / s``).

    Several weights (Linears reading the same input) share one scale, from the
    union of their column ranges. ``alpha`` overrides the observer's own (required
    when that is ``"auto"``: :func:`choose_alpha` gives it).

    Example:
        >>> x, w = InputEqualizationObserver(), WeightEqualizationObserver()
        >>> _ = x(torch.tensor([[0.0, 0.0], [4.0, 1.0]]))
        >>> _ = w(torch.tensor([[1.0, 0.0], [0.0, 4.0]]))
        >>> equalization_scale(x, [w])
        tensor([0.5000, 2.0000])
    """
    if alpha is None:
        if inputs.alpha == AUTO:
            msg = "alpha='auto' has no scale of its own: pass the alpha choose_alpha() picked"
            raise ConfigError(msg)
        alpha = float(inputs.alpha)
    w_min = torch.stack([w.min_val for w in weights]).amin(dim=0)
    w_max = torch.stack([w.max_val for w in weights]).amax(dim=0)
    if w_min.shape != inputs.min_val.shape:
        msg = (
            f"input has {tuple(inputs.min_val.shape)} channels but the weight has "
            f"{tuple(w_min.shape)} columns; equalization needs one scale per input channel"
        )
        raise ConfigError(msg)
    scale = (w_max - w_min) ** (1.0 - alpha) / (inputs.max_val - inputs.min_val) ** alpha
    scale = torch.nan_to_num(scale, nan=1.0, posinf=1.0, neginf=1.0)
    return torch.where(scale == 0, torch.ones_like(scale), scale)


def estimated_noise(  # noqa: PLR0913  # the statistics, the matrices and the two quantizers
    x_min: torch.Tensor,
    x_max: torch.Tensor,
    x_mean_square: torch.Tensor,
    weights: Sequence[torch.Tensor],
    scale: torch.Tensor,
    *,
    symmetric_input: bool,
    per_channel_weight: bool,
) -> float:
    """The quantization noise power expected on the Linears' outputs when the input is
    multiplied by ``scale`` and the weight columns divided by it (up to a constant
    factor, the same for every ``scale``, so only comparisons mean anything).

    Rounding to a grid of step ``d`` adds noise of power ``d**2 / 12``, and 8-bit
    steps are ``range / 255`` on both sides. Output channel ``o`` then receives
    the input's noise through its weights, ``d_x**2 * sum_j (W[o, j] / s_j)**2``,
    and its weights' noise through the input, ``d_w[o]**2 * sum_j E[x_j**2] s_j**2``,
    where ``d_x`` follows the scaled input's per-tensor range and ``d_w[o]`` the
    scaled weight's range (per output channel, or the whole tensor's).

    Example:
        >>> x_min, x_max = torch.tensor([-1.0, -50.0]), torch.tensor([1.0, 50.0])
        >>> square = torch.tensor([0.3, 800.0])
        >>> w = [torch.tensor([[1.0, 0.1], [0.5, 0.2]])]
        >>> one = estimated_noise(x_min, x_max, square, w, torch.ones(2),
        ...                       symmetric_input=True, per_channel_weight=True)
        >>> moved = estimated_noise(x_min, x_max, square, w, torch.tensor([1.0, 0.1]),
        ...                         symmetric_input=True, per_channel_weight=True)
        >>> moved < one  # shrinking the outlier channel lowers the noise
        True
    """
    lo, hi = torch.min(x_min * scale).clamp(max=0.0), torch.max(x_max * scale).clamp(min=0.0)
    x_range = 2 * torch.maximum(-lo, hi) if symmetric_input else hi - lo
    weighted_squares = x_mean_square * scale.square()
    total = torch.zeros((), dtype=torch.float64)
    for weight in weights:
        scaled = weight.detach().double() / scale.double()
        input_noise = x_range.double().square() * scaled.square().sum()
        peak = scaled.abs().amax(dim=1)  # per output channel; per tensor: the largest, each
        if not per_channel_weight:
            peak = peak.amax().expand_as(peak)
        weight_noise = (2 * peak).square().sum() * weighted_squares.double().sum()
        total += input_noise + weight_noise
    return float(total)


def choose_alpha(
    inputs: InputEqualizationObserver,
    weights: Sequence[torch.Tensor],
    *,
    symmetric_input: bool,
    per_channel_weight: bool,
) -> float | None:
    """The strength among :data:`ALPHA_CANDIDATES` with the least :func:`estimated_noise`,
    or ``None`` (leave the input unscaled) unless that noise is at most
    :data:`REQUIRED_GAIN` times the unscaled input's.

    ``inputs`` must have observed with ``alpha="auto"`` (it keeps each channel's
    mean square); ``weights`` are the Linears' weight matrices reading that input.

    Example:
        >>> obs = InputEqualizationObserver(alpha="auto")
        >>> _ = obs(torch.randn(64, 8) * torch.tensor([1.0] * 7 + [80.0]))  # one outlier
        >>> w = [torch.randn(16, 8)]
        >>> a = choose_alpha(obs, w, symmetric_input=True, per_channel_weight=True)
        >>> a is not None and a > 0
        True
    """
    observers = [WeightEqualizationObserver() for _ in weights]
    for observer, weight in zip(observers, weights, strict=True):
        observer(weight.detach())
    stats = (inputs.min_val, inputs.max_val, inputs.mean_square())

    def noise(scale: torch.Tensor) -> float:
        return estimated_noise(
            *stats,
            weights,
            scale,
            symmetric_input=symmetric_input,
            per_channel_weight=per_channel_weight,
        )

    best: float | None = None
    unscaled = noise(torch.ones_like(inputs.min_val))
    least = unscaled
    for alpha in ALPHA_CANDIDATES:
        estimate = noise(equalization_scale(inputs, observers, alpha))
        if estimate < least:
            best, least = alpha, estimate
    return best if least <= REQUIRED_GAIN * unscaled else None
