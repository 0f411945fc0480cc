"""QAT versions of the fused modules; the BatchNorm ones fold BN into the weight as they train.

A quantized conv+BN runs with BN folded into the conv weight, so QAT must
fake-quantize that folded weight. With ``s = gamma / sqrt(running_var + eps)``
per output channel, the forward is

    y = bn(conv(x, fake_quant(w * s)) / s + b)

The division undoes the scaling, so ``bn`` still sees (up to the weight's
rounding) the plain conv output and, in training, normalizes it with batch
statistics and updates its running ones exactly like a float ``BatchNorm``.
``freeze_bn_stats()`` switches BN to its running statistics (late in training);
``to_float()`` folds BN for good and returns the float fused modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fxquant.nn import intrinsic as nni
from fxquant.nn import qat as nnqat
from fxquant.nn.fusers import _BN_AFTER, check_qat_bn, fold_bn_weights

# the twins of the fused modules that hold a weight to fake-quantize (every one but
# BNReLU and ConvAdd, which keep their float forms in QAT), and the BatchNorm switches
__all__ = [
    *(name for name in nni.__all__ if name.startswith(("ConvBn", "ConvReLU", "Linear"))),
    "freeze_bn_stats",
    "update_bn_stats",
]

BatchNorm = nn.modules.batchnorm._BatchNorm


class _Fused(nnqat._QATWeighted):
    """The QAT twin of the fused module of its name in :mod:`fxquant.nn.intrinsic`:
    ``from_float`` takes that module (``_FLOAT_MODULE``), and ``to_float()`` of a twin
    ending in ReLU gives the float layer + ReLU container (``_FUSED_FLOAT``: ``ConvReLUNd``
    for ``ConvReLUNd`` and ``ConvBnReLUNd``, ``LinearReLU``). A subclass under another
    name keeps its parent's."""

    _FUSED_FLOAT: ClassVar[type[nni.FusedModule]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fused = getattr(nni, cls.__name__, None)
        if isinstance(fused, type) and issubclass(fused, nni.FusedModule):
            cls._FLOAT_MODULE = fused
            if "ReLU" in cls.__name__:
                cls._FUSED_FLOAT = getattr(nni, cls.__name__.replace("Bn", "", 1))


class _ReLU(_Fused):
    """The QAT layer (with BN folded in, for ``ConvBnReLUNd``), then ReLU; ``to_float``
    wraps the float layer (BN folded in) with an ``nn.ReLU`` in ``_FUSED_FLOAT``.

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> fused = nni.ConvReLU2d(nn.Conv2d(2, 3, 3), nn.ReLU())
        >>> fused.qconfig = QConfig(nn.Identity, nn.Identity)
        >>> qat = ConvReLU2d.from_float(fused)
        >>> qat(torch.randn(1, 2, 4, 4)).shape, type(qat.to_float()).__name__
        (torch.Size([1, 3, 2, 2]), 'ConvReLU2d')
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The fake-quantized layer, then ReLU."""
        return F.relu(super().forward(x))

    def to_float(self) -> nn.Module:
        """The float fused container of the plain layer and ``nn.ReLU``."""
        return self._FUSED_FLOAT(super().to_float(), nn.ReLU()).train(self.training)


class LinearReLU(_ReLU, nnqat.Linear):
    """QAT ``Linear`` followed by ReLU; built from ``fxquant.nn.intrinsic.LinearReLU``.

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> fused = nni.LinearReLU(nn.Linear(4, 2), nn.ReLU())
        >>> fused.qconfig = QConfig(nn.Identity, nn.Identity)
        >>> qat = LinearReLU.from_float(fused)
        >>> bool((qat(torch.randn(3, 4)) >= 0).all()), type(qat.to_float()).__name__
        (True, 'LinearReLU')
    """


class ConvReLU1d(_ReLU, nnqat._QATConv, nn.Conv1d):
    """QAT ``ConvReLU1d``, built from ``nni.ConvReLU1d``: see :class:`_ReLU`."""


class ConvReLU2d(_ReLU, nnqat._QATConv, nn.Conv2d):
    """QAT ``ConvReLU2d``, built from ``nni.ConvReLU2d``: see :class:`_ReLU`."""


class ConvReLU3d(_ReLU, nnqat._QATConv, nn.Conv3d):
    """QAT ``ConvReLU3d``, built from ``nni.ConvReLU3d``: see :class:`_ReLU`."""


class _BnFolding(_Fused):
    """Shared by ConvBn*/LinearBn1d: the BN child, its freezing, and the folded forward,
    ``bn(layer(x, fake_quant(w * s)) / s + b)`` (``ConvBnReLUNd`` adds ReLU: :class:`_ReLU`).

    Example:
        >>> issubclass(ConvBnReLU2d, _BnFolding), issubclass(LinearBn1d, _BnFolding)
        (True, True)
    """

    weight: torch.Tensor
    bn: BatchNorm
    freeze_bn: bool

    def _attach_bn(self, eps: float, momentum: float | None, freeze_bn: bool) -> None:
        """A fresh BatchNorm of the layer's dimension and width, BatchNorm's defaults else."""
        bn_cls = _BN_AFTER[self._float_class]
        width = self.weight.shape[0]  # out_channels / out_features: the weight's first dim
        self._use_bn(bn_cls(width, eps, momentum, device=self.weight.device), freeze_bn)

    def _use_bn(self, bn: BatchNorm, freeze_bn: bool) -> None:
        check_qat_bn(type(self).__name__, bn)
        self.bn = bn
        self.freeze_bn = freeze_bn
        self.bn.train(self.training and not freeze_bn)

    _layer: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # the layer without its bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer with the BN-scaled fake-quantized weight, unscaled, then BN."""
        running_var: torch.Tensor = self.bn.running_var  # type: ignore[assignment]  # tracked: checked in _use_bn
        gamma: torch.Tensor = self.bn.weight
        scale = gamma / torch.sqrt(running_var + self.bn.eps)
        weight_shape = [-1] + [1] * (self.weight.dim() - 1)
        out = self._layer(x, self.weight_fake_quant(self.weight * scale.reshape(weight_shape)))
        channel_shape = [1, -1] + [1] * (out.dim() - 2)
        out = out / scale.reshape(channel_shape)
        bias = getattr(self, "bias", None)
        if bias is not None:
            out = out + bias.reshape(channel_shape)
        normalized: torch.Tensor = self.bn(out)
        return normalized

    @classmethod
    def from_float(cls, mod: nn.Module) -> Any:
        """Build from the float container (layer, BN), sharing its layer and its BN."""
        qat = super().from_float(mod)
        qat._use_bn(mod.get_submodule("1"), freeze_bn=False)
        return qat

    def to_float(self) -> nn.Module:
        """The float layer with BN folded in."""
        layer = super().to_float()
        with torch.no_grad():  # new leaf Parameters, as the layer's own are detached
            weight, bias = fold_bn_weights(self.weight, getattr(self, "bias", None), self.bn)
        layer.weight = nn.Parameter(weight)
        layer.bias = nn.Parameter(bias)
        return layer

    def train(self, mode: bool = True) -> Any:
        """Set training mode; a frozen BN stays in eval mode (running statistics)."""
        super().train(mode)
        self.bn.train(mode and not self.freeze_bn)
        return self

    def freeze_bn_stats(self) -> Any:
        """Use and keep BN's running statistics from now on (the usual late-QAT step)."""
        self.freeze_bn = True
        self.bn.train(False)
        return self

    def update_bn_stats(self) -> Any:
        """Go back to batch statistics (and updating the running ones) while training."""
        self.freeze_bn = False
        self.bn.train(self.training)
        return self

    def reset_running_stats(self) -> None:
        """Reset BN's running mean and variance."""
        self.bn.reset_running_stats()


class _ConvBn(_BnFolding, nnqat._QATConv):
    """QAT conv + BatchNorm (+ ReLU for ``ConvBnReLUNd``), BN folded into the weight.

    ``ConvBnNd``/``ConvBnReLUNd`` take ``nn.ConvNd``'s arguments plus keywords ``eps``,
    ``momentum`` (BN's), ``freeze_bn`` and ``qconfig`` (required); ``to_float()`` gives
    the conv with BN folded in (in a ``ConvReLUNd`` when a ReLU follows).

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> fused = nni.ConvBn2d(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4))
        >>> fused.qconfig = QConfig(nn.Identity, nn.Identity)
        >>> qat = ConvBn2d.from_float(fused)
        >>> qat(torch.randn(2, 2, 5, 5)).shape, qat.freeze_bn_stats().bn.training
        (torch.Size([2, 4, 3, 3]), False)
        >>> m = ConvBnReLU1d(2, 4, 3, qconfig=QConfig(nn.Identity, nn.Identity))
        >>> bool((m(torch.randn(2, 2, 5)) >= 0).all()), type(m.to_float()).__name__
        (True, 'ConvReLU1d')
    """

    def __init__(
        self,
        *args: Any,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        freeze_bn: bool = False,
        qconfig: Any = None,
        **kwargs: Any,
    ) -> None:
        nnqat._QATConv.__init__(self, *args, qconfig=qconfig, **kwargs)
        self._attach_bn(eps, momentum, freeze_bn)

    def _layer(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, weight, None)


class ConvBn1d(_ConvBn, nn.Conv1d):
    """QAT ``ConvBn1d``, built from ``nni.ConvBn1d``: see :class:`_ConvBn`."""


class ConvBn2d(_ConvBn, nn.Conv2d):
    """QAT ``ConvBn2d``, built from ``nni.ConvBn2d``: see :class:`_ConvBn`."""


class ConvBn3d(_ConvBn, nn.Conv3d):
    """QAT ``ConvBn3d``, built from ``nni.ConvBn3d``: see :class:`_ConvBn`."""


class ConvBnReLU1d(_ReLU, _ConvBn, nn.Conv1d):
    """QAT ``ConvBnReLU1d``, built from ``nni.ConvBnReLU1d``: see :class:`_ConvBn`."""


class ConvBnReLU2d(_ReLU, _ConvBn, nn.Conv2d):
    """QAT ``ConvBnReLU2d``, built from ``nni.ConvBnReLU2d``: see :class:`_ConvBn`."""


class ConvBnReLU3d(_ReLU, _ConvBn, nn.Conv3d):
    """QAT ``ConvBnReLU3d``, built from ``nni.ConvBnReLU3d``: see :class:`_ConvBn`."""


class LinearBn1d(_BnFolding, nnqat.Linear):
    """QAT ``Linear`` + ``BatchNorm1d`` with BN folded into the fake-quantized weight.

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> fused = nni.LinearBn1d(nn.Linear(4, 3), nn.BatchNorm1d(3))
        >>> fused.qconfig = QConfig(nn.Identity, nn.Identity)
        >>> qat = LinearBn1d.from_float(fused)
        >>> qat(torch.randn(5, 4)).shape, type(qat.to_float()).__name__
        (torch.Size([5, 3]), 'Linear')
    """

    def __init__(  # noqa: PLR0913  # Linear's arguments plus BN's
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        freeze_bn: bool = False,
        qconfig: Any = None,
        device: Any = None,
    ) -> None:
        nnqat.Linear.__init__(self, in_features, out_features, bias, qconfig, device)
        self._attach_bn(eps, momentum, freeze_bn)

    def _layer(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)


def freeze_bn_stats(module: nn.Module) -> None:
    """Freeze BN statistics if ``module`` is a BN-folding QAT module; for ``model.apply``.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> _ = model.apply(freeze_bn_stats)  # no BN-folding module: nothing changes
    """
    if isinstance(module, _BnFolding):
        module.freeze_bn_stats()


def update_bn_stats(module: nn.Module) -> None:
    """Resume BN statistics updates if ``module`` is a BN-folding QAT module; for ``model.apply``.

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> m = ConvBn2d(1, 1, 1, freeze_bn=True, qconfig=QConfig(nn.Identity, nn.Identity))
        >>> update_bn_stats(m); m.freeze_bn
        False
    """
    if isinstance(module, _BnFolding):
        module.update_bn_stats()
