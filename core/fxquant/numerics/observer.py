"""Observers: modules that watch tensors during calibration and pick quantization parameters.

An observer sits on a graph edge, passes its input through unchanged and
records statistics (running min/max, a histogram). ``calculate_qparams()``
turns those statistics into ``(scale, zero_point)``; the results are
bit-identical to torch.ao's observers with the same settings and data.

Dtypes: ``torch.uint8``/``int8``/``int32`` are the defaults and the names to
write; torch's deprecated ``torch.quint8``/``qint8``/``qint32`` are accepted as
the same dtypes (see :mod:`fxquant.dtypes`). Qschemes may be torch objects
(``torch.per_tensor_affine``) or their names (``"per_tensor_affine"``).

An observer that saw no data returns ``scale=1.0, zero_point=0`` (``convert_fx``
keeps the nodes of such observers float, see :func:`is_calibrated`). Non-finite
values (NaN, ``inf``, ``-inf``) are left out of every observer's statistics (per
channel for per-channel observers); a batch with nothing finite leaves the
observer unchanged, and the first such batch raises one
:class:`fxquant.errors.CalibrationWarning` naming the observer. The check
costs one test of the batch's min and max, which the observer computes anyway.

Global batches (:func:`fxquant_distributed.observe_global_batch`): an observer
with a :class:`BatchReducer` combines each batch's statistics (min/max, the
histogram's counts) with those of its peers in other processes *before*
folding them in, so that every peer makes the same update, the one a single
process seeing all the peers' batches at once would make.
"""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import torch

from fxquant.config.checks import check_flag, check_integer, check_real, check_unit_interval
from fxquant.dtypes import (
    canonical_dtype,
    check_fits,
    dtypes_match,
    float32_value,
    is_per_channel,
    is_quantized_dtype,
    is_symmetric,
    qscheme_name,
    qscheme_object,
    quant_range,
)
from fxquant.errors import CalibrationWarning, ConfigError, ConfigTypeError
from fxquant.factory import ModuleFactory
from fxquant.numerics.saved_shapes import take_saved_shapes

__all__ = [
    "BatchReducer",
    "FixedQParamsObserver",
    "HistogramObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "NoopObserver",
    "ObserverBase",
    "PerChannelMinMaxObserver",
    "PerTokenObserver",
    "PlaceholderObserver",
    "RecordingObserver",
    "ReuseInputObserver",
    "UniformQuantizationObserverBase",
    "default_affine_fixed_qparams_observer",
    "default_debug_observer",
    "default_dynamic_quant_observer",
    "default_fixed_qparams_range_0to1_observer",
    "default_fixed_qparams_range_neg1to1_observer",
    "default_float_qparams_observer",
    "default_histogram_observer",
    "default_observer",
    "default_per_channel_weight_observer",
    "default_placeholder_observer",
    "default_reuse_input_observer",
    "default_symmetric_fixed_qparams_observer",
    "default_weight_observer",
    "is_calibrated",
    "per_channel_weight_observer_range_neg_127_to_127",
    "weight_observer_range_neg_127_to_127",
]

FLOAT32_EPS: float = float(torch.finfo(torch.float32).eps)


