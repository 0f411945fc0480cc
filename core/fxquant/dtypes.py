"""Quantized dtypes and qschemes without depending on torch's quantized tensor types.

PyTorch 2.13 deprecates ``torch.quint8``/``qint8``/``qint32`` and will remove
them. Users (and the seeds) still write them in configs, so fxquant accepts
both spellings and compares them by their *storage* dtype:

    torch.quint8  == torch.uint8     (0..255)
    torch.qint8   == torch.int8      (-128..127)
    torch.qint32  == torch.int32

Everything here looks the quantized names up with ``getattr`` so importing
fxquant keeps working on a torch that no longer has them, and nothing here
creates a quantized tensor (that emits torch's deprecation warning).

Qschemes get the same treatment: ``torch.per_tensor_affine`` and the string
``"per_tensor_affine"`` are the same scheme.
"""

from __future__ import annotations

import struct

import torch

from fxquant.errors import ConfigError, ConfigTypeError

__all__ = [
    "FLOAT_DTYPES",
    "QSCHEMES",
    "canonical_dtype",
    "check_fits",
    "dtype_from_name",
    "dtype_name",
    "dtypes_match",
    "float32_value",
    "is_float_dtype",
    "is_per_channel",
    "is_quantized_dtype",
    "is_symmetric",
    "qscheme_name",
    "qscheme_object",
    "quant_range",
]

# name of torch's quantized dtype -> the plain dtype holding the same integers
_PLAIN_BY_NAME: dict[str, torch.dtype] = {
    "quint8": torch.uint8,
    "qint8": torch.int8,
    "qint32": torch.int32,
}
# the same for the quantized dtypes this torch still has, by dtype
_QUANTIZED_TO_PLAIN: dict[torch.dtype, torch.dtype] = {
    dtype: plain
    for name, plain in _PLAIN_BY_NAME.items()
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}
# 4-bit and 2-bit packed types have no plain equivalent; keep them as themselves.
_PACKED_RANGES: dict[torch.dtype, tuple[int, int]] = {
    dtype: span
    for name, span in (("quint4x2", (0, 15)), ("quint2x4", (0, 3)))
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}

