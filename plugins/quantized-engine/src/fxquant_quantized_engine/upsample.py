"""F.interpolate on quint8 tensors: the engines' kernels where they are right, floats elsewhere.

torch 2.13's quint8 upsampling (nearest, nearest-exact, bilinear; fbgemm and qnnpack alike)
takes an input whose spatial sizes are all 1 for channels_last (its strides fit both
layouts), then writes channels_last order into a contiguous output: each channel's plane
holds other channels' values, up to 255 steps off (DeepLabV3's ASPP pooling branch
upsamples such a 1x1 map). :func:`interpolate_quint8` gives that input channels_last
strides first (the same memory: no copy). The engines have no quint8 kernel for
bicubic, linear, trilinear, antialias nor a 1-D input; ``area`` is average pooling, which
the engines round their own way: those run on floats, as the reference does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

_KERNEL_MODES = frozenset({"nearest", "nearest-exact", "bilinear"})
_KERNEL_RANKS = (4, 5)  # (N, C, H, W) and (N, C, D, H, W): no 1-D quint8 upsampling


def has_quint8_kernel(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether an F.interpolate call with these arguments may run the engines' kernel.

    ``args`` starts with the input, as the call's node has it. The input's rank is known
    only when it runs: :func:`interpolate_quint8` checks that.

    Example:
        >>> has_quint8_kernel(("x",), {"size": (4, 4), "mode": "bilinear"})
        True
        >>> has_quint8_kernel(("x", None, 2.0, "bicubic"), {})
        False
    """
    mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
    antialias = kwargs.get("antialias", args[6] if len(args) > 6 else False)
    return isinstance(mode, str) and mode in _KERNEL_MODES and antialias is False


def _channels_last_strides(x: torch.Tensor) -> torch.Tensor:
    """``x`` with channels_last strides when its spatial sizes are all 1 and channels packed."""
    channels = x.shape[1]
    if x.stride(1) != 1 or x.stride(-1) == channels or any(size != 1 for size in x.shape[2:]):
        return x  # channels not packed, already channels_last strides, or a real map
    return x.as_strided(x.shape, (x.stride(0), 1, *([channels] * (x.dim() - 2))))


def interpolate_quint8(  # noqa: PLR0913, PLR0917  # F.interpolate's own parameters
    x: torch.Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> torch.Tensor:
    """F.interpolate of a quint8 ``x`` that the engines' kernels compute right, else of floats.

    A quint8 input the kernels have no upsampling for comes back as floats (its
    dequantized values interpolated), which the caller quantizes as the reference does.

    Example:
        >>> from fxquant_quantized_engine import EngineScope, as_quint8
        >>> values = torch.tensor([10, 20, 30], dtype=torch.uint8).reshape(1, 3, 1, 1)
        >>> with EngineScope("fbgemm"):
        ...     out = interpolate_quint8(as_quint8(values, 0.1, 0), size=(2, 2))
        >>> out.int_repr()[0, :, 0, 0].tolist()
        [10, 20, 30]
    """
    arguments = (size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    if not x.is_quantized:
        return F.interpolate(x, *arguments)
    if x.dim() not in _KERNEL_RANKS or not has_quint8_kernel((x, *arguments), {}):
        return F.interpolate(x.dequantize(), *arguments)
    return F.interpolate(_channels_last_strides(x), *arguments)
