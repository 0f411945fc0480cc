"""Whether this CPU's uint8 x int8 kernels are exact on full-range (0..255) activations.

oneDNN (the x86 and onednn backends) and FBGEMM multiply uint8 activations by
int8 weights. With VNNI (``avx512_vnni``, ``avx_vnni``) or AMX every product is
added in int32: exact. Without it (AVX2, AVX-512 without VNNI) the kernels add
each pair of products in int16 with saturation (``vpmaddubsw``): 255 * 127 * 2 =
64770 does not fit in 32767, so full-range activations give wrong results, while
7-bit ones (0..127: at most 127 * 128 * 2 = 32512) stay exact. Measured on an
AVX2 CPU with torch 2.13: ``onednn.qlinear_pointwise`` on random 0..255 inputs
is off by 14% of its output range, on 0..127 inputs exact; the same for
``onednn.qconv2d_pointwise`` (15%).

So, as torch.ao does on such CPUs, backends quantize activations to 7 bits
there (``reduce_range=True`` / ``quant_max=127``) and their lowering rules
decline a pattern whose activations use more, leaving it in reference form.

:func:`has_vnni` asks the CPU once; the environment variable
``FXQUANT_CPU_VNNI`` (``1`` or ``0``) overrides the answer, read on every call:
``0`` where oneDNN is capped below VNNI (``ONEDNN_MAX_CPU_ISA=AVX2``), ``1`` or
``0`` in tests that check both kinds of CPU.
"""

from __future__ import annotations

import functools
import os
from typing import Final

import torch

from fxquant.lowering import LoweringMatch, QParams

__all__ = [
    "ENV_VAR",
    "SEVEN_BIT_QUANT_MAX",
    "activation_range",
    "has_vnni",
    "saturation_reason",
]

ENV_VAR: Final = "FXQUANT_CPU_VNNI"
"""``1``: treat the CPU as having VNNI; ``0``: as not having it; unset: ask the CPU."""

SEVEN_BIT_QUANT_MAX: Final = 127
"""The largest uint8 activation whose products with int8 weights cannot saturate in pairs."""

# the int32 dot products: AVX-512 VNNI, AVX-VNNI (Alder Lake and later), AMX tiles
_EXACT_FEATURES: Final = ("avx512_vnni", "avx_vnni", "amx_int8")
_WORDS: Final = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


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


def activation_range(match: LoweringMatch, x: QParams) -> QParams:
    """``x`` with the integer range the pattern's activations were quantized for.

    A static input's stored integers always span the dtype (0..255: a value beyond
    the calibrated range saturates there, as in torch.ao's reference models); the
    range the qparams were chosen for is the pattern's qconfig's activation
    observer's (0..127 with ``reduce_range``). A dynamic input's qparams already
    carry the range they are chosen for.

    Example:
        >>> from fxquant.lowering import LoweringRule
        >>> rule = LoweringRule(torch.nn.Linear, build=lambda match: None, name="mine")
        >>> x = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)
        >>> activation_range(LoweringMatch(rule, "mine", (), (), (x,), None), x).quant_max
        255
    """
    if x.is_dynamic or not match.nodes:
        return x
    from fxquant.flow.state import node_info  # the flow's record of the anchor's qconfig

    qconfig = node_info(match.anchor).qconfig
    if qconfig is None or qconfig.activation is None:
        return x
    observer = qconfig.activation()
    low, high = getattr(observer, "quant_min", None), getattr(observer, "quant_max", None)
    if not isinstance(low, int) or not isinstance(high, int):
        return x
    return QParams(x.dtype, low, high, x.scale, x.zero_point, x.axis, x.is_dynamic)


def saturation_reason(library: str, x: QParams) -> str | None:
    """Why ``library``'s uint8 x int8 kernel would be wrong on inputs quantized as ``x``,
    or ``None`` when it is exact on them (VNNI, or activations within 7 bits).

    A lowering rule returns ``fxquant.lowering.Declined(reason)`` with it: the
    pattern stays in reference form and the report says why. Pass a static
    input through :func:`activation_range` first.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> full, seven = (QParams(torch.uint8, 0, high, is_dynamic=True) for high in (255, 127))
        >>> with mock.patch.dict(os.environ, {"FXQUANT_CPU_VNNI": "0"}):
        ...     saturation_reason("oneDNN", full).split(" (")[0], saturation_reason("oneDNN", seven)
        ("oneDNN's u8 x s8 kernel saturates on CPUs without VNNI for activations over 7 bits", None)
    """
    if x.dtype == torch.uint8 and x.quant_max <= SEVEN_BIT_QUANT_MAX:
        return None
    if has_vnni():
        return None
    return (
        f"{library}'s u8 x s8 kernel saturates on CPUs without VNNI for activations over "
        f"7 bits (quant range {x.quant_min}..{x.quant_max}); use reduce_range=True / "
        f"quant_max={SEVEN_BIT_QUANT_MAX}"
    )