# every integer dtype's full range: the packed ones, uint16 and uint32 where this torch has them
_INTEGER_RANGES: dict[torch.dtype, tuple[int, int]] = _PACKED_RANGES | {
    dtype: (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    for name in ("uint8", "int8", "int16", "int32", "uint16", "uint32")
    if isinstance(dtype := getattr(torch, name, None), torch.dtype)
}

FLOAT_DTYPES: frozenset[torch.dtype] = frozenset(
    {torch.float16, torch.bfloat16, torch.float32, torch.float64}
)

QSCHEMES: tuple[str, ...] = (
    "per_tensor_affine",
    "per_tensor_symmetric",
    "per_channel_affine",
    "per_channel_symmetric",
    "per_channel_affine_float_qparams",
)


def canonical_dtype(dtype: torch.dtype) -> torch.dtype:
    """Return the plain dtype that stores ``dtype``'s integers (``quint8`` -> ``uint8``).

    Example:
        >>> canonical_dtype(torch.quint8)
        torch.uint8
        >>> canonical_dtype(torch.float16)
        torch.float16
    """
    if not isinstance(dtype, torch.dtype):
        msg = f"expected a torch.dtype, got {dtype!r} of type {type(dtype).__name__}"
        raise ConfigTypeError(msg)
    return _QUANTIZED_TO_PLAIN.get(dtype, dtype)


def dtypes_match(a: torch.dtype | None, b: torch.dtype | None) -> bool:
    """True when ``a`` and ``b`` are the same dtype once quantized names are made plain."""
    if a is None or b is None:
        return a is b
    return canonical_dtype(a) == canonical_dtype(b)


def is_quantized_dtype(dtype: torch.dtype | None) -> bool:
    """True for the integer dtypes quantization produces (uint8, int8, int32, quint8, ...)."""
    return dtype in _QUANTIZED_TO_PLAIN or dtype in _INTEGER_RANGES


def is_float_dtype(dtype: torch.dtype | None) -> bool:
    """True for float16/bfloat16/float32/float64."""
    return dtype in FLOAT_DTYPES


def check_fits(quant_min: int, quant_max: int, dtype: torch.dtype) -> None:
    """Raise :class:`ConfigError` unless ``quant_min..quant_max`` lies within ``dtype``'s range.

    Example:
        >>> check_fits(0, 255, torch.int8)
        Traceback (most recent call last):
        fxquant.errors.ConfigError: quant_min=0, quant_max=255 do not fit dtype torch.int8 ...
    """
    low, high = quant_range(dtype)
    if quant_min < low or quant_max > high:
        msg = (
            f"quant_min={quant_min!r}, quant_max={quant_max!r} do not fit dtype {dtype!r} "
            f"({low}..{high}); narrow the range or pick a wider dtype"
        )
        raise ConfigError(msg)


def float32_value(value: float) -> float:
    """``value`` rounded to the nearest float32, as a Python float: what a float32 kernel
    (or a float32 tensor compared with a Python float) sees.

    Example:
        >>> float32_value(0.1)
        0.10000000149011612
    """
    return float(struct.unpack("f", struct.pack("f", value))[0])


def quant_range(dtype: torch.dtype) -> tuple[int, int]:
    """The full integer range ``(quant_min, quant_max)`` of a quantized dtype.

    Example:
        >>> quant_range(torch.qint8)
        (-128, 127)
    """
    plain = canonical_dtype(dtype)
    if plain not in _INTEGER_RANGES:
        msg = (
            f"dtype {dtype!r} is not a quantized integer dtype; expected one of "
            "torch.uint8, torch.int8, torch.int32 (or torch.quint8, torch.qint8, torch.qint32)"
        )
        raise ConfigError(msg)
    return _INTEGER_RANGES[plain]


def dtype_name(dtype: torch.dtype) -> str:
    """The qualified name users write, e.g. ``"torch.quint8"`` (used by the JSON form)."""
    return str(dtype)


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name`, without ``eval``.

    A quantized name that this torch no longer has resolves to its plain
    equivalent (``"torch.quint8"`` -> ``torch.uint8``), which fxquant treats
    as the same dtype.
    """
    if not isinstance(name, str) or not name.startswith("torch."):
        msg = f"expected a dtype name like 'torch.uint8', got {name!r}"
        raise ConfigError(msg)
    attr = name.removeprefix("torch.")
    # vars(), not getattr: torch's module __getattr__ imports submodules (torch._dynamo...)
    # by name, and a dtype name from a JSON file must import nothing
    found = vars(torch).get(attr)
    if isinstance(found, torch.dtype):
        return found
    if attr in _PLAIN_BY_NAME:
        return _PLAIN_BY_NAME[attr]
    msg = f"{name!r} is not a torch dtype"
    raise ConfigError(msg)


def qscheme_name(qscheme: object) -> str:
    """Normalize ``torch.per_tensor_affine`` or ``"per_tensor_affine"`` to the string name.

    Example:
        >>> qscheme_name(torch.per_channel_symmetric)
        'per_channel_symmetric'
    """
    name = qscheme if isinstance(qscheme, str) else str(qscheme).removeprefix("torch.")
    if name not in QSCHEMES:
        msg = f"qscheme {qscheme!r} is not one of {', '.join(QSCHEMES)}"
        raise ConfigError(msg)
    return name


def qscheme_object(qscheme: object) -> object:
    """The ``torch.qscheme`` object when this torch has it, else the string name.

    Observers expose this as their ``qscheme`` attribute so code comparing
    ``obs.qscheme == torch.per_tensor_affine`` keeps working.
    """
    name = qscheme_name(qscheme)
    return getattr(torch, name, name)


def is_per_channel(qscheme: object) -> bool:
    """True for the per-channel qschemes."""
    return qscheme_name(qscheme).startswith("per_channel")


def is_symmetric(qscheme: object) -> bool:
    """True for the symmetric qschemes."""
    return qscheme_name(qscheme).endswith("symmetric")
