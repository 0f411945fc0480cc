"""Whether this CPU's uint8 x int8 kernels are exact, and for which weights.

oneDNN (the x86 and onednn backends) and FBGEMM multiply uint8 activations by
int8 weights. With VNNI (``avx512_vnni``, ``avx_vnni``) or AMX every product is
added in int32: exact. Without it (AVX2, AVX-512 without VNNI) they add each pair
of products in int16 with saturation (``vpmaddubsw``): 2 * 255 * 127 = 64770 does
not fit in 32767, and results are silently wrong. Measured with torch 2.13 on an
AVX2 CPU: ``onednn.qlinear_pointwise`` on random 0..255 inputs and -128..127
weights is off by 14% of its output range (``qconv2d_pointwise`` 15%).

Two ways out, measured there: 7-bit activations (0..127: 2 * 127 * 128 = 32512),
torch.ao's ``reduce_range``, and 7-bit weights (|w| <= 64: 2 * 255 * 64 = 32640).
Only the second is exact for every input: ``reduce_range`` chooses the scale so
that the calibrated range fills 0..127, but the stored integers span 0..255 (a
value beyond the calibrated range saturates at 255, as in torch.ao's reference
models), and those values overflow (a linear stack fed 2x its calibration range:
10% of the output off the reference; a conv stack at 4x: 25%). 7-bit weights are
also the more accurate (the zoo's MLP, ResNet, MobileNetV2 and BERT under the x86
mapping: 0.3 to 2.4 dB of SQNR above 7-bit activations). So the x86 and onednn
defaults quantize weights to -63..63 on such CPUs, and their rules check the
weights they lower (:func:`saturation_reason`).

:func:`has_vnni` asks the CPU once; the environment variable
``FXQUANT_CPU_VNNI`` (``1`` or ``0``) overrides the answer, read on every call:
``0`` where oneDNN is capped below VNNI (``ONEDNN_MAX_CPU_ISA=AVX2``), ``1`` or
``0`` in tests that check both kinds of CPU.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Final

import torch

from fxquant.lowering import QParams

__all__ = [
    "ENV_VAR",
    "SEVEN_BIT_WEIGHT",
    "WEIGHT_BOUND",
    "has_vnni",
    "saturation_reason",
    "symmetric_zero_padding",
]

ENV_VAR: Final = "FXQUANT_CPU_VNNI"
"""``1``: treat the CPU as having VNNI; ``0``: as not having it; unset: ask the CPU."""

WEIGHT_BOUND: Final = 64
"""The largest |int8 weight| whose products with any uint8 value cannot saturate in pairs."""

SEVEN_BIT_WEIGHT: Final = (-63, 63)
"""The symmetric weight range (quant_min, quant_max) the defaults use without VNNI."""

# the int32 dot products: AVX-512 VNNI, AVX-VNNI (Alder Lake and later), AMX tiles
_EXACT_FEATURES: Final = ("avx512_vnni", "avx_vnni", "amx_int8")
_WORDS: Final = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
_SEVEN_BITS: Final = 127  # the largest uint8 value whose products cannot saturate in pairs


@functools.cache
def _cpu_has_vnni() -> bool:
    capabilities = torch.cpu.get_capabilities()
    return any(bool(capabilities.get(feature)) for feature in _EXACT_FEATURES)


def has_vnni() -> bool:
    """Whether this CPU adds uint8 x int8 products in int32 (VNNI or AMX): exact at 0..255.

    Raises:
        ValueError: ``FXQUANT_CPU_VNNI`` is set to something else than 1/0 (true/false).

    Example:
        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"FXQUANT_CPU_VNNI": "0"}):
        ...     has_vnni()
        False
    """
    forced = os.environ.get(ENV_VAR)
    if forced is None or not forced.strip():
        return _cpu_has_vnni()
    answer = _WORDS.get(forced.strip().lower())
    if answer is None:
        msg = f"{ENV_VAR} must be 1 or 0 (true or false), got {forced!r}; unset it to ask the CPU"
        raise ValueError(msg)
    return answer


def largest_weight(weight: torch.Tensor) -> int:
    """The largest magnitude among the int8 ``weight``'s values (128 for -128).

    Example:
        >>> largest_weight(torch.tensor([3, -128, 90], dtype=torch.int8))
        128
    """
    return int(weight.to(torch.int16).abs().max()) if weight.numel() else 0


def saturation_reason(library: str, weight: torch.Tensor, x: QParams) -> str | None:
    """Why ``library``'s uint8 x int8 kernel would be wrong with this int8 ``weight`` on inputs
    quantized as ``x``, or ``None`` when it is exact on this CPU.

    Exact with VNNI; with weights within +-64 (any uint8 input); or when ``x`` is
    dynamic with a chosen range within 0..127 (the values then fit it). A static
    input's stored integers reach 255 whatever range its scale was chosen for.
    A lowering rule returns ``fxquant.lowering.Declined(reason)`` with it: the
    pattern stays in reference form and the report says why.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> x = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)
        >>> wide, narrow = torch.tensor([[127, -3]]), torch.tensor([[63, -3]])
        >>> with mock.patch.dict(os.environ, {"FXQUANT_CPU_VNNI": "0"}):
        ...     saturation_reason("oneDNN", wide.char(), x).split(":")[0]
        ...     saturation_reason("oneDNN", narrow.char(), x) is None
        "oneDNN's u8 x s8 kernel saturates on CPUs without VNNI"
        True
    """
    if has_vnni():
        return None
    if x.is_dynamic and x.dtype == torch.uint8 and x.quant_max <= _SEVEN_BITS:
        return None
    reached = largest_weight(weight)
    if reached <= WEIGHT_BOUND:
        return None
    low, high = SEVEN_BIT_WEIGHT
    return (
        f"{library}'s u8 x s8 kernel saturates on CPUs without VNNI: it adds pairs of "
        f"uint8 x int8 products in int16, exact only for weights within +-{WEIGHT_BOUND} "
        f"(these reach {reached}) or dynamic activations within 0..{_SEVEN_BITS} (these: "
        f"{x.quant_min}..{x.quant_max}{'' if x.is_dynamic else ', static'}); quantize the "
        f"weights to {low}..{high} (quant_min={low}, quant_max={high}, as the backend's "
        f"default mapping does on this CPU)"
    )


def symmetric_zero_padding(conv: Any, kernel: str) -> list[int] | str:
    """``conv``'s padding as a CPU conv kernel takes it (one count per spatial dimension, the
    same on both sides, zeros), or why ``kernel`` (its name, for the reason) cannot run it.

    oneDNN's and FBGEMM/QNNPACK's convs pad with zeros, alike on both sides of a dimension.
    ``padding_mode`` other than ``"zeros"`` cannot be given to them (lowered as zeros, a
    reflect-padded conv was 15 steps off its reference), nor ``padding="same"`` where the
    dilated kernel's extent is even (torch pads one more on the right); ``"valid"`` is none.

    Example:
        >>> from torch import nn
        >>> symmetric_zero_padding(nn.Conv2d(1, 1, 3, padding="same", dilation=2), "oneDNN's conv")
        [2, 2]
        >>> symmetric_zero_padding(nn.Conv1d(1, 1, 2, padding="same"), "the kernel")[-46:]
        'one side; only symmetric padding in the kernel'
        >>> symmetric_zero_padding(nn.Conv1d(1, 1, 3, padding_mode="reflect"), "the kernel")
        "padding_mode 'reflect': only zero padding in the kernel"
    """
    mode = getattr(conv, "padding_mode", "zeros")
    if mode != "zeros":
        return f"padding_mode {mode!r}: only zero padding in {kernel}"
    padding, size, dilation = conv.padding, conv.kernel_size, conv.dilation
    if padding == "valid":
        return [0] * len(size)
    if padding != "same":
        return [int(p) for p in padding]
    extents = [d * (k - 1) for k, d in zip(size, dilation, strict=True)]
    if any(e % 2 for e in extents):
        return (
            f"padding='same' with kernel {tuple(size)} and dilation {tuple(dilation)} pads "
            f"one more on one side; only symmetric padding in {kernel}"
        )
    return [e // 2 for e in extents]
