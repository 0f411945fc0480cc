"""Fake quantization: quantize and dequantize in float during training (QAT).

A fake-quantize module wraps an observer (``activation_post_process``). In
``forward`` it updates the observer, copies the resulting qparams into its
``scale``/``zero_point`` buffers, and returns
``(clamp(round(x / scale + zero_point), quant_min, quant_max) - zero_point) * scale``
in float. Gradients pass straight through inside the clamp range and are zero
outside it (torch's ``fake_quantize_per_*_affine`` ops, which need no quantized
dtype). Output and gradients equal torch.ao's modules with the same settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from fxquant.config.checks import check_flag, check_integer
from fxquant.dtypes import check_fits, is_per_channel, is_symmetric, qscheme_name
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.factory import ModuleFactory
from fxquant.numerics.observer import (
    FixedQParamsObserver,
    HistogramObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    _MovingAverage,
    default_fixed_qparams_range_0to1_observer,
    default_fixed_qparams_range_neg1to1_observer,
)
from fxquant.numerics.saved_shapes import take_saved_shapes

__all__ = [
    "FakeQuantize",
    "FakeQuantizeBase",
    "FixedQParamsFakeQuantize",
    "FusedMovingAvgObsFakeQuantize",
    "default_affine_fixed_qparams_fake_quant",
    "default_dynamic_fake_quant",
    "default_embedding_fake_quant",
    "default_fake_quant",
    "default_fixed_qparams_range_0to1_fake_quant",
    "default_fixed_qparams_range_neg1to1_fake_quant",
    "default_fused_act_fake_quant",
    "default_fused_per_channel_wt_fake_quant",
    "default_fused_wt_fake_quant",
    "default_histogram_fake_quant",
    "default_per_channel_weight_fake_quant",
    "default_symmetric_fixed_qparams_fake_quant",
    "default_weight_fake_quant",
    "disable_fake_quant",
    "disable_observer",
    "enable_fake_quant",
    "enable_observer",
    "fused_per_channel_wt_fake_quant_range_neg_127_to_127",
    "fused_wt_fake_quant_range_neg_127_to_127",
]


class FakeQuantizeBase(torch.nn.Module):
    """Base of fake-quantize modules: two switches, ``fake_quant_enabled`` and ``observer_enabled``.

    The switches are one-element uint8 buffers (not bools) so they replicate
    under DDP, whose NCCL backend has no bool type.

    Example:
        >>> fq = FakeQuantize()
        >>> fq.disable_observer()
        >>> int(fq.observer_enabled[0])
        0
    """

    fake_quant_enabled: torch.Tensor
    observer_enabled: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.uint8))

    @classmethod
    def with_args(cls, **kwargs: Any) -> ModuleFactory:
        """A factory building this module with ``kwargs`` bound.

        Example:
            >>> make = FakeQuantize.with_args(quant_min=0, quant_max=127)
            >>> make().quant_max
            127
        """
        return ModuleFactory(cls, kwargs)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)`` from the observer's statistics."""
        raise NotImplementedError

    def enable_fake_quant(self, enabled: bool = True) -> None:
        """Turn fake quantization on (or off with ``enabled=False``)."""
        self.fake_quant_enabled[0] = 1 if enabled else 0

    def disable_fake_quant(self) -> None:
        """Pass inputs through unquantized (statistics may still be collected)."""
        self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> None:
        """Turn statistics collection on (or off with ``enabled=False``)."""
        self.observer_enabled[0] = 1 if enabled else 0

    def disable_observer(self) -> None:
        """Freeze the current scale and zero point."""
        self.enable_observer(False)


