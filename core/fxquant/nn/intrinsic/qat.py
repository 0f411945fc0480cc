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
from fxquant.nn.fusers import check_qat_bn, fold_bn_weights

# the twins of the fused modules that hold a weight to fake-quantize (every one but
# BNReLU and ConvAdd, which keep their float forms in QAT), and the BatchNorm switches
__all__ = [
    *(name for name in nni.__all__ if name.startswith(("ConvBn", "ConvReLU", "Linear"))),
    "freeze_bn_stats",
    "update_bn_stats",
]

BatchNorm = nn.modules.batchnorm._BatchNorm


class LinearReLU(nnqat.Linear):
    """QAT ``Linear`` followed by ReLU; built from ``fxquant.nn.intrinsic.LinearReLU``.

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> fused = nni.LinearReLU(nn.Linear(4, 2), nn.ReLU())
        >>> fused.qconfig = QConfig(nn.Identity, nn.Identity)
        >>> qat = LinearReLU.from_float(fused)
        >>> bool((qat(torch.randn(3, 4)) >= 0).all()), type(qat.to_float()).__name__
        (True, 'LinearReLU')
    """

    _FLOAT_MODULE: ClassVar[type[nn.Module]] = nni.LinearReLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fake-quantized linear, then ReLU."""
        return F.relu(super().forward(x))

    def to_float(self) -> nn.Module:
        """``fxquant.nn.intrinsic.LinearReLU`` of a plain ``nn.Linear`` and ``nn.ReLU``."""
        linear: nn.Linear = super().to_float()  # type: ignore[assignment]  # a plain nn.Linear
        return nni.LinearReLU(linear, nn.ReLU()).train(self.training)


class _FusedConv(nnqat._QATConv):
    """The QAT twin of the fused conv module of its name in :mod:`fxquant.nn.intrinsic`:
    ``from_float`` takes that module (``_FLOAT_MODULE``), and ``ConvBnReLUNd.to_float()``
    gives a ``ConvReLUNd`` (``_FUSED_FLOAT``). A subclass under another name keeps its
    parent's."""

    _FUSED_FLOAT: ClassVar[type[nni.FusedModule] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fused = getattr(nni, cls.__name__, None)
        if isinstance(fused, type) and issubclass(fused, nni.FusedModule):
            cls._FLOAT_MODULE = fused
            if cls.__name__.startswith("ConvBnReLU"):
                cls._FUSED_FLOAT = getattr(nni, cls.__name__.replace("Bn", "", 1))


class _ConvReLU(_FusedConv):
    """QAT conv, then ReLU; ``to_float`` rebuilds the float ``ConvReLUNd`` container.

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> fused = nni.ConvReLU2d(nn.Conv2d(2, 3, 3), nn.ReLU())
        >>> fused.qconfig = QConfig(nn.Identity, nn.Identity)
        >>> qat = ConvReLU2d.from_float(fused)
        >>> qat(torch.randn(1, 2, 4, 4)).shape, type(qat.to_float()).__name__
        (torch.Size([1, 3, 2, 2]), 'ConvReLU2d')
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fake-quantized convolution, then ReLU."""
        return F.relu(super().forward(x))

    def to_float(self) -> nn.Module:
        """The float ``ConvReLUNd`` container of a plain conv and ``nn.ReLU``."""
        return self._FLOAT_MODULE(super().to_float(), nn.ReLU()).train(self.training)


class ConvReLU1d(_ConvReLU, nn.Conv1d):
    """QAT ``ConvReLU1d``, built from ``nni.ConvReLU1d``: see :class:`_ConvReLU`."""


class ConvReLU2d(_ConvReLU, nn.Conv2d):
    """QAT ``ConvReLU2d``, built from ``nni.ConvReLU2d``: see :class:`_ConvReLU`."""


class ConvReLU3d(_ConvReLU, nn.Conv3d):
    """QAT ``ConvReLU3d``, built from ``nni.ConvReLU3d``: see :class:`_ConvReLU`."""


class _BnFolding(nn.Module):
    """Shared by ConvBn*/LinearBn1d: the BN child, its freezing, and the folded forward.

    Example:
        >>> issubclass(ConvBnReLU2d, _BnFolding), issubclass(LinearBn1d, _BnFolding)
        (True, True)
    """

    weight: torch.Tensor
    weight_fake_quant: nn.Module
    bn: BatchNorm
    freeze_bn: bool

    def _attach_bn(self, bn: BatchNorm, freeze_bn: bool) -> None:
        check_qat_bn(type(self).__name__, bn)
        self.bn = bn
        self.freeze_bn = freeze_bn
        self.bn.train(self.training and not freeze_bn)

    def _folded_forward(
        self, x: torch.Tensor, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``bn(run(x, fake_quant(w * s)) / s + b)``; ``run`` applies the layer without bias."""
        running_var: torch.Tensor = self.bn.running_var  # type: ignore[assignment]  # tracked: checked in _attach_bn
        gamma: torch.Tensor = self.bn.weight
        scale = gamma / torch.sqrt(running_var + self.bn.eps)
        weight_shape = [-1] + [1] * (self.weight.dim() - 1)
        out = run(x, self.weight_fake_quant(self.weight * scale.reshape(weight_shape)))
        channel_shape = [1, -1] + [1] * (out.dim() - 2)
        out = out / scale.reshape(channel_shape)
        bias = getattr(self, "bias", None)
        if bias is not None:
            out = out + bias.reshape(channel_shape)
        result: torch.Tensor = self.bn(out)
        return result

    @classmethod
    def from_float(cls, mod: nn.Module) -> Any:
        """Build from the float container (layer, BN), sharing its layer and its BN."""
        qat = super().from_float(mod)  # type: ignore[misc]  # the QAT layer class mixed in
        qat._attach_bn(mod.get_submodule("1"), freeze_bn=False)
        return qat

    def _folded_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return fold_bn_weights(self.weight.detach(), _detach(getattr(self, "bias", None)), self.bn)

    def train(self, mode: bool = True) -> Any:
        """Set training mode; a frozen BN stays in eval mode (running statistics)."""
        self.training = mode
        for child in self.children():
            child.train(mode and not (child is self.bn and self.freeze_bn))
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


def _detach(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach()


_BN_FOR_CONV: dict[type[nn.Module], type[BatchNorm]] = {
    nn.Conv1d: nn.BatchNorm1d,
    nn.Conv2d: nn.BatchNorm2d,
    nn.Conv3d: nn.BatchNorm3d,
}


class _ConvBn(_BnFolding, _FusedConv):
    """QAT conv + BatchNorm (+ ReLU when ``_FUSED_FLOAT`` is set), BN folded into the weight.

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
        bn_cls = _BN_FOR_CONV[self._FLOAT_CONV]
        bn = bn_cls(self.out_channels, eps, momentum, device=kwargs.get("device"))
        self._attach_bn(bn, freeze_bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Conv with the BN-scaled fake-quantized weight, unscaled, then BN (then ReLU)."""
        conv: Callable[..., torch.Tensor] = self._conv_forward
        out = self._folded_forward(x, lambda inp, weight: conv(inp, weight, None))
        return F.relu(out) if self._FUSED_FLOAT is not None else out

    def to_float(self) -> nn.Module:
        """The float conv with BN folded in (wrapped with ReLU for ``ConvBnReLUNd``)."""
        conv = self._FLOAT_CONV(**nnqat.conv_kwargs(self))
        weight, bias = self._folded_params()
        conv.weight = nn.Parameter(weight)
        conv.bias = nn.Parameter(bias)
        conv.train(self.training)
        if self._FUSED_FLOAT is None:
            return conv
        return self._FUSED_FLOAT(conv, nn.ReLU()).train(self.training)


class ConvBn1d(_ConvBn, nn.Conv1d):
    """QAT ``ConvBn1d``, built from ``nni.ConvBn1d``: see :class:`_ConvBn`."""


class ConvBn2d(_ConvBn, nn.Conv2d):
    """QAT ``ConvBn2d``, built from ``nni.ConvBn2d``: see :class:`_ConvBn`."""


class ConvBn3d(_ConvBn, nn.Conv3d):
    """QAT ``ConvBn3d``, built from ``nni.ConvBn3d``: see :class:`_ConvBn`."""


class ConvBnReLU1d(_ConvBn, nn.Conv1d):
    """QAT ``ConvBnReLU1d``, built from ``nni.ConvBnReLU1d``: see :class:`_ConvBn`."""


class ConvBnReLU2d(_ConvBn, nn.Conv2d):
    """QAT ``ConvBnReLU2d``, built from ``nni.ConvBnReLU2d``: see :class:`_ConvBn`."""


class ConvBnReLU3d(_ConvBn, nn.Conv3d):
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

    _FLOAT_MODULE: ClassVar[type[nn.Module]] = nni.LinearBn1d

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
        bn = nn.BatchNorm1d(out_features, eps, momentum, device=device)
        self._attach_bn(bn, freeze_bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Linear with the BN-scaled fake-quantized weight, unscaled, then BN."""
        return self._folded_forward(x, lambda inp, weight: F.linear(inp, weight))

    def to_float(self) -> nn.Module:
        """A plain ``nn.Linear`` with BN folded in."""
        linear = nn.Linear(self.in_features, self.out_features)
        weight, bias = self._folded_params()
        linear.weight = nn.Parameter(weight)
        linear.bias = nn.Parameter(bias)
        return linear.train(self.training)


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
