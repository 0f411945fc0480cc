"""torchvision's models on the CPU torch, and the zoo's torchvision builders (issue 30).

torchvision 0.28.0's wheel links CUDA libraries, so its C extension does not load next to
the CPU torch 2.13, and ``import torchvision`` then fails in ``_meta_registrations``: it
registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms`` with
``torch.library.register_fake``, which needs the op schemas the extension would have
defined. The model definitions use none of the C ops. :func:`load` imports torchvision as
it is; when that fails for want of those schemas, it defines them (no kernel: calling the
op still fails, as it would without the extension) and imports again. torchvision is
installed with ``pip install --no-deps torchvision==0.28.0 pillow`` (its own requirement is an
unpinned torch, which pulls CUDA): the nox sessions that need it do so, and tests call
:func:`require`, which skips with that command where it is absent.

:data:`BUILDERS` are torchvision's own classes at the sizes the zoo runs in seconds: the
stock constructors (``resnet18(num_classes=10)``) where they are cheap on 32 x 32 images,
small configurations of the same classes (``VisionTransformer``, ``SwinTransformer``,
``ConvNeXt``) where the stock width is what costs.

Example:
    >>> tv = require()  # skips where torchvision is not installed
    >>> BUILDERS["tv_resnet18"]()(torch.zeros(1, 3, 32, 32)).shape
    torch.Size([1, 10])
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

__all__ = ["BUILDERS", "INSTALL", "SEGMENTATION", "load", "require"]

INSTALL = "pip install --no-deps torchvision==0.28.0 pillow"
"""How torchvision is installed next to the pinned CPU torch (its requirement pulls CUDA)."""

# the schemas torchvision's meta registrations reference by name (register_fake needs the
# op to exist); the others it registers only when its extension loaded
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_libraries: list[torch.library.Library] = []  # kept alive: a freed Library drops its schemas


def _has_op(name: str) -> bool:
    return bool(torch._C._jit_get_schemas_for_operator(f"torchvision::{name}"))


def _define_schemas() -> None:
    missing = [name for name in _SCHEMAS if not _has_op(name)]
    if missing:
        library = torch.library.Library("torchvision", "FRAGMENT")
        for name in missing:
            library.define(_SCHEMAS[name])
        _libraries.append(library)


def load() -> ModuleType:
    """``torchvision``, imported on the CPU torch (its two op schemas defined where missing).

    Raises:
        ImportError: torchvision is not installed (install it with :data:`INSTALL`).
    """
    if "torchvision.models" in sys.modules:
        return sys.modules["torchvision"]
    if importlib.util.find_spec("torchvision") is None:
        msg = f"torchvision is not installed; install it with: {INSTALL}"
        raise ImportError(msg)
    try:
        importlib.import_module("torchvision")
    except RuntimeError as error:  # its extension did not load: the schemas are missing
        if "torchvision::" not in str(error):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # the failed import's half-built modules
        _define_schemas()
    importlib.import_module("torchvision.models.segmentation")
    return importlib.import_module("torchvision")


def require() -> ModuleType:
    """:func:`load`'s torchvision, or skip the calling test with the command that installs it."""
    import pytest  # why: the zoo's runner (bench/zoo.py) imports this module without pytest

    try:
        return load()
    except ImportError as error:
        pytest.skip(str(error))


CLASSES = 10


def _models() -> Any:
    return load().models


def _stock(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        return getattr(_models(), name)(weights=None, num_classes=CLASSES, **kwargs).eval()

    return build


def _segmentation(name: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        module = _models().segmentation
        return getattr(module, name)(weights=None, weights_backbone=None, num_classes=5).eval()

    return build


def _vit() -> nn.Module:
    vit = _models().vision_transformer
    model = vit.VisionTransformer(32, 8, 2, 4, 64, 128, num_classes=CLASSES).eval()
    # torchvision starts the head at zero (fine-tuning's choice): every output would be 0
    nn.init.normal_(model.heads.head.weight, std=0.2)
    return model


def _swin() -> nn.Module:
    swin = _models().swin_transformer
    # swin_t's block and merging, two stages at width 32: windows of 4 on the 8 x 8 patches
    return swin.SwinTransformer(
        [4, 4], 32, [2, 2], [2, 4], [4, 4], stochastic_depth_prob=0.0, num_classes=CLASSES
    ).eval()


def _convnext() -> nn.Module:
    convnext = _models().convnext
    blocks = [convnext.CNBlockConfig(32, 64, 1), convnext.CNBlockConfig(64, None, 1)]
    return convnext.ConvNeXt(blocks, num_classes=CLASSES).eval()


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "tv_resnet18": _stock("resnet18"),
    "tv_resnet50": _stock("resnet50"),
    "tv_mobilenet_v2": _stock("mobilenet_v2", width_mult=0.5),
    "tv_mobilenet_v3_small": _stock("mobilenet_v3_small"),
    "tv_mobilenet_v3_large": _stock("mobilenet_v3_large", width_mult=0.5),
    "tv_efficientnet_b0": _stock("efficientnet_b0"),
    "tv_regnet_y_400mf": _stock("regnet_y_400mf"),
    "tv_shufflenet_v2": _stock("shufflenet_v2_x0_5"),
    "tv_squeezenet": _stock("squeezenet1_1"),
    "tv_densenet121": _stock("densenet121"),
    "tv_googlenet": _stock("googlenet", aux_logits=False, init_weights=True),
    "tv_convnext": _convnext,
    "tv_vit": _vit,
    "tv_swin": _swin,
}
"""torchvision's classification models by zoo name: a function building each (eval mode)."""

SEGMENTATION: dict[str, Callable[[], nn.Module]] = {
    "tv_deeplabv3_mobilenet_v3": _segmentation("deeplabv3_mobilenet_v3_large"),
    "tv_lraspp_mobilenet_v3": _segmentation("lraspp_mobilenet_v3_large"),
    "tv_fcn_resnet50": _segmentation("fcn_resnet50"),
}
"""torchvision's segmentation models (output ``{"out": N x 5 x H x W}``), by zoo name."""