class FakeQuantize(FakeQuantizeBase):
    """Observe, then quantize and dequantize in float, per tensor or per channel.

    Args:
        observer: observer class or factory (``MovingAverageMinMaxObserver`` by default).
        quant_min: smallest integer; with ``quant_max``, passed on to the observer.
        quant_max: largest integer; both must fit the observer's dtype.
        is_dynamic: passed on to the observer.
        **observer_kwargs: more arguments for the observer (dtype, qscheme, ch_axis, ...).

    Raises:
        ConfigError: ``quant_min > quant_max``, a range outside the dtype, or an
            observer whose qscheme is neither per tensor nor per channel.

    Example:
        >>> fq = FakeQuantize(quant_min=0, quant_max=255)
        >>> fq(torch.tensor([0.0, 0.3, 1.0]))
        tensor([0.0000, 0.2980, 1.0000])
    """

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(
        self,
        observer: Callable[..., torch.nn.Module] = MovingAverageMinMaxObserver,
        quant_min: int | None = None,
        quant_max: int | None = None,
        is_dynamic: bool = False,
        **observer_kwargs: Any,
    ) -> None:
        super().__init__()
        check_integer(quant_min, "FakeQuantize quant_min", optional=True)
        check_integer(quant_max, "FakeQuantize quant_max", optional=True)
        check_flag(is_dynamic, "FakeQuantize is_dynamic")
        if not callable(observer):
            msg = (
                f"FakeQuantize observer={observer!r}: expected an observer class or a "
                f".with_args(...) factory, got {type(observer).__name__}"
            )
            raise ConfigTypeError(msg)
        if quant_min is not None and quant_max is not None:
            if quant_min > quant_max:
                msg = f"quant_min={quant_min!r} must not exceed quant_max={quant_max!r}"
                raise ConfigError(msg)
            # the dtype the observer will get: passed here, else bound in its factory
            bound = observer.kwargs if isinstance(observer, ModuleFactory) else {}
            dtype = observer_kwargs.get("dtype", bound.get("dtype", torch.uint8))
            check_fits(quant_min, quant_max, dtype)
            observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        observer_kwargs["is_dynamic"] = is_dynamic
        self.activation_post_process: Any = observer(**observer_kwargs)
        post: Any = self.activation_post_process
        self.quant_min: int = post.quant_min
        self.quant_max: int = post.quant_max
        self.is_dynamic: bool = post.is_dynamic
        self.dtype = post.dtype
        self.qscheme = post.qscheme
        self.ch_axis: int = getattr(post, "ch_axis", -1)
        self.is_per_channel = is_per_channel(self.qscheme)
        float_zero_point = qscheme_name(self.qscheme) == "per_channel_affine_float_qparams"
        zero_point_dtype = torch.float if float_zero_point else torch.int
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=zero_point_dtype))

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)`` from the observer."""
        qparams: tuple[torch.Tensor, torch.Tensor] = (
            self.activation_post_process.calculate_qparams()
        )
        return qparams

    def _refresh_qparams(self) -> None:
        """Recompute ``scale`` and ``zero_point`` from the observer's current statistics."""
        scale, zero_point = self.calculate_qparams()
        # per channel, the buffers take the channel count from the first batch
        self.scale.resize_(scale.shape).copy_(scale)
        self.zero_point.resize_(zero_point.shape).copy_(zero_point)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Update qparams (if observing), then fake-quantize ``x`` (if enabled)."""
        if self.observer_enabled[0] == 1:
            self.activation_post_process(x.detach())
            self._refresh_qparams()
        if self.fake_quant_enabled[0] != 1:
            return x
        if self.is_per_channel:
            return torch.fake_quantize_per_channel_affine(
                x, self.scale, self.zero_point, self.ch_axis, self.quant_min, self.quant_max
            )
        return torch.fake_quantize_per_tensor_affine(
            x, self.scale, self.zero_point, self.quant_min, self.quant_max
        )

    def extra_repr(self) -> str:
        return (
            f"fake_quant_enabled={self.fake_quant_enabled}, "
            f"observer_enabled={self.observer_enabled}, quant_min={self.quant_min}, "
            f"quant_max={self.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
            f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}"
        )

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], *rest: Any
    ) -> None:
        take_saved_shapes(self, state_dict, prefix, ("scale", "zero_point"))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *rest)


class FixedQParamsFakeQuantize(FakeQuantize):
    """Fake quantization with fixed qparams (sigmoid, tanh, softmax outputs).

    Args:
        observer: a :class:`~fxquant.observer.FixedQParamsObserver` class or factory.

    Raises:
        ConfigTypeError: when ``observer`` builds anything else.

    Example:
        >>> from fxquant.observer import default_fixed_qparams_range_0to1_observer
        >>> fq = FixedQParamsFakeQuantize(default_fixed_qparams_range_0to1_observer)
        >>> fq(torch.tensor([0.5, 2.0]))
        tensor([0.5000, 0.9961])
    """

    def __init__(self, observer: Callable[..., torch.nn.Module]) -> None:
        super().__init__(observer=observer)
        post = self.activation_post_process
        if type(post) is not FixedQParamsObserver:
            msg = (
                f"FixedQParamsFakeQuantize needs a FixedQParamsObserver, got {observer!r}; "
                "use FixedQParamsObserver.with_args(scale=..., zero_point=...)"
            )
            raise ConfigTypeError(msg)
        # share the observer's buffers: the qparams are fixed, never recomputed
        self.scale = post.scale
        self.zero_point = post.zero_point

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed ``(scale, zero_point)``."""
        return self.scale, self.zero_point


