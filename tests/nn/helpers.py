"""A minimal weight fake-quantize module and qconfigs for the nn tests.

The QAT modules only need ``qconfig.weight()`` to build a module that maps a
weight to a weight; this one is built on ``torch.fake_quantize_per_tensor_affine``
so the tests do not depend on ``fxquant.fake_quantize``.
"""

from __future__ import annotations

import torch
from fxquant.config.qconfig import QConfig
from fxquant.factory import ModuleFactory
from torch import nn


class TinyFakeQuantize(nn.Module):
    """Per-tensor int8 fake quantization with fixed qparams; ``enabled=False`` passes through."""

    def __init__(self, scale: float = 0.05, qscheme: object = torch.per_tensor_symmetric) -> None:
        super().__init__()
        self.scale = scale
        self.qscheme = qscheme
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        return torch.fake_quantize_per_tensor_affine(x, self.scale, 0, -128, 127)


def tiny_qconfig(**kwargs: object) -> QConfig:
    """A QConfig whose weight constructor builds :class:`TinyFakeQuantize`."""
    return QConfig(activation=nn.Identity, weight=ModuleFactory(TinyFakeQuantize, kwargs))


def set_fake_quant(module: nn.Module, enabled: bool) -> None:
    """Turn every :class:`TinyFakeQuantize` inside ``module`` on or off."""
    for child in module.modules():
        if isinstance(child, TinyFakeQuantize):
            child.enabled = enabled