class BatchReducer(Protocol):
    """Combines one batch's statistics with those its peers compute at the same step.

    Observers call it (when one is set in their ``_batch_reducer``) between
    measuring a batch and folding the measurement into their state. Each call is
    collective: every peer makes the same calls, in the same order, with tensors
    of the same shape, also when its own batch is empty (it then passes ``inf``
    as ``low`` and ``-inf`` as ``high``). :mod:`fxquant_distributed` implements
    it with ``torch.distributed`` all-reduces.

    Example:
        >>> class Alone:  # a single peer: nothing to combine with
        ...     def min_max(self, low, high):
        ...         return low, high
        ...     def sum(self, values):
        ...         return values
        >>> obs = MinMaxObserver()
        >>> obs._batch_reducer = Alone()
        >>> _ = obs(torch.tensor([-1.0, 2.0]))
        >>> float(obs.min_val), float(obs.max_val)
        (-1.0, 2.0)
    """

    def min_max(self, low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Elementwise minimum of ``low`` and maximum of ``high`` over the peers."""
        ...

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of ``values`` over the peers."""
        ...


class ObserverBase(torch.nn.Module):
    """Base of every observer: ``forward`` records, ``calculate_qparams`` answers.

    Args:
        dtype: the dtype the observed tensor is quantized to (or kept in, for placeholders).
        is_dynamic: True when the quantization parameters are chosen at run time.

    Example:
        >>> class CountingObserver(ObserverBase):
        ...     def forward(self, x):
        ...         return x
        >>> CountingObserver(torch.uint8).dtype
        torch.uint8
    """

    # set by fxquant_distributed while observing global batches; a class default so that
    # observers unpickled from before it existed read None
    _batch_reducer: BatchReducer | None = None
    # class defaults: observers unpickled from before these existed read them
    nonfinite_count: int = 0
    """How many non-finite values (NaN, inf) this observer has left out of its statistics."""
    _fxquant_name: str | None = None  # where prepare put it, for messages
    batch_peaks: tuple[float, float] = (0.0, 0.0)
    """The two largest per-batch peaks (max ``|value|``, finite values only) observed: the
    first far above the second says one batch set the range (convert warns)."""
    observed_in_training: bool = False
    """Whether this observer recorded a batch while in training mode. In a prepared model
    observers follow the model's mode, so this says calibration ran with dropout and
    BatchNorm computing training-mode values (convert warns)."""

    def __init__(self, dtype: torch.dtype, is_dynamic: bool = False) -> None:
        super().__init__()
        self.dtype = dtype
        self.is_dynamic = is_dynamic

    def _note_nonfinite(self, count: int, numel: int) -> None:
        """Count ``count`` ignored non-finite values; warn on the first ones only."""
        if count == 0:
            return
        first = self.nonfinite_count == 0
        self.nonfinite_count = self.nonfinite_count + count
        if first:
            where = self._fxquant_name or f"{type(self).__name__} (not in a prepared model)"
            msg = (
                f"observer {where} ignored {count} non-finite value(s) (NaN or inf) of a batch "
                f"of {numel}: they are left out of its range, and a batch with no finite value "
                "leaves it unchanged. Check the calibration data (or the weights); later "
                "non-finite values are ignored without a warning (their total is in the "
                "observer's nonfinite_count)"
            )
            warnings.warn(msg, CalibrationWarning, stacklevel=2)

    def _forget_batches(self) -> None:
        """Forget what the recorded batches said beyond the range (peaks, training mode)."""
        self.batch_peaks = (0.0, 0.0)
        self.observed_in_training = False

    def _note_peak(self, low: torch.Tensor, high: torch.Tensor) -> None:
        """Fold one batch's (finite) min and max into :attr:`batch_peaks`; note the mode."""
        if self.training:
            self.observed_in_training = True
        # a channel without finite values holds inf and -inf: 0 stands in for them, and a peak
        # of 0 leaves batch_peaks (which are >= 0) as they are
        peak = float(torch.stack([low.detach(), high.detach()]).abs().nan_to_num(posinf=0.0).amax())
        first, second = self.batch_peaks
        self.batch_peaks = (peak, first) if peak >= first else (first, max(second, peak))

    def _batch_min_max(
        self, x: torch.Tensor, dtype: torch.dtype, ch_axis: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``x``'s min and max (per slice along ``ch_axis``) over its finite values, over
        every peer's batch when a reducer is set; None when there is nothing to fold in.

        A slice without finite values gets ``inf``/``-inf`` (the reductions' neutral
        elements), which the folds below leave out."""
        reducer = self._batch_reducer
        if x.numel() == 0 and reducer is None:
            return None
        x = x.detach().to(dtype)
        if x.numel() == 0:
            # an empty batch still takes part in the peers' reduction, as the neutral element
            shape = () if ch_axis is None else (x.shape[ch_axis],)
            low = torch.full(shape, float("inf"), dtype=dtype, device=x.device)
            high = torch.full(shape, float("-inf"), dtype=dtype, device=x.device)
        else:
            low, high = _min_max(x, ch_axis)
            # min and max carry any NaN or inf of the batch: the fast path tests just them
            # (one tiny op, no second pass over x); only a poisoned batch is filtered
            if not _all_finite(low, high):
                # the slow path: the min and max of the finite values, inf and -inf (per
                # slice) where there is none
                finite = torch.isfinite(x)
                self._note_nonfinite(int(x.numel() - int(finite.sum())), x.numel())
                inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
                low = _min_max(torch.where(finite, x, inf), ch_axis)[0]
                high = _min_max(torch.where(finite, x, -inf), ch_axis)[1]
                if reducer is None and ch_axis is None and bool(low > high):
                    return None  # nothing finite in the batch: the observer stays as it was
        if reducer is not None:
            low, high = reducer.min_max(low, high)
            if low.numel() == 0 or bool(torch.all(low > high)):
                return None  # no peer saw data
        self._note_peak(low, high)
        return low, high

    @classmethod
    def with_args(cls, **kwargs: Any) -> ModuleFactory:
        """A factory building this observer with ``kwargs`` bound (comparable, JSON-able).

        Example:
            >>> MinMaxObserver.with_args(quant_min=0, quant_max=127)().quant_max
            127
        """
        return ModuleFactory(cls, kwargs)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantization parameters ``(scale, zero_point)`` from the recorded statistics."""
        msg = (
            f"{type(self).__name__} computes no quantization parameters; it only carries "
            f"dtype={self.dtype!r} to the converted model. Use an observer such as "
            "MinMaxObserver where scale and zero_point are needed"
        )
        raise ConfigError(msg)


class _PassThrough(ObserverBase):
    """The observers that record nothing: fixed qparams, placeholders, markers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x`` unchanged."""
        return x


_MAX_BINS = 1 << 20


def _integer_range(
    dtype: torch.dtype, reduce_range: bool, quant_min: int | None, quant_max: int | None
) -> tuple[int, int]:
    """``quant_min..quant_max``: the custom range given, which must include 0 and fit ``dtype``,
    else ``dtype``'s full range; ``reduce_range`` halves it (a full range of 8 bits only)."""
    if quant_min is None or quant_max is None:
        if quant_min is not None or quant_max is not None:
            msg = (
                f"quant_min={quant_min!r}, quant_max={quant_max!r}: give both or neither "
                "(neither means the full range of dtype)"
            )
            raise ConfigError(msg)
        low, high = quant_range(dtype)
        if reduce_range and canonical_dtype(dtype) in (torch.uint8, torch.int8):
            return low // 2, high // 2
        return low, high
    if not (quant_min <= 0 <= quant_max and quant_min < quant_max):
        msg = (
            f"quant_min={quant_min!r}, quant_max={quant_max!r}: the range must include 0 "
            "and quant_min must be below quant_max"
        )
        raise ConfigError(msg)
    check_fits(quant_min, quant_max, dtype)
    if not reduce_range:
        return quant_min, quant_max
    halved = (quant_min // 2, quant_max // 2)
    if halved[0] >= halved[1]:
        msg = (
            f"reduce_range=True halves quant_min={quant_min!r}, quant_max={quant_max!r} to "
            f"{halved[0]}..{halved[1]}, which holds one value; widen the range or drop reduce_range"
        )
        raise ConfigError(msg)
    return halved


def _check_dtype(dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        msg = f"dtype must be a torch.dtype such as torch.uint8, got {dtype!r}"
        raise ConfigTypeError(msg)
    if not is_quantized_dtype(dtype):
        msg = (
            f"dtype {dtype!r} cannot be observed for integer quantization; expected "
            "torch.uint8, torch.int8 or torch.int32 (torch.quint8/qint8/qint32 mean the same)"
        )
        raise ConfigError(msg)
    return dtype


class UniformQuantizationObserverBase(ObserverBase):
    """Common base of observers that map a float range onto evenly spaced integers.

    Args:
        dtype: ``torch.uint8`` (default), ``torch.int8``, ``torch.int32``; the
            ``torch.quint8``-style names are accepted as the same dtypes.
        qscheme: ``per_tensor_affine`` (default), ``per_tensor_symmetric``,
            ``per_channel_affine``, ``per_channel_symmetric`` or
            ``per_channel_affine_float_qparams``, as a torch object or a string.
        reduce_range: halve the integer range (x86 kernels avoid overflow this way).
        quant_min: smallest integer; give it together with ``quant_max``.
        quant_max: largest integer; the custom range must include 0 and fit ``dtype``.
        factory_kwargs: ``device``/``dtype`` for the buffers.
        eps: smallest scale allowed.
        is_dynamic: quantization parameters are chosen at run time.

    Raises:
        ConfigError: unknown qscheme or dtype, or a custom range that is empty,
            excludes 0 or does not fit ``dtype``.

    Example:
        >>> obs = MinMaxObserver(dtype=torch.int8, quant_min=-127, quant_max=127)
        >>> obs.quant_min, obs.quant_max, obs.has_customized_qrange
        (-127, 127, True)
    """

    # 3 is torch.ao's observer state-dict version: state dicts move between the two
    _version = 3

    eps: torch.Tensor

    def __init__(  # noqa: PLR0913, PLR0917  # torch.ao's constructor signature, kept for users
        self,
        dtype: torch.dtype = torch.uint8,
        qscheme: object = "per_tensor_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
    ) -> None:
        owner = type(self).__name__
        qscheme_name(qscheme)  # validates before anything is stored
        check_real(eps, f"{owner} eps", positive=True)
        check_flag(reduce_range, f"{owner} reduce_range")
        check_integer(quant_min, f"{owner} quant_min", optional=True)
        check_integer(quant_max, f"{owner} quant_max", optional=True)
        if factory_kwargs is not None and not isinstance(factory_kwargs, Mapping):
            msg = (
                f"{owner} factory_kwargs={factory_kwargs!r}: expected a dict of tensor options "
                f"(device, dtype) or None, got {type(factory_kwargs).__name__}"
            )
            raise ConfigTypeError(msg)
        super().__init__(dtype=_check_dtype(dtype), is_dynamic=is_dynamic)
        self.qscheme = qscheme_object(qscheme)
        self.reduce_range = reduce_range
        tensor_options = dict(factory_kwargs or {})
        self.register_buffer("eps", torch.tensor([eps], **tensor_options))
        self.has_customized_qrange = quant_min is not None and quant_max is not None
        self.quant_min, self.quant_max = _integer_range(dtype, reduce_range, quant_min, quant_max)
        self._init_state(tensor_options)

    def _init_state(self, factory_kwargs: dict[str, Any]) -> None:
        """Register the statistics' buffers (on ``factory_kwargs``' device and dtype) and check
        what they depend on: the last step of ``__init__``, for subclasses to fill in."""

    def _calculate_qparams(
        self, min_val: torch.Tensor, max_val: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)`` for the range ``[min_val, max_val]`` (per tensor or channel).

        An observer that saw no data (per channel: no finite value in any channel) gets
        ``scale=1.0, zero_point=0``, and so does each channel that saw none.
        """
        nothing = min_val.numel() == 0 or max_val.numel() == 0
        empty = None if nothing else (min_val == float("inf")) & (max_val == float("-inf"))
        if empty is None or bool(empty.all()):
            device = min_val.device.type
            return torch.tensor([1.0], device=device), torch.tensor([0], device=device)
        if bool(torch.any((min_val > max_val) & ~empty)):
            msg = f"observer range is inverted: min_val={min_val} > max_val={max_val}"
            raise ConfigError(msg)
        if min_val.dim() == 0:
            return self._range_qparams(min_val, max_val)
        scale, zero_point = self._range_qparams(
            torch.where(empty, 0.0, min_val), torch.where(empty, 0.0, max_val)
        )
        return torch.where(empty, 1.0, scale), torch.where(empty, 0, zero_point)

    def _range_qparams(
        self, min_val: torch.Tensor, max_val: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        name = qscheme_name(self.qscheme)
        steps = float(self.quant_max - self.quant_min)
        if name == "per_channel_affine_float_qparams":
            scale = (max_val - min_val) / steps
            scale = torch.where(scale > self.eps, scale, torch.ones_like(scale))
            # a float zero point makes q = round((x - min) / scale): no rounding of the offset
            found = scale, -1 * min_val / scale
        else:
            # the range is widened to include 0 so that 0.0 is exactly representable
            min_neg = torch.min(min_val, torch.zeros_like(min_val))
            max_pos = torch.max(max_val, torch.zeros_like(max_val))
            if is_symmetric(name):
                found = self._symmetric_qparams(min_neg, max_pos)
            else:
                scale = torch.max((max_pos - min_neg) / steps, self.eps)
                zero_point = self.quant_min - torch.round(min_neg / scale).to(torch.int)
                found = scale, torch.clamp(zero_point, self.quant_min, self.quant_max)
        if min_val.dim() == 0:  # per-tensor results are shaped [1], like FakeQuantize's buffers
            return found[0].reshape(1), found[1].reshape(1)
        return found

    def _symmetric_qparams(
        self, min_neg: torch.Tensor, max_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bound = torch.max(-min_neg, max_pos)
        scale = torch.max(bound / (float(self.quant_max - self.quant_min) / 2), self.eps)
        zero_point = torch.zeros(min_neg.size(), dtype=torch.int64, device=min_neg.device)
        plain = canonical_dtype(self.dtype)
        if plain == torch.uint8:
            # unsigned symmetric puts 0.0 mid-range: 128, or the custom range's floored midpoint
            middle = (self.quant_min + self.quant_max) // 2 if self.has_customized_qrange else 128
            zero_point.fill_(middle)
        elif plain == getattr(torch, "uint16", None):
            zero_point.fill_(2**15)
        return scale, zero_point

    def reset_min_max_vals(self) -> None:
        """Forget the recorded range (the next batch starts afresh)."""
        msg = f"{type(self).__name__} keeps no min/max values to reset"
        raise ConfigError(msg)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], *rest: Any
    ) -> None:
        if local_metadata.get("version") in (None, 1):
            # state dicts older than version 2 had no eps buffer
            state_dict.setdefault(prefix + "eps", torch.tensor([FLOAT32_EPS]))
        take_saved_shapes(self, state_dict, prefix, ("min_val", "max_val"))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *rest)


def _all_finite(low: torch.Tensor, high: torch.Tensor) -> bool:
    """Whether a batch's min and max (so the whole batch) are finite: the fast path.

    Python floats for a 0-d pair: 2.5 us where ``torch.isfinite(...).all()`` takes ~100 us
    on a loaded CPU, and a full ``torch.isfinite(x).all()`` pass ~12x an amin + amax.
    Per channel, the sum of the ranges is finite unless one is not (or it overflows:
    then the slow path finds nothing to drop and computes the same range).
    """
    if low.dim() == 0:
        return math.isfinite(float(low)) and math.isfinite(float(high))
    return math.isfinite(float((high - low).sum()))


def is_calibrated(observer: torch.nn.Module) -> bool:
    """Whether ``observer`` (or a fake-quantize's observer) holds a range to quantize with.

    False for an observer whose min/max statistics are still those of a fresh
    observer (it saw no data, or no finite value), or are not finite (a state dict
    saved by an older version); observers that compute their qparams without
    statistics (fixed qparams, placeholders, dynamic ones) are always calibrated.
    ``convert_fx`` keeps the nodes of uncalibrated activation observers float.

    Example:
        >>> obs = MinMaxObserver()
        >>> is_calibrated(obs)
        False
        >>> _ = obs(torch.tensor([0.0, 1.0])); is_calibrated(obs)
        True
    """
    inner = getattr(observer, "activation_post_process", observer)
    if getattr(inner, "is_dynamic", False) or getattr(observer, "is_dynamic", False):
        return True
    min_val = getattr(inner, "min_val", None)
    max_val = getattr(inner, "max_val", None)
    if not isinstance(min_val, torch.Tensor) or not isinstance(max_val, torch.Tensor):
        return True  # fixed qparams, placeholders, recorders: nothing to calibrate
    seen = min_val <= max_val  # empty for a per-channel observer that saw no batch
    return (
        bool(seen.any())
        and bool(torch.isfinite(min_val[seen]).all())
        and bool(torch.isfinite(max_val[seen]).all())
    )


class _RunningRange(UniformQuantizationObserverBase):
    """The min/max observers' round: measure a batch, fold it into ``min_val``/``max_val``.

    Per tensor (``_PER_CHANNEL`` False) the buffers are 0-d, ``inf`` and ``-inf`` while
    nothing is recorded; per channel they are empty until the first batch, which is stored as
    the range (it tells how many channels there are). Every other batch goes through
    :meth:`_fold`, which subclasses with another fold (moving averages) override.
    """

    _PER_CHANNEL: ClassVar[bool] = False
    ch_axis: int  # per channel only
    min_val: torch.Tensor
    max_val: torch.Tensor

    def _init_state(self, factory_kwargs: dict[str, Any]) -> None:
        owner = type(self).__name__
        _require_granularity(owner, self.qscheme, per_channel=self._PER_CHANNEL)
        if self._PER_CHANNEL and self.is_dynamic:
            msg = f"{owner} does not support is_dynamic=True; use a per-tensor observer"
            raise ConfigError(msg)
        if (
            is_symmetric(self.qscheme)
            and self.reduce_range
            and dtypes_match(self.dtype, torch.uint8)
        ):
            msg = (
                f"reduce_range=True with qscheme={qscheme_name(self.qscheme)!r} and dtype "
                f"{self.dtype!r} is not supported; use dtype=torch.int8 or reduce_range=False"
            )
            raise ConfigError(msg)
        low, high = self._nothing_recorded(factory_kwargs)
        self.register_buffer("min_val", low)
        self.register_buffer("max_val", high)

    def _nothing_recorded(
        self, factory_kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._PER_CHANNEL:
            return torch.tensor([], **factory_kwargs), torch.tensor([], **factory_kwargs)
        low = torch.tensor(float("inf"), **factory_kwargs)
        return low, torch.tensor(float("-inf"), **factory_kwargs)

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Fold ``x``'s min and max (per channel for per-channel observers) in; return ``x``."""
        ch_axis = self.ch_axis if self._PER_CHANNEL else None
        found = self._batch_min_max(x_orig, self.min_val.dtype, ch_axis)
        if found is not None and (self.min_val.numel() == 0 or self.max_val.numel() == 0):
            self._store(*found)  # per channel, the first batch is the range (and the channels)
        elif found is not None:
            self._fold(*found)
        return x_orig

    def _store(self, new_min: torch.Tensor, new_max: torch.Tensor) -> None:
        self.min_val.resize_(new_min.shape).copy_(new_min)
        self.max_val.resize_(new_max.shape).copy_(new_max)

    def _fold(self, batch_min: torch.Tensor, batch_max: torch.Tensor) -> None:
        """Widen the recorded range to cover the batch's (per channel: channel by channel)."""
        self._store(torch.min(batch_min, self.min_val), torch.max(batch_max, self.max_val))

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)``: shape ``[1]`` per tensor, one entry per channel otherwise."""
        return self._calculate_qparams(self.min_val, self.max_val)

    def reset_min_max_vals(self) -> None:
        """Forget the recorded range (per channel, the channel count too)."""
        self._store(*self._nothing_recorded({}))
        self._forget_batches()

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class _MovingAverage(_RunningRange):
    """The moving-average fold, per tensor or per channel.

    ``min_val += averaging_constant * (batch_min - min_val)`` (likewise ``max_val``); a
    range (or channel) with nothing recorded yet starts from the batch, and a channel
    without finite values in this batch keeps its average: ``inf`` never enters it.
    """

    averaging_constant: float

    def _fold(self, batch_min: torch.Tensor, batch_max: torch.Tensor) -> None:
        c = self.averaging_constant
        new_min = self.min_val + c * (batch_min - self.min_val)
        new_max = self.max_val + c * (batch_max - self.max_val)
        seen, got = self.min_val <= self.max_val, batch_min <= batch_max
        if not bool((seen & got).all()):
            new_min = torch.where(got, torch.where(seen, new_min, batch_min), self.min_val)
            new_max = torch.where(got, torch.where(seen, new_max, batch_max), self.max_val)
        self._store(new_min, new_max)


class MinMaxObserver(_RunningRange):
    """Per-tensor observer of the running minimum and maximum.

    ``scale = (max(max_val, 0) - min(min_val, 0)) / (quant_max - quant_min)`` (affine) or
    ``max(|min_val|, max_val) / ((quant_max - quant_min) / 2)`` (symmetric), never below ``eps``.

    Args: see :class:`UniformQuantizationObserverBase` (qscheme must be per tensor).

    Example:
        >>> obs = MinMaxObserver()
        >>> _ = obs(torch.tensor([-1.0, 3.0]))
        >>> obs.calculate_qparams()
        (tensor([0.0157]), tensor([64], dtype=torch.int32))
    """


def _require_granularity(owner: str, qscheme: object, per_channel: bool) -> None:
    """Refuse a per-channel qscheme for a per-tensor observer, and the reverse."""
    if is_per_channel(qscheme) == per_channel:
        return
    wanted, other = ("per-channel", "per-tensor") if per_channel else ("per-tensor", "per-channel")
    advice = "MinMaxObserver" if per_channel else "PerChannelMinMaxObserver"
    msg = (
        f"{owner} supports {wanted} qschemes only, got {qscheme!r}; "
        f"use {advice} for {other} quantization"
    )
    raise ConfigError(msg)


class MovingAverageMinMaxObserver(_MovingAverage, MinMaxObserver):
    """Per-tensor observer of an exponential moving average of each batch's min and max.

    After the first batch, ``min_val += averaging_constant * (batch_min - min_val)``
    (likewise ``max_val``); qparams are computed as in :class:`MinMaxObserver`.

    Args:
        averaging_constant: weight of the newest batch; 1 keeps only the last batch.
        dtype: see :class:`UniformQuantizationObserverBase` for this and the rest.
        qscheme: per-tensor qscheme.
        reduce_range: halve the integer range.
        quant_min: custom smallest integer.
        quant_max: custom largest integer.
        eps: smallest scale.
        is_dynamic: only with ``averaging_constant=1``.

    Example:
        >>> obs = MovingAverageMinMaxObserver(averaging_constant=0.5)
        >>> _ = obs(torch.tensor([0.0, 2.0]))
        >>> _ = obs(torch.tensor([0.0, 4.0]))
        >>> float(obs.max_val)
        3.0
    """

    def __init__(  # noqa: PLR0913, PLR0917  # torch.ao's constructor signature, kept for users
        self,
        averaging_constant: float = 0.01,
        dtype: torch.dtype = torch.uint8,
        qscheme: object = "per_tensor_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        factory_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        check_unit_interval(averaging_constant, f"{type(self).__name__} averaging_constant")
        if is_dynamic and averaging_constant != 1:
            msg = (
                f"MovingAverageMinMaxObserver with is_dynamic=True needs averaging_constant=1, "
                f"got {averaging_constant!r}"
            )
            raise ConfigError(msg)
        super().__init__(
            dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic
        )
        self.averaging_constant = averaging_constant


def _min_max(x: torch.Tensor, ch_axis: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max of ``x``, or of each slice along ``ch_axis``.

    Both are exact, so the order of the other dims does not matter. ``amin`` + ``amax``, not
    ``aminmax``: in torch 2.13 on CPU they take 0.6x its time per tensor (one 1024x3072
    activation: 269 vs 432 us) and per channel ``aminmax(dim=1)`` is ~20x slower (a
    512x4608 conv weight: 5.1 ms vs 0.23 ms), which made per-channel weight observation a
    large part of convert_fx.
    """
    if ch_axis is None:
        return torch.amin(x), torch.amax(x)
    rows = x.movedim(ch_axis, 0).reshape(x.shape[ch_axis], -1)
    return torch.amin(rows, dim=1), torch.amax(rows, dim=1)


class PerChannelMinMaxObserver(_RunningRange):
    """Observer of the running min and max of every slice along ``ch_axis`` (weights).

    Args:
        ch_axis: the channel axis (0 for Linear/Conv weights).
        dtype: see :class:`UniformQuantizationObserverBase` for this and the rest.
        qscheme: a per-channel qscheme (``per_channel_affine`` by default).
        reduce_range: halve the integer range.
        quant_min: custom smallest integer.
        quant_max: custom largest integer.
        factory_kwargs: device/dtype of the buffers.
        eps: smallest scale.
        is_dynamic: must be False.

    Example:
        >>> obs = PerChannelMinMaxObserver(dtype=torch.int8, qscheme="per_channel_symmetric")
        >>> _ = obs(torch.tensor([[1.0, -2.0], [0.5, 0.25]]))
        >>> obs.calculate_qparams()[0]
        tensor([0.0157, 0.0039])
    """

    _PER_CHANNEL = True

    def __init__(  # noqa: PLR0913, PLR0917  # torch.ao's constructor signature, kept for users
        self,
        ch_axis: int = 0,
        dtype: torch.dtype = torch.uint8,
        qscheme: object = "per_channel_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
    ) -> None:
        check_integer(ch_axis, f"{type(self).__name__} ch_axis")
        super().__init__(
            dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic
        )
        self.ch_axis = ch_axis


class MovingAveragePerChannelMinMaxObserver(_MovingAverage, PerChannelMinMaxObserver):
    """Per-channel observer of moving averages of each batch's channel min and max.

    Args:
        averaging_constant: weight of the newest batch; 1 keeps only the last batch.
        ch_axis: the channel axis.
        dtype: see :class:`UniformQuantizationObserverBase` for this and the rest.
        qscheme: a per-channel qscheme.
        reduce_range: halve the integer range.
        quant_min: custom smallest integer.
        quant_max: custom largest integer.
        eps: smallest scale.
        is_dynamic: must be False.

    Example:
        >>> obs = MovingAveragePerChannelMinMaxObserver(averaging_constant=0.5)
        >>> _ = obs(torch.tensor([[0.0, 2.0]]))
        >>> _ = obs(torch.tensor([[0.0, 4.0]]))
        >>> obs.max_val
        tensor([3.])
    """

    def __init__(  # noqa: PLR0913, PLR0917  # torch.ao's constructor signature, kept for users
        self,
        averaging_constant: float = 0.01,
        ch_axis: int = 0,
        dtype: torch.dtype = torch.uint8,
        qscheme: object = "per_channel_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
        factory_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        check_unit_interval(averaging_constant, f"{type(self).__name__} averaging_constant")
        super().__init__(
            ch_axis,
            dtype,
            qscheme,
            reduce_range,
            quant_min,
            quant_max,
            factory_kwargs,
            eps,
            is_dynamic,
        )
        self.averaging_constant = averaging_constant


class FixedQParamsObserver(_PassThrough):
    """Observer whose scale and zero point are fixed up front (sigmoid, tanh, ...).

    Args:
        scale: the fixed scale.
        zero_point: the fixed zero point.
        dtype: quantized dtype.
        qscheme: a per-tensor qscheme.
        quant_min: smallest integer.
        quant_max: largest integer.
        is_dynamic: must be False.

    Example:
        >>> obs = FixedQParamsObserver(scale=1.0 / 256.0, zero_point=0)
        >>> obs.calculate_qparams()
        (tensor([0.0039]), tensor([0], dtype=torch.int32))
    """

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(  # noqa: PLR0913, PLR0917  # torch.ao's constructor signature, kept for users
        self,
        scale: float,
        zero_point: int,
        dtype: torch.dtype = torch.uint8,
        qscheme: object = "per_tensor_affine",
        quant_min: int = 0,
        quant_max: int = 255,
        is_dynamic: bool = False,
    ) -> None:
        if is_dynamic:
            msg = "FixedQParamsObserver does not support is_dynamic=True: its qparams are fixed"
            raise ConfigError(msg)
        _require_granularity("FixedQParamsObserver", qscheme, per_channel=False)
        check_real(scale, "FixedQParamsObserver scale", positive=True)
        check_integer(zero_point, "FixedQParamsObserver zero_point")
        check_integer(quant_min, "FixedQParamsObserver quant_min")
        check_integer(quant_max, "FixedQParamsObserver quant_max")
        super().__init__(dtype=_check_dtype(dtype), is_dynamic=False)
        _integer_range(dtype, False, quant_min, quant_max)
        if not quant_min <= zero_point <= quant_max:
            msg = (
                f"FixedQParamsObserver zero_point={zero_point!r}: expected an integer in "
                f"quant_min..quant_max ({quant_min}..{quant_max})"
            )
            raise ConfigError(msg)
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.qscheme = qscheme_object(qscheme)
        self.register_buffer("scale", torch.tensor([scale], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([zero_point], dtype=torch.int))

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed ``(scale, zero_point)`` buffers."""
        return self.scale, self.zero_point


class PlaceholderObserver(_PassThrough):
    """Records nothing; carries the dtype (float16, or a dynamic quantization config).

    Args:
        dtype: the target dtype (``torch.float32`` by default, ``torch.float16``, ``torch.uint8``).
        custom_op_name: kept for torch.ao compatibility.
        compute_dtype: deprecated spelling of ``is_dynamic=True`` (any value sets it).
        quant_min: smallest integer, for dynamic quantization.
        quant_max: largest integer, for dynamic quantization.
        qscheme: qscheme, ``per_tensor_affine`` by default.
        eps: smallest scale, float32 eps by default.
        is_dynamic: quantize at run time with qparams computed from each input.

    Example:
        >>> obs = PlaceholderObserver(torch.uint8, quant_min=0, quant_max=255, is_dynamic=True)
        >>> obs.is_dynamic, obs.quant_max
        (True, 255)
    """

    def __init__(  # noqa: PLR0913, PLR0917  # torch.ao's constructor signature, kept for users
        self,
        dtype: torch.dtype = torch.float32,
        custom_op_name: str = "",
        compute_dtype: torch.dtype | None = None,
        quant_min: int | None = None,
        quant_max: int | None = None,
        qscheme: object = None,
        eps: float | None = None,
        is_dynamic: bool = False,
    ) -> None:
        super().__init__(dtype=dtype, is_dynamic=is_dynamic or compute_dtype is not None)
        self.qscheme = qscheme_object("per_tensor_affine" if qscheme is None else qscheme)
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.eps = FLOAT32_EPS if eps is None else eps
        self.custom_op = custom_op_name

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, is_dynamic={self.is_dynamic}"


class PerTokenObserver(_PassThrough):
    """Records nothing; marks an input for dynamic per-token quantization.

    What :class:`PlaceholderObserver` with ``is_dynamic=True`` is for dynamic
    per-tensor quantization, this is for per-token: at run time each token (row
    over the last dimension) gets its own asymmetric scale and zero point
    (``fxquant.numerics.qdq.choose_qparams_per_token_asymmetric``), as XNNPACK's dynamic
    fully-connected kernels quantize their int8 input. Convert writes
    ``choose_qparams_per_token_asymmetric -> quantize_per_token ->
    dequantize_per_token`` in its place. There is nothing to calibrate.

    Args:
        dtype: the integer dtype of the tokens (``torch.int8``).
        quant_min: smallest integer (the dtype's, ``-128``, by default; the per-token
            ops use the dtype's full range).
        quant_max: largest integer (``127`` by default).
        eps: smallest scale, float32 eps by default.
        is_dynamic: must be True (kept for torch.ao-style ``with_args`` calls).

    Raises:
        ConfigError: ``is_dynamic=False``, or a range that is not the dtype's full range.

    Example:
        >>> obs = PerTokenObserver()
        >>> obs.is_dynamic, obs.is_per_token, obs.quant_min, obs.quant_max
        (True, True, -128, 127)
    """

    is_per_token = True
    """Read by convert: write the per-token quantize/dequantize steps for this observer."""

    def __init__(
        self,
        dtype: torch.dtype = torch.int8,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float | None = None,
        is_dynamic: bool = True,
    ) -> None:
        plain = canonical_dtype(_check_dtype(dtype))
        if not is_dynamic:
            msg = (
                "PerTokenObserver(is_dynamic=False): per-token qparams are chosen at run time; "
                "use a static observer (HistogramObserver, MinMaxObserver) for static inputs"
            )
            raise ConfigError(msg)
        low, high = quant_range(plain)
        if (quant_min, quant_max) not in ((None, None), (low, high)):
            msg = (
                f"PerTokenObserver(quant_min={quant_min!r}, quant_max={quant_max!r}): the "
                f"per-token ops use the full range of {plain} ({low}..{high}); leave both unset"
            )
            raise ConfigError(msg)
        super().__init__(dtype=plain, is_dynamic=True)
        self.qscheme = torch.per_tensor_affine  # per token: asymmetric, one grid per row
        self.quant_min, self.quant_max = low, high
        self.eps = FLOAT32_EPS if eps is None else eps

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, per_token=True"


class RecordingObserver(ObserverBase):
    """Debug observer keeping a copy of every tensor it sees in ``tensor_val``.

    Example:
        >>> obs = RecordingObserver()
        >>> _ = obs(torch.ones(2))
        >>> obs.get_tensor_value()
        [tensor([1., 1.])]
    """

    def __init__(self, dtype: torch.dtype = torch.uint8) -> None:
        super().__init__(dtype=dtype, is_dynamic=False)
        self.tensor_val: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Store a copy of ``x``; return ``x``."""
        self.tensor_val.append(x.clone())
        return x

    def get_tensor_value(self) -> list[torch.Tensor]:
        """Every tensor recorded so far, oldest first."""
        return self.tensor_val


class NoopObserver(_PassThrough):
    """Records nothing; carries a dtype (``torch.float16`` by default).

    Example:
        >>> NoopObserver()(torch.ones(1))
        tensor([1.])
    """

    def __init__(self, dtype: torch.dtype = torch.float16, custom_op_name: str = "") -> None:
        super().__init__(dtype=dtype, is_dynamic=False)
        self.custom_op = custom_op_name


class ReuseInputObserver(_PassThrough):
    """Marks an op (reshape, ...) whose output reuses its input's observer (FX flow only).

    Example:
        >>> ReuseInputObserver().dtype
        torch.uint8
    """

    def __init__(self) -> None:
        super().__init__(torch.uint8, is_dynamic=False)


def _cube_integral(begin: torch.Tensor, end: torch.Tensor, density: torch.Tensor) -> torch.Tensor:
    """``density * integral of t**2 from begin to end``: the L2 error of a uniform spread."""
    return density * ((end * end * end - begin * begin * begin) / 3)


class HistogramObserver(UniformQuantizationObserverBase):
    """Per-tensor observer that keeps a histogram and picks the range minimizing L2 error.

    Each batch is binned into ``bins`` bins over the running ``[min_val, max_val]``;
    when the range grows, the old histogram is upsampled (``upsample_rate``) and
    re-binned into the new range. ``calculate_qparams`` then narrows the range
    from both ends, quantile step by quantile step, while the estimated
    quantization error (L2, over ``2**bits`` destination bins) keeps falling,
    and computes qparams for the narrowed range as :class:`MinMaxObserver` does.

    Args:
        bins: number of histogram bins.
        dtype: see :class:`UniformQuantizationObserverBase` for this and the rest.
        qscheme: per-tensor qscheme.
        reduce_range: halve the integer range.
        quant_min: custom smallest integer.
        quant_max: custom largest integer.
        factory_kwargs: device/dtype of the buffers.
        eps: smallest scale.
        is_dynamic: must be False.

    Example:
        >>> obs = HistogramObserver(bins=64)
        >>> _ = obs(torch.linspace(-1.0, 1.0, 1000))
        >>> scale, zero_point = obs.calculate_qparams()
        >>> round(float(scale), 4), int(zero_point)
        (0.0077, 130)
    """

    histogram: torch.Tensor
    min_val: torch.Tensor
    max_val: torch.Tensor

    def __init__(  # noqa: PLR0913, PLR0917  # torch.ao's constructor signature, kept for users
        self,
        bins: int = 2048,
        dtype: torch.dtype = torch.uint8,
        qscheme: object = "per_tensor_affine",
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: Mapping[str, Any] | None = None,
        eps: float = FLOAT32_EPS,
        is_dynamic: bool = False,
    ) -> None:
        _require_granularity("HistogramObserver", qscheme, per_channel=False)
        check_integer(bins, "HistogramObserver bins", minimum=1)
        if bins > _MAX_BINS:  # the histogram is a buffer: 10**12 bins would ask for 4 TB
            msg = f"HistogramObserver bins={bins!r}: expected an integer in 1..{_MAX_BINS}"
            raise ConfigError(msg)
        if is_dynamic:
            msg = "HistogramObserver does not support is_dynamic=True; use PlaceholderObserver"
            raise ConfigError(msg)
        super().__init__(
            dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic
        )
        kwargs = dict(factory_kwargs or {})
        self.bins = bins
        self.register_buffer("histogram", torch.zeros(bins, **kwargs))
        self.register_buffer("min_val", torch.tensor(float("inf"), **kwargs))
        self.register_buffer("max_val", torch.tensor(float("-inf"), **kwargs))
        low, high = quant_range(dtype)
        # the error model spreads over every integer of the dtype, whatever quant_min/max say
        self.dst_nbins = high - low + 1
        self.upsample_rate = 16

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Add ``x`` (NaN and infinities left out) to the histogram; return ``x`` unchanged."""
        # with a reducer the peers agree on the range first: every one then bins onto the same
        # edges, and the sum of their counts is the histogram of the union of their batches
        dropped = self.nonfinite_count
        found = self._batch_min_max(x_orig, x_orig.dtype)
        if found is None:
            return x_orig  # nothing finite to add (here, or at any peer)
        x_min, x_max, x = *found, x_orig.detach()
        if self.nonfinite_count != dropped:
            # histc skips NaN and infinities outside its range, but reads the range off the
            # data when it is 0..0: it must see finite values only
            x = x[torch.isfinite(x)]
        new_min = torch.min(self.min_val, x_min).detach()
        new_max = torch.max(self.max_val, x_max).detach()
        batch = torch.histc(x, self.bins, min=float(new_min), max=float(new_max))
        batch = batch.to(self.histogram.device)
        if self._batch_reducer is not None:
            batch = self._batch_reducer.sum(batch)
        old = self.histogram
        if bool(new_min != self.min_val) or bool(new_max != self.max_val):
            old = self._rebin(self.histogram, self.min_val, self.max_val, new_min, new_max)
        self._set_state(batch + old, new_min, new_max)
        return x_orig

    def _set_state(self, histogram: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> None:
        self.histogram.detach_().resize_(histogram.shape).copy_(histogram)
        self.min_val.detach_().resize_(low.shape).copy_(low)
        self.max_val.detach_().resize_(high.shape).copy_(high)

    def _rebin(
        self,
        histogram: torch.Tensor,
        low: torch.Tensor,
        high: torch.Tensor,
        new_low: torch.Tensor,
        new_high: torch.Tensor,
    ) -> torch.Tensor:
        """Move ``histogram`` over ``[low, high]`` onto ``bins`` bins over the wider range."""
        if bool(low > high):  # nothing recorded yet (inf, -inf): no mass to move
            return torch.zeros_like(histogram)
        if bool(low == high):
            # a single value: all its mass goes to the bin that value falls in
            point = torch.histc(low, bins=self.bins, min=float(new_low), max=float(new_high))
            return point * torch.sum(histogram)
        rate = self.upsample_rate
        fine = histogram.repeat_interleave(rate) / rate
        fine_width = (high - low) / (self.bins * rate)
        centers = torch.linspace(low, high, self.bins * rate + 1, device=low.device)[:-1]
        centers = centers.to(histogram.device) + 0.5 * fine_width
        edges = torch.linspace(new_low, new_high, self.bins + 1, device=new_low.device)
        target = torch.bucketize(centers, edges.to(histogram.device), right=True) - 1
        # rounding can push a center just outside the new range: keep it in the edge bins
        target = target.clamp_(0, self.bins - 1)
        return torch.bincount(target, weights=fine, minlength=self.bins)

    def _l2_error(self, start: int, end: int) -> float:
        """Estimated L2 quantization error when bins ``start..end`` become the range.

        A search evaluates a handful of candidates (it stops at the first that does worse):
        the bin width and density are recomputed for each, at no measurable cost.
        """
        bin_width = (self.max_val.item() - self.min_val.item()) / self.bins
        dst_width = bin_width * (end - start + 1) / self.dst_nbins
        if dst_width == 0.0:
            return 0.0
        density = self.histogram / bin_width
        src_begin = (torch.arange(self.bins, device=self.histogram.device) - start) * bin_width
        src_end = src_begin + bin_width
        last = self.dst_nbins - 1
        dst_of_begin = torch.div(src_begin, dst_width, rounding_mode="floor").clamp_(0, last)
        dst_of_end = torch.div(src_end, dst_width, rounding_mode="floor").clamp_(0, last)
        half = dst_width / 2
        # float32 0-d bounds broadcast over the bins: the values a float32 vector would hold
        plus, minus = torch.tensor(half), torch.tensor(-half)
        # a source bin spans: the tail of one destination bin, whole bins, the head of another
        head = src_begin - (dst_of_begin + 0.5) * dst_width
        norm = _cube_integral(head, plus, density)
        whole = _cube_integral(minus, plus, density)
        norm += (dst_of_end - dst_of_begin - 1) * whole
        tail = src_end - (dst_of_end * dst_width + half)
        norm += _cube_integral(minus, tail, density)
        return float(norm.sum().item())

    def _search_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Narrow ``[min_val, max_val]`` to the bins whose range minimizes :meth:`_l2_error`."""
        total = float(torch.sum(self.histogram).item())
        cumulative = torch.cumsum(self.histogram, dim=0).tolist()
        step = 1e-5  # quantile granularity
        alpha, beta = 0.0, 1.0
        start, end = 0, self.bins - 1
        best = float("inf")
        while alpha < beta:
            next_alpha, next_beta = alpha + step, beta - step
            low_mass = float32_value(next_alpha * total)
            high_mass = float32_value(next_beta * total)
            # the first bin from start (at most end) whose cumulative mass reaches low_mass, and
            # the last one down to start that stays within high_mass (the counts are >= 0)
            left = bisect.bisect_left(cumulative, low_mass, start, end)
            right = bisect.bisect_right(cumulative, high_mass, start + 1, end + 1) - 1
            # cut from the side that would drop more bins
            if left - start > end - right:
                candidate, alpha = (left, end), next_alpha
            else:
                candidate, beta = (start, right), next_beta
            if candidate == (start, end):
                continue
            error = self._l2_error(*candidate)
            if error > best:
                break
            best = error
            start, end = candidate
        width = (self.max_val - self.min_val) / self.bins  # as a tensor: the qparams' dtype
        return self.min_val + width * start, self.min_val + width * (end + 1)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)`` of shape ``[1]`` for the error-minimizing range."""
        if bool(self.min_val == float("inf")) and bool(self.max_val == float("-inf")):
            # no data: the range's qparams are those of any observer that saw none
            return self._calculate_qparams(self.min_val, self.max_val)
        if self.histogram.numel() != self.bins:
            msg = (
                f"HistogramObserver has a histogram of {self.histogram.numel()} bins but "
                f"bins={self.bins}; load a state dict saved with the same bins"
            )
            raise ConfigError(msg)
        new_min, new_max = self._search_range()
        return self._calculate_qparams(new_min, new_max)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"

    def reset_min_max_vals(self) -> None:
        """Forget the range and the histogram."""
        self.min_val.fill_(float("inf"))
        self.max_val.fill_(float("-inf"))
        self.histogram.zero_()
        self._forget_batches()


default_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127)
"""Static activation observer (uint8, 0..127 leaves headroom on x86)."""

default_placeholder_observer = PlaceholderObserver
"""Placeholder for float16 quantization."""

default_debug_observer = RecordingObserver
"""Records every tensor, for debugging."""

default_weight_observer = MinMaxObserver.with_args(dtype=torch.int8, qscheme="per_tensor_symmetric")
"""Weight observer: int8, symmetric per tensor."""


def _neg_127_to_127(observer: type[ObserverBase], qscheme: str) -> ModuleFactory:
    """``observer`` of symmetric int8 weights in -127..127 (XNNPACK's requirement), eps 2**-12."""
    return observer.with_args(
        dtype=torch.int8, qscheme=qscheme, quant_min=-127, quant_max=127, eps=2**-12
    )


weight_observer_range_neg_127_to_127 = _neg_127_to_127(MinMaxObserver, "per_tensor_symmetric")
"""Weight observer restricted to -127..127 (XNNPACK's requirement), eps 2**-12."""

default_histogram_observer = HistogramObserver.with_args(quant_min=0, quant_max=127)
"""Histogram activation observer for post-training quantization."""

default_per_channel_weight_observer = PerChannelMinMaxObserver.with_args(
    dtype=torch.int8, qscheme="per_channel_symmetric"
)
"""Weight observer: int8, symmetric per output channel."""

per_channel_weight_observer_range_neg_127_to_127 = _neg_127_to_127(
    PerChannelMinMaxObserver, "per_channel_symmetric"
)
"""Per-channel weight observer restricted to -127..127, eps 2**-12."""

default_dynamic_quant_observer = PlaceholderObserver.with_args(
    dtype=torch.uint8, quant_min=0, quant_max=255, is_dynamic=True
)
"""Dynamic quantization: uint8 qparams chosen from each input at run time."""

default_float_qparams_observer = PerChannelMinMaxObserver.with_args(
    dtype=torch.uint8, qscheme="per_channel_affine_float_qparams", ch_axis=0
)
"""Embedding weights: per-row uint8 with float zero points."""

default_fixed_qparams_range_neg1to1_observer = FixedQParamsObserver.with_args(
    scale=2.0 / 256.0, zero_point=128, dtype=torch.uint8, quant_min=0, quant_max=255
)
"""Fixed qparams for outputs in [-1, 1] (tanh)."""

default_fixed_qparams_range_0to1_observer = FixedQParamsObserver.with_args(
    scale=1.0 / 256.0, zero_point=0, dtype=torch.uint8, quant_min=0, quant_max=255
)
"""Fixed qparams for outputs in [0, 1] (sigmoid, softmax)."""

default_symmetric_fixed_qparams_observer = default_fixed_qparams_range_neg1to1_observer
"""Older name of :data:`default_fixed_qparams_range_neg1to1_observer`."""

default_affine_fixed_qparams_observer = default_fixed_qparams_range_0to1_observer
"""Older name of :data:`default_fixed_qparams_range_0to1_observer`."""

default_reuse_input_observer = ReuseInputObserver
"""For ops like reshape that reuse their input's observer."""