class FusedMovingAvgObsFakeQuantize(FakeQuantize):
    """:class:`FakeQuantize` with a moving-average min/max observer, run as one fused op.

    Runs ``torch.fused_moving_avg_obs_fake_quant``; a batch holding NaN or inf takes the
    unfused :class:`FakeQuantize` steps, whose observer leaves such values out.

    Example:
        >>> fq = FusedMovingAvgObsFakeQuantize()
        >>> fq(torch.tensor([0.0, 1.0])).tolist()
        [0.0, 1.0]
    """

    def __init__(
        self,
        observer: Callable[..., torch.nn.Module] = MovingAverageMinMaxObserver,
        quant_min: int = 0,
        quant_max: int = 255,
        **observer_kwargs: Any,
    ) -> None:
        super().__init__(observer, quant_min, quant_max, **observer_kwargs)
        post = self.activation_post_process
        if not isinstance(post, _MovingAverage):  # the two moving-average min/max observers
            msg = (
                f"FusedMovingAvgObsFakeQuantize needs a moving-average min/max observer, "
                f"got {type(post).__name__}; use FakeQuantize for other observers"
            )
            raise ConfigTypeError(msg)
        # the fused kernel takes int64 switches
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.long))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.long))
        self.is_symmetric_quant = is_symmetric(self.qscheme)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Observe and fake-quantize ``x`` in one kernel call."""
        observer_enabled = self.observer_enabled
        observing = bool(observer_enabled[0] == 1)
        post = self.activation_post_process
        state = (post.min_val, post.max_val, self.scale, self.zero_point)
        saved = tuple(t.clone() for t in state) if observing else ()
        if post._batch_reducer is not None and observing:
            self._observe_global_batch(x)
            observer_enabled = torch.zeros_like(observer_enabled)
        try:
            result = self._run_fused(x, observer_enabled, self.fake_quant_enabled)
        except RuntimeError:  # a NaN zero point (per channel) fails the kernel's own check
            if not observing or self._finite_state():
                raise
        else:
            if not observing or self._finite_state():
                return result
        # the kernel folded a NaN or inf of x into the moving averages, which would then never
        # recover: undo it and take the unfused steps, whose observer leaves non-finite values
        # out (and warns once)
        for target, value in zip(state, saved, strict=True):
            target.resize_(value.shape).copy_(value)
        return super().forward(x)

    def _finite_state(self) -> bool:
        """False when the running min/max took a NaN or an infinity (checked on the tiny
        min/max tensors after each kernel call: no extra pass over the batch)."""
        post = self.activation_post_process
        if post.min_val.numel() > 0 and math.isfinite(float((post.max_val - post.min_val).sum())):
            return True  # the usual case: one tiny op
        seen = post.min_val <= post.max_val
        return (
            bool(torch.isfinite(post.min_val[seen]).all())
            and bool(torch.isfinite(post.max_val[seen]).all())
            and not bool(torch.isnan(post.min_val).any() | torch.isnan(post.max_val).any())
        )

    def _run_fused(
        self, x: torch.Tensor, observer_enabled: torch.Tensor, fake_quant_enabled: torch.Tensor
    ) -> torch.Tensor:
        post = self.activation_post_process
        result: torch.Tensor = torch.fused_moving_avg_obs_fake_quant(
            x,
            observer_enabled,
            fake_quant_enabled,
            post.min_val,
            post.max_val,
            self.scale,
            self.zero_point,
            post.averaging_constant,
            self.quant_min,
            self.quant_max,
            self.ch_axis,
            self.is_per_channel,
            self.is_symmetric_quant,
        )
        return result

    def _observe_global_batch(self, x: torch.Tensor) -> None:
        """Fold in the min and max of the peers' global batch (fxquant_distributed).

        The fused kernel observes nothing but its input's min and max (per channel), so
        running it, observer on and fake quantization off, on a tensor of just the global
        extremes makes exactly the update it would make on the global batch. It computes
        qparams only while fake-quantizing: a second run on that tensor does it when this
        rank's own batch may be empty.
        """
        post = self.activation_post_process
        ch_axis = self.ch_axis if self.is_per_channel else None
        found = post._batch_min_max(x, post.min_val.dtype, ch_axis)
        if found is not None:
            self._run_on_extremes(
                *found, observe=True, quantize=bool(self.fake_quant_enabled[0] == 1)
            )

    def _run_on_extremes(
        self, low: torch.Tensor, high: torch.Tensor, *, observe: bool, quantize: bool
    ) -> None:
        """Run the kernel on a tensor holding just ``low`` and ``high`` (per channel along
        ``ch_axis``): observing them when ``observe``, then computing qparams when ``quantize``."""
        pairs = torch.stack([low, high], dim=-1)  # (2,) per tensor, (C, 2) per channel
        extremes = _channels_along(pairs, self.ch_axis) if self.is_per_channel else pairs
        on, off = torch.ones_like(self.observer_enabled), torch.zeros_like(self.observer_enabled)
        with torch.no_grad():
            if observe:
                self._run_fused(extremes, on, off)
            if quantize:
                self._run_fused(extremes, off, on)

    def _refresh_qparams(self) -> None:
        """``scale`` and ``zero_point`` recomputed from the running min and max, by the kernel."""
        post = self.activation_post_process
        if post.min_val.numel() == 0 or bool(torch.any(post.min_val > post.max_val)):
            super()._refresh_qparams()
            return
        self._run_on_extremes(
            post.min_val.clone(), post.max_val.clone(), observe=False, quantize=True
        )


def _channels_along(pairs: torch.Tensor, ch_axis: int) -> torch.Tensor:
    """``(C, 2)`` min/max pairs as a tensor whose dimension ``ch_axis`` holds the C channels."""
    if ch_axis >= 0:
        return pairs.reshape([1] * ch_axis + list(pairs.shape))
    # a negative axis counts from the end: (2, C, 1, ..., 1) with -ch_axis - 1 trailing ones
    return pairs.t().reshape([2, pairs.shape[0]] + [1] * (-ch_axis - 1))


def _switch(method: str) -> Callable[[torch.nn.Module], None]:
    def apply(module: torch.nn.Module) -> None:
        if isinstance(module, FakeQuantizeBase):
            getattr(module, method)()

    apply.__name__ = method
    apply.__qualname__ = method
    apply.__doc__ = (
        f"Call ``{method}()`` on ``module`` when it is a fake-quantize module.\n\n"
        f"    Example:\n"
        f"        >>> model = torch.nn.Sequential(FakeQuantize())\n"
        f"        >>> _ = model.apply({method})\n"
    )
    return apply


disable_fake_quant = _switch("disable_fake_quant")
enable_fake_quant = _switch("enable_fake_quant")
disable_observer = _switch("disable_observer")
enable_observer = _switch("enable_observer")


# uint8 affine activations, the range halved to 0..127
_ACTIVATION = {
    "quant_min": 0,
    "quant_max": 255,
    "dtype": torch.uint8,
    "qscheme": "per_tensor_affine",
    "reduce_range": True,
}

default_fake_quant = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, **_ACTIVATION)
"""Activation fake-quant: uint8 affine, range halved to 0..127."""


def _int8_weights(
    fake_quant: type[FakeQuantizeBase],
    observer: type[torch.nn.Module],
    qscheme: str,
    quant_min: int = -128,
    **extra: Any,
) -> ModuleFactory:
    """``fake_quant`` of symmetric int8 weights in ``quant_min..127``, observed by ``observer``."""
    return fake_quant.with_args(
        observer=observer,
        quant_min=quant_min,
        quant_max=127,
        dtype=torch.int8,
        qscheme=qscheme,
        **extra,
    )


default_weight_fake_quant = _int8_weights(
    FakeQuantize, MovingAverageMinMaxObserver, "per_tensor_symmetric", reduce_range=False
)
"""Weight fake-quant: int8 symmetric per tensor."""

default_dynamic_fake_quant = FakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver,
    quant_min=0,
    quant_max=255,
    is_dynamic=True,
    dtype=torch.uint8,
    averaging_constant=1,
)
"""Dynamic activation fake-quant: each batch's own range (averaging_constant=1)."""

