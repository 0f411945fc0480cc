"""Reference quantized modules: the float op run on a quantize->dequantized weight.

``convert_to_reference_fx`` swaps each quantized weighted module for one of
these. The module keeps the float weight and the weight's qparams; its forward
simulates the integer weight exactly, which a backend's lowering then
recognises and replaces with a real kernel:

    before: x -> Linear(w) -> y
    after:  x -> Linear(dequantize(quantize(w, scale, zero_point))) -> y

The qparams are buffers (``weight_scale``, ``weight_zero_point``,
``weight_axis``) plus an extra state (qscheme, dtype, quant range), so
``state_dict`` round-trips, also between per-tensor and per-channel modules.
Integer weights are plain ``uint8``/``int8``/``int32`` tensors made by
``fxquant.numerics.qdq``; no ``torch.quint8`` tensor is ever created.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fxquant import dtypes
from fxquant.errors import ConfigError, ConfigTypeError, wrong_type
from fxquant.nn.float_twin import COPYING_PARAMS, FloatTwin, rebuilt
from fxquant.nn.intrinsic import type_label
from fxquant.nn.qat import Affine, Convolving, Lookup, Pool, root_of

# the recurrent reference modules live in fxquant.nn.recurrent; named here too, where
# the seed's reference namespace has them, so a config naming that class finds fxquant's
from fxquant.nn.recurrent import GRU, LSTM, GRUCell, LSTMCell, RNNCell
from fxquant.numerics import qdq
from fxquant.numerics.saved_shapes import adopt_saved_buffers

__all__ = [
    "GRU",
    "LSTM",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "Embedding",
    "EmbeddingBag",
    "GRUCell",
    "LSTMCell",
    "Linear",
    "RNNCell",
    "ReferenceQuantizedModule",
]

_KEYS = frozenset(
    {"qscheme", "dtype", "scale", "zero_point", "axis", "quant_min", "quant_max", "is_decomposed"}
)
_FLOAT_CAST = frozenset({torch.float16, torch.bfloat16})


def _default_qparams() -> dict[str, Any]:
    # torch.ao's default when no qparams are given: identity-scale quint8
    return {"qscheme": "per_tensor_affine", "dtype": torch.uint8, "scale": 1.0, "zero_point": 0}


def _storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The plain dtype holding the integers (4-bit and 2-bit packed types use uint8)."""
    plain = dtypes.canonical_dtype(dtype)
    return plain if plain in (torch.uint8, torch.int8, torch.int32) else torch.uint8