default_fixed_qparams_range_neg1to1_fake_quant = FixedQParamsFakeQuantize.with_args(
    observer=default_fixed_qparams_range_neg1to1_observer
)
"""Fixed qparams for outputs in [-1, 1]."""

default_fixed_qparams_range_0to1_fake_quant = FixedQParamsFakeQuantize.with_args(
    observer=default_fixed_qparams_range_0to1_observer
)
"""Fixed qparams for outputs in [0, 1]."""

default_symmetric_fixed_qparams_fake_quant = default_fixed_qparams_range_neg1to1_fake_quant
"""Older name of :data:`default_fixed_qparams_range_neg1to1_fake_quant`."""

default_affine_fixed_qparams_fake_quant = default_fixed_qparams_range_0to1_fake_quant
"""Older name of :data:`default_fixed_qparams_range_0to1_fake_quant`."""

default_per_channel_weight_fake_quant = _int8_weights(
    FakeQuantize,
    MovingAveragePerChannelMinMaxObserver,
    "per_channel_symmetric",
    reduce_range=False,
    ch_axis=0,
)
"""Per-channel weight fake-quant: int8 symmetric along axis 0."""

default_embedding_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver,
    qscheme="per_channel_affine_float_qparams",
    dtype=torch.uint8,
    quant_min=0,
    quant_max=255,
    ch_axis=0,
    averaging_constant=1,
)
"""Embedding weights: per-row uint8 with float zero points."""