def _as_tensor(value: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().clone().to(device)
    return torch.tensor(value, dtype=dtype, device=device)


class ReferenceQuantizedModule(nn.Module):
    """Mixin holding a weight's qparams and simulating its quantization.

    A reference module inherits from this and from the float module, e.g.
    ``class Linear(ReferenceQuantizedModule, nn.Linear)``, and calls
    :meth:`get_weight` in its forward.

    ``weight_qparams`` keys: ``qscheme`` (``torch.per_tensor_affine`` or its
    name; ``None`` keeps the weight float), ``dtype`` (``torch.qint8``,
    ``torch.int8``, ``torch.float16``...), ``scale``, ``zero_point``, ``axis``
    (per-channel only), ``quant_min``/``quant_max`` (default: the dtype's
    full range), ``is_decomposed`` (accepted for torch.ao dicts and ignored:
    fxquant always uses its plain-integer ops). Symmetric qschemes are
    accepted and computed like their affine forms with the given qparams.

    Example:
        >>> qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.qint8,
        ...            "scale": 0.1, "zero_point": 0}
        >>> ref = Linear.from_float(nn.Linear(2, 2), qparams)
        >>> ref.get_quantized_weight().dtype
        torch.int8
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    weight_zero_point: torch.Tensor
    weight_axis: torch.Tensor
    weight_qscheme: object
    weight_dtype: torch.dtype
    weight_quant_min: int
    weight_quant_max: int
    weight_axis_int: int

    def reset_parameters(self) -> None:
        """Initialize like the float module, except inside ``from_float`` (which copies them)."""
        if COPYING_PARAMS.get():
            return
        # the float module's reset_parameters, next in the MRO (nn.Module has none)
        getattr(super(), "reset_parameters")()  # noqa: B009

    def _init_weight_qparams(self, weight_qparams: Mapping[str, Any] | None) -> None:
        params = _default_qparams() if weight_qparams is None else weight_qparams
        if not isinstance(params, Mapping):
            raise wrong_type(params, "weight_qparams", "a dict")
        unknown = sorted(set(params) - _KEYS)
        if unknown:
            msg = f"weight_qparams has unknown keys {unknown}; allowed: {sorted(_KEYS)}"
            raise ConfigError(msg)
        for key in ("qscheme", "dtype"):
            if key not in params:
                msg = f"weight_qparams needs the key {key!r}, got keys {sorted(params)}"
                raise ConfigError(msg)
        self._set_scheme(params["qscheme"], params["dtype"], params)
        quantized = self.is_weight_quantized()
        if quantized:
            for key in ("scale", "zero_point", *(("axis",) if self._per_channel() else ())):
                if key not in params:
                    msg = f"weight_qparams for {self.weight_qscheme} needs the key {key!r}"
                    raise ConfigError(msg)
        # an unquantized weight keeps identity qparams, so every reference module has the
        # same buffers (and state_dict keys)
        given = params if quantized else {}
        float_zero_point = quantized and self._scheme_name() == "per_channel_affine_float_qparams"
        zp_dtype = torch.float32 if float_zero_point else torch.int32
        device = self.weight.device
        scale = _as_tensor(given.get("scale", 1.0), torch.float32, device)
        zero_point = _as_tensor(given.get("zero_point", 0), zp_dtype, device).to(zp_dtype)
        axis = _as_tensor(given.get("axis", 0), torch.int32, device)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("weight_zero_point", zero_point)
        self.register_buffer("weight_axis", axis)
        # a Python int as well: reading the buffer in forward would be data-dependent for export
        self.weight_axis_int = int(axis)

    def _set_scheme(self, qscheme: object, dtype: object, params: Mapping[str, Any]) -> None:
        if not isinstance(dtype, torch.dtype):
            msg = f"weight_qparams['dtype'] must be a torch.dtype, got {dtype!r}"
            raise ConfigTypeError(msg)
        self.weight_qscheme = None if qscheme is None else dtypes.qscheme_object(qscheme)
        self.weight_dtype = dtype
        low, high = dtypes.quant_range(dtype) if dtypes.is_quantized_dtype(dtype) else (0, 0)
        quant_min = params.get("quant_min")
        quant_max = params.get("quant_max")
        self.weight_quant_min = low if quant_min is None else int(quant_min)
        self.weight_quant_max = high if quant_max is None else int(quant_max)
        if self.is_weight_quantized() and not (
            low <= self.weight_quant_min <= self.weight_quant_max <= high
        ):
            msg = (
                f"weight_qparams quant_min/quant_max ({quant_min}, {quant_max}) must satisfy "
                f"{low} <= quant_min <= quant_max <= {high} for dtype {dtype}"
            )
            raise ConfigError(msg)

    def _scheme_name(self) -> str | None:
        return None if self.weight_qscheme is None else dtypes.qscheme_name(self.weight_qscheme)

    def _per_channel(self) -> bool:
        return self.weight_qscheme is not None and dtypes.is_per_channel(self.weight_qscheme)

    def is_weight_quantized(self) -> bool:
        """True when the weight is simulated as integers (not float, fp16 or unquantized).

        Example:
            >>> qparams = {"qscheme": None, "dtype": torch.float32}
            >>> Linear.from_float(nn.Linear(2, 2), qparams).is_weight_quantized()
            False
        """
        return self.weight_qscheme is not None and dtypes.is_quantized_dtype(self.weight_dtype)

    def get_quantized_weight(self) -> torch.Tensor:
        """The weight as stored by a quantized kernel: a plain integer tensor.

        For an fp16/bf16 weight this is the weight cast to that dtype; for an
        unquantized weight it is the float weight itself.

        Example:
            >>> qparams = {"qscheme": "per_tensor_affine", "dtype": torch.quint8,
            ...            "scale": 0.5, "zero_point": 10}
            >>> ref = Linear.from_float(nn.Linear(2, 1), qparams)
            >>> ref.get_quantized_weight().dtype
            torch.uint8
        """
        if not self.is_weight_quantized():
            if self.weight_qscheme is not None and self.weight_dtype in _FLOAT_CAST:
                return self.weight.to(self.weight_dtype)
            return self.weight
        quantize = qdq.quantize_per_channel if self._per_channel() else qdq.quantize_per_tensor
        return quantize(self.weight, *self._weight_qparams())

    def _weight_qparams(self) -> tuple[Any, ...]:
        """The q/dq ops' arguments after the tensor: per channel ones carry the axis.

        Tensors, not ``.item()``: the qparams stay graph inputs when traced or exported.
        """
        scale, zero_point = self.weight_scale, self.weight_zero_point
        bounds = (self.weight_quant_min, self.weight_quant_max, _storage_dtype(self.weight_dtype))
        if self._per_channel():
            return (scale, zero_point, self.weight_axis_int, *bounds)
        return (scale, zero_point, *bounds)

    def get_weight(self) -> torch.Tensor:
        """The float weight after quantize -> dequantize: what the quantized kernel computes with.

        Example:
            >>> qparams = {"qscheme": "per_tensor_symmetric", "dtype": torch.qint8,
            ...            "scale": 0.5, "zero_point": 0}
            >>> ref = Linear.from_float(nn.Linear(2, 1), qparams)
            >>> bool(((ref.get_weight() / 0.5).frac() == 0).all())
            True
        """
        quantized = self.get_quantized_weight()
        if not self.is_weight_quantized():
            return quantized.to(self.weight.dtype)
        per_channel = self._per_channel()
        dequantize = qdq.dequantize_per_channel if per_channel else qdq.dequantize_per_tensor
        return dequantize(quantized, *self._weight_qparams(), out_dtype=self.weight.dtype)

    def get_weight_qparams(self) -> dict[str, Any]:
        """The weight qparams in the ``from_float`` dict form (what lowering reads).

        Example:
            >>> qparams = {"qscheme": None, "dtype": torch.float16}
            >>> Linear.from_float(nn.Linear(2, 1), qparams).get_weight_qparams()["dtype"]
            torch.float16
        """
        params: dict[str, Any] = {
            "qscheme": self.weight_qscheme,
            "dtype": self.weight_dtype,
            "scale": self.weight_scale,
            "zero_point": self.weight_zero_point,
            "quant_min": self.weight_quant_min,
            "quant_max": self.weight_quant_max,
        }
        if self._per_channel():
            params["axis"] = self.weight_axis_int
        return params

    def get_extra_state(self) -> dict[str, Any]:
        """The non-tensor qparams, saved in ``state_dict`` under ``_extra_state``."""
        return {
            "qscheme": self._scheme_name(),
            "dtype": dtypes.dtype_name(self.weight_dtype),
            "quant_min": self.weight_quant_min,
            "quant_max": self.weight_quant_max,
        }

    def set_extra_state(self, state: Any) -> None:
        """Restore what :meth:`get_extra_state` saved."""
        qscheme = state["qscheme"]
        self.weight_qscheme = None if qscheme is None else dtypes.qscheme_object(qscheme)
        self.weight_dtype = dtypes.dtype_from_name(state["dtype"])
        self.weight_quant_min = int(state["quant_min"])
        self.weight_quant_max = int(state["quant_max"])

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any], *rest: Any
    ) -> None:
        # a per-channel checkpoint loads into a per-tensor module (and back)
        adopt_saved_buffers(
            self, state_dict, prefix, ("weight_scale", "weight_zero_point", "weight_axis")
        )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *rest)
        self.weight_axis_int = int(self.weight_axis)

    def extra_repr(self) -> str:
        """The float module's description plus the weight's qscheme and dtype."""
        base = super().extra_repr()
        scheme = f"weight_qscheme={self._scheme_name()}, weight_dtype={self.weight_dtype}"
        return f"{base}, {scheme}" if base else scheme

    def _get_name(self) -> str:
        return f"Reference{type(self).__name__}"


class _Reference(FloatTwin, ReferenceQuantizedModule):
    """The reference modules of this file: ``_float_class`` is the float class mixed in.

    Example:
        >>> Conv2d._float_class is nn.Conv2d
        True
    """

    # lowering drops a reference module its kernels fully replaced (and its float weights)
    _IS_REFERENCE: ClassVar[bool] = True

    def __init__(
        self, *args: Any, weight_qparams: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        self._float_class.__init__(self, *args, **kwargs)
        self._init_weight_qparams(weight_qparams)

    def used_weight(self) -> torch.Tensor:
        """The quantize->dequantized weight: what the forward computes with."""
        return self.get_weight()

    @classmethod
    def from_float(cls, float_module: nn.Module, weight_qparams: Mapping[str, Any] | None) -> Any:
        """Copy ``float_module``: a ``_float_class`` module, a fused module whose first part
        is one, or a QAT module (whose ``to_float()`` folds any BatchNorm first): its
        configuration, and its weight and bias as new Parameters."""
        to_float = getattr(float_module, "to_float", None)
        mod = root_of(to_float() if callable(to_float) else float_module)
        if not isinstance(mod, cls._float_class):
            msg = (
                f"reference {cls.__name__}.from_float expects a {type_label(cls._float_class)} "
                f"(or a fused module whose first part is one), got {float_module!r}"
            )
            raise ConfigTypeError(msg)
        return rebuilt(cls, mod, ("weight", "bias"), weight_qparams=weight_qparams)


class Linear(_Reference, Affine, nn.Linear):
    """Reference quantized ``nn.Linear``: ``F.linear(x, get_weight(), bias)``.

    Args:
        *args, **kwargs: those of ``nn.Linear``.
        weight_qparams: the weight's qparams (see :class:`ReferenceQuantizedModule`).

    Example:
        >>> qparams = {"qscheme": torch.per_channel_affine, "dtype": torch.qint8,
        ...            "scale": torch.full((3,), 0.05), "zero_point": torch.zeros(3), "axis": 0}
        >>> ref = Linear.from_float(nn.Linear(4, 3), qparams)
        >>> ref(torch.randn(2, 4)).shape
        torch.Size([2, 3])
    """


class Conv1d(_Reference, Convolving, nn.Conv1d):
    """Reference quantized ``nn.Conv1d``.

    Example:
        >>> qparams = {"qscheme": "per_tensor_affine", "dtype": torch.qint8,
        ...            "scale": 0.02, "zero_point": 0}
        >>> Conv1d.from_float(nn.Conv1d(2, 3, 3), qparams)(torch.randn(1, 2, 8)).shape
        torch.Size([1, 3, 6])
    """


class Conv2d(_Reference, Convolving, nn.Conv2d):
    """Reference quantized ``nn.Conv2d``.

    Example:
        >>> from fxquant.nn.intrinsic import ConvReLU2d
        >>> fused = ConvReLU2d(nn.Conv2d(2, 3, 3), nn.ReLU())
        >>> qparams = {"qscheme": "per_tensor_affine", "dtype": torch.qint8,
        ...            "scale": 0.02, "zero_point": 0}
        >>> Conv2d.from_float(fused, qparams)(torch.randn(1, 2, 5, 5)).shape
        torch.Size([1, 3, 3, 3])
    """


class Conv3d(_Reference, Convolving, nn.Conv3d):
    """Reference quantized ``nn.Conv3d``.

    Example:
        >>> qparams = {"qscheme": "per_tensor_affine", "dtype": torch.qint8,
        ...            "scale": 0.02, "zero_point": 0}
        >>> Conv3d.from_float(nn.Conv3d(2, 3, 1), qparams)(torch.randn(1, 2, 2, 2, 2)).shape
        torch.Size([1, 3, 2, 2, 2])
    """


class _TransposedConv(_Reference, nn.modules.conv._ConvTransposeNd):
    """Forward of ``ConvTranspose1d/2d/3d``, with ``output_size`` as in ``nn.ConvTranspose*``.

    Example:
        >>> ConvTranspose2d.from_float(nn.ConvTranspose2d(2, 3, 3), None).kernel_size
        (3, 3)
    """

    # torch types its geometry arguments as lists; its own forward passes these tuples too
    _output_padding: Callable[..., list[int]]

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        """Transposed convolution with the quantize->dequantized weight."""
        dims = len(self.kernel_size)
        output_padding = self._output_padding(
            x, output_size, self.stride, self.padding, self.kernel_size, dims, self.dilation
        )
        # the op of the float module, by dimension
        conv: Callable[..., torch.Tensor] = getattr(F, f"conv_transpose{dims}d")
        return conv(
            x,
            self.get_weight(),
            self.bias,
            self.stride,
            self.padding,
            output_padding,
            self.groups,
            self.dilation,
        )


class ConvTranspose1d(_TransposedConv, nn.ConvTranspose1d):
    """Reference quantized ``nn.ConvTranspose1d`` (weight axis 1 holds output channels).

    Example:
        >>> qparams = {"qscheme": "per_tensor_affine", "dtype": torch.quint8,
        ...            "scale": 0.02, "zero_point": 128}
        >>> ref = ConvTranspose1d.from_float(nn.ConvTranspose1d(2, 3, 3), qparams)
        >>> ref(torch.randn(1, 2, 4)).shape
        torch.Size([1, 3, 6])
    """


class ConvTranspose2d(_TransposedConv, nn.ConvTranspose2d):
    """Reference quantized ``nn.ConvTranspose2d``.

    Example:
        >>> qparams = {"qscheme": "per_channel_affine", "dtype": torch.qint8,
        ...            "scale": torch.full((3,), 0.02), "zero_point": torch.zeros(3), "axis": 1}
        >>> ref = ConvTranspose2d.from_float(nn.ConvTranspose2d(2, 3, 3), qparams)
        >>> ref(torch.randn(1, 2, 4, 4)).shape
        torch.Size([1, 3, 6, 6])
    """


class ConvTranspose3d(_TransposedConv, nn.ConvTranspose3d):
    """Reference quantized ``nn.ConvTranspose3d``.

    Example:
        >>> qparams = {"qscheme": "per_tensor_affine", "dtype": torch.qint8,
        ...            "scale": 0.02, "zero_point": 0}
        >>> ref = ConvTranspose3d.from_float(nn.ConvTranspose3d(2, 3, 1), qparams)
        >>> ref(torch.randn(1, 2, 2, 2, 2)).shape
        torch.Size([1, 3, 2, 2, 2])
    """


class Embedding(_Reference, Lookup, nn.Embedding):
    """Reference quantized ``nn.Embedding`` (usually per-channel float qparams, axis 0).

    Example:
        >>> emb = nn.Embedding(10, 4)
        >>> qparams = {"qscheme": torch.per_channel_affine_float_qparams, "dtype": torch.quint8,
        ...            "scale": torch.full((10,), 0.02), "zero_point": torch.full((10,), 128.0),
        ...            "axis": 0}
        >>> Embedding.from_float(emb, qparams)(torch.tensor([1, 2])).shape
        torch.Size([2, 4])
    """


class EmbeddingBag(_Reference, Pool, nn.EmbeddingBag):
    """Reference quantized ``nn.EmbeddingBag``.

    Example:
        >>> bag = nn.EmbeddingBag(10, 4, mode="sum")
        >>> qparams = {"qscheme": "per_channel_affine_float_qparams", "dtype": torch.quint8,
        ...            "scale": torch.full((10,), 0.02), "zero_point": torch.full((10,), 128.0),
        ...            "axis": 0}
        >>> ref = EmbeddingBag.from_float(bag, qparams)
        >>> ref(torch.tensor([1, 2, 3]), torch.tensor([0, 2])).shape
        torch.Size([2, 4])
    """