default_histogram_fake_quant = FakeQuantize.with_args(observer=HistogramObserver, **_ACTIVATION)
"""Activation fake-quant with a histogram observer."""

default_fused_act_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype=torch.uint8
)
"""Fused version of :data:`default_fake_quant` (full 0..255 range)."""

default_fused_wt_fake_quant = _int8_weights(
    FusedMovingAvgObsFakeQuantize, MovingAverageMinMaxObserver, "per_tensor_symmetric"
)
"""Fused version of :data:`default_weight_fake_quant`."""

default_fused_per_channel_wt_fake_quant = _int8_weights(
    FusedMovingAvgObsFakeQuantize, MovingAveragePerChannelMinMaxObserver, "per_channel_symmetric"
)
"""Fused version of :data:`default_per_channel_weight_fake_quant`."""

fused_wt_fake_quant_range_neg_127_to_127 = _int8_weights(
    FusedMovingAvgObsFakeQuantize,
    MovingAverageMinMaxObserver,
    "per_tensor_symmetric",
    quant_min=-127,
    eps=2**-12,
)
"""Fused weight fake-quant restricted to -127..127."""

fused_per_channel_wt_fake_quant_range_neg_127_to_127 = _int8_weights(
    FusedMovingAvgObsFakeQuantize,
    MovingAveragePerChannelMinMaxObserver,
    "per_channel_symmetric",
    quant_min=-127,
    eps=2**-12,
)
"""Fused per-channel weight fake-quant restricted to -127..127."""
