"""QAT modules: float modules whose weight passes through a fake-quantize module.

``prepare_qat_fx`` swaps each weighted float module for its QAT twin so
training sees the rounding the quantized model will do; ``convert`` turns it
back with ``to_float()`` and builds the reference module from that.

    before: x -> Linear(w) -> y
    after:  x -> Linear(weight_fake_quant(w)) -> y      weight_fake_quant = qconfig.weight()

Gradients reach ``w`` through the fake-quantize module (straight-through).
``from_float`` shares the float module's parameters, as torch.ao's does, so an
optimizer built before the swap keeps training the same tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fxquant import dtypes
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.nn.float_twin import FloatTwin, init_arguments
from fxquant.nn.intrinsic import FusedModule, type_label

__all__ = ["Conv1d", "Conv2d", "Conv3d", "Embedding", "EmbeddingBag", "Linear"]


def require_qconfig(owner: str, qconfig: object) -> Any:
    """Return ``qconfig`` if it can build a weight fake-quantize module, else raise.

    Example:
        >>> require_qconfig("qat.Linear", None)
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: qat.Linear needs a qconfig ...
    """
    if qconfig is None or not callable(getattr(qconfig, "weight", None)):
        msg = (
            f"{owner} needs a qconfig with a weight constructor, got {qconfig!r}; pass "
            "qconfig=QConfig(activation=..., weight=...) (e.g. a default QAT qconfig)"
        )
        raise ConfigError(msg)
    return qconfig


def build_weight_fake_quant(owner: str, qconfig: Any, device: object = None) -> nn.Module:
    """``qconfig.weight()``, checked to be a module and moved to ``device``.

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> build_weight_fake_quant("qat.Linear", QConfig(nn.Identity, nn.Identity))
        Identity()
    """
    fake_quant = qconfig.weight()
    if not isinstance(fake_quant, nn.Module):
        msg = f"{owner}: qconfig.weight() must build an nn.Module, got {fake_quant!r}"
        raise ConfigTypeError(msg)
    if device is not None:
        fake_quant.to(device)  # type: ignore[call-overload]  # device is a torch device or str
    return fake_quant


def qconfig_of(cls: type, mod: nn.Module) -> Any:
    """Check ``mod`` is exactly ``cls._FLOAT_MODULE`` and return its ``qconfig``.

    Example:
        >>> qconfig_of(Linear, nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: qat.Linear.from_float needs mod.qconfig ...
    """
    owner = f"qat.{cls.__name__}.from_float"
    expected: type = cls._FLOAT_MODULE  # type: ignore[attr-defined]  # every QAT class sets it
    if type(mod) is not expected:
        msg = (
            f"{owner} expects a {type_label(expected)}, got {mod!r} of type {type_label(type(mod))}"
        )
        raise ConfigTypeError(msg)
    qconfig = getattr(mod, "qconfig", None)
    if qconfig is None:
        msg = (
            f"{owner} needs mod.qconfig to be set, got a {type(mod).__name__} without one; "
            "set mod.qconfig = QConfig(...) first, or let prepare_qat_fx assign it"
        )
        raise ConfigError(msg)
    return require_qconfig(owner, qconfig)


def root_of(mod: nn.Module) -> Any:
    """The weighted module of ``mod``: its first part when fused, else itself.

    Typed ``Any``: callers have already checked ``mod``'s exact type, so they
    know the root's class (and its attributes) better than a signature can say.

    Example:
        >>> root_of(nn.Sequential(nn.Linear(1, 1)))
        Sequential(
          (0): Linear(in_features=1, out_features=1, bias=True)
        )
    """
    return mod[0] if isinstance(mod, FusedModule) else mod


class WeightOp(nn.Module):
    """Base of the forwards shared by the QAT and reference modules: the float module's op
    on ``used_weight()`` (the fake-quantized weight, or the quantize->dequantized one)
    in place of ``weight``.

    Example:
        >>> from fxquant.nn import reference
        >>> issubclass(Conv3d, Convolving), issubclass(reference.Conv3d, Convolving)
        (True, True)
        >>> issubclass(reference.Embedding, Lookup), issubclass(Linear, Affine)
        (True, True)
    """

    used_weight: Callable[[], torch.Tensor]


class Affine(WeightOp, nn.Linear):
    """``nn.Linear``'s forward over ``used_weight()``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Linear with the weight the subclass computes with."""
        return F.linear(x, self.used_weight(), self.bias)


class Convolving(WeightOp, nn.modules.conv._ConvNd):
    """``nn.Conv1d/2d/3d``'s forward over ``used_weight()``, any padding mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convolution with the weight the subclass computes with."""
        return self._conv_forward(x, self.used_weight(), self.bias)


class _QATWeighted(FloatTwin, nn.Module):
    """Shared by the QAT modules: the float class mixed in (``_float_class``),
    ``weight_fake_quant`` built from a required ``qconfig``, and the round trip to float.
    ``_FLOAT_MODULE``, the class ``from_float`` takes (torch.ao's name), is
    ``_float_class`` unless the class names another (a fused one).

    Example:
        >>> Conv2d._float_class.__name__, Linear._FLOAT_MODULE.__name__
        ('Conv2d', 'Linear')
    """

    _FLOAT_MODULE: ClassVar[type[nn.Module]]
    # builds weight_fake_quant from (owner, qconfig, device); the embeddings check it per row
    _build_fake_quant = staticmethod(build_weight_fake_quant)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_float_class" in vars(cls) and "_FLOAT_MODULE" not in vars(cls):
            cls._FLOAT_MODULE = cls._float_class

    def __init__(self, *args: Any, qconfig: Any = None, **kwargs: Any) -> None:
        self._float_class.__init__(self, *args, **kwargs)
        owner = f"qat.{type(self).__name__}"
        self.qconfig = require_qconfig(owner, qconfig)
        self.weight_fake_quant = self._build_fake_quant(owner, self.qconfig, kwargs.get("device"))

    @classmethod
    def from_float(cls, mod: nn.Module) -> Any:
        """Build from ``mod`` (of type ``_FLOAT_MODULE``, with ``mod.qconfig``), sharing its
        weight and bias Parameters (not copies)."""
        qconfig = qconfig_of(cls, mod)
        root = root_of(mod)
        arguments = init_arguments(root, cls._float_class)
        qat = cls(**arguments, qconfig=qconfig, device=root.weight.device)
        qat.weight = root.weight
        if hasattr(root, "bias"):
            qat.bias = root.bias
        return qat

    def used_weight(self) -> torch.Tensor:
        """``weight_fake_quant(weight)``: the weight the forward computes with."""
        weight: torch.Tensor = self.weight_fake_quant(self.weight)
        return weight

    def to_float(self) -> nn.Module:
        """The plain float module, in this module's training mode, with its weight and bias as
        new Parameters that share their storage (no copy) but not their autograd history.

        Example:
            >>> from fxquant.config.qconfig import QConfig
            >>> qat = Linear(2, 2, qconfig=QConfig(nn.Identity, nn.Identity))
            >>> weight = qat.to_float().weight
            >>> weight is qat.weight, weight.data_ptr() == qat.weight.data_ptr()
            (False, True)
        """
        module = self._float_class(**init_arguments(self, self._float_class))
        for name in ("weight", "bias"):
            value = getattr(self, name, None)
            if isinstance(value, torch.Tensor):
                setattr(module, name, nn.Parameter(value.detach()))
        return module.train(self.training)


class Linear(_QATWeighted, Affine, nn.Linear):
    """``nn.Linear`` whose forward uses ``weight_fake_quant(weight)``.

    Args:
        in_features, out_features, bias, device, dtype: as for ``nn.Linear``.
        qconfig: required; ``qconfig.weight()`` builds ``weight_fake_quant``.

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> float_linear = nn.Linear(4, 2)
        >>> float_linear.qconfig = QConfig(nn.Identity, nn.Identity)
        >>> qat_linear = Linear.from_float(float_linear)
        >>> qat_linear.weight is float_linear.weight
        True
        >>> type(qat_linear.to_float()).__name__
        'Linear'
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        qconfig: Any = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            in_features, out_features, bias, qconfig=qconfig, device=device, dtype=dtype
        )


class _QATConv(_QATWeighted, Convolving):
    """The convolution with ``weight_fake_quant(weight)``; ``nn.ConvNd``'s arguments and a
    keyword ``qconfig`` (required).

    Example:
        >>> from fxquant.config.qconfig import QConfig
        >>> conv = nn.Conv2d(2, 4, 3)
        >>> conv.qconfig = QConfig(nn.Identity, nn.Identity)
        >>> Conv2d.from_float(conv)(torch.randn(1, 2, 5, 5)).shape
        torch.Size([1, 4, 3, 3])
        >>> issubclass(Conv2d, _QATConv), Conv2d._float_class.__name__
        (True, 'Conv2d')
    """


class Conv1d(_QATConv, nn.Conv1d):
    """QAT ``Conv1d``, built from ``nn.Conv1d``: see :class:`_QATConv`."""


class Conv2d(_QATConv, nn.Conv2d):
    """QAT ``Conv2d``, built from ``nn.Conv2d``: see :class:`_QATConv`."""


class Conv3d(_QATConv, nn.Conv3d):
    """QAT ``Conv3d``, built from ``nn.Conv3d``: see :class:`_QATConv`."""


_PER_ROW = ("per_channel_affine_float_qparams", "per_channel_symmetric", "per_channel_affine")


def _embedding_fake_quant(owner: str, qconfig: Any, device: object = None) -> nn.Module:
    # a lookup reads whole rows, so a table is quantized row by row (axis 0): float zero
    # points (torch.ao's embedding qconfigs) or integer ones (ExecuTorch's symmetric int8
    # embedding_byte); the backend's dtype configs decide which it runs
    fake_quant = build_weight_fake_quant(owner, qconfig, device)
    qscheme = getattr(fake_quant, "qscheme", None)
    name = None if qscheme is None else dtypes.qscheme_name(qscheme)
    if name not in _PER_ROW or getattr(fake_quant, "ch_axis", 0) != 0:
        msg = (
            f"{owner} needs a weight fake-quantize per row (qscheme one of {', '.join(_PER_ROW)}, "
            f"ch_axis 0), got qscheme {qscheme!r}; give embeddings a weight-only qconfig: "
            "mapping.set_object_type(nn.Embedding, "
            "fxquant.config.defaults.default_embedding_qat_qconfig)"
        )
        raise ConfigError(msg)
    return fake_quant


_EMBEDDING_ARGS = ("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")
_BAG_ARGS = (*_EMBEDDING_ARGS[1:], "mode", "include_last_offset", "padding_idx")


def embedding_settings(table: nn.Module) -> dict[str, Any]:
    """A table's constructor arguments besides its size: F.embedding(_bag)'s keywords too.

    Example:
        >>> sorted(embedding_settings(nn.EmbeddingBag(3, 2)))[:3]
        ['include_last_offset', 'max_norm', 'mode']
    """
    names = _BAG_ARGS if isinstance(table, nn.EmbeddingBag) else _EMBEDDING_ARGS
    return {name: getattr(table, name) for name in names}


class Lookup(WeightOp):
    """``nn.Embedding``'s forward over ``used_weight()``."""

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """Look up rows of the table the subclass computes with."""
        return F.embedding(indices, self.used_weight(), **embedding_settings(self))


class Pool(WeightOp):
    """``nn.EmbeddingBag``'s forward over ``used_weight()``."""

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pool rows of the table the subclass computes with."""
        weight, settings = self.used_weight(), embedding_settings(self)
        return F.embedding_bag(
            indices, weight, offsets, per_sample_weights=per_sample_weights, **settings
        )


class _QATEmbedding(_QATWeighted):
    """Shared by the QAT embeddings: the weight fake-quantize must work per row.

    Example:
        >>> bag = nn.EmbeddingBag(10, 4)
        >>> EmbeddingBag.from_float(bag)
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: qat.EmbeddingBag.from_float needs mod.qconfig ...
    """

    _build_fake_quant = staticmethod(_embedding_fake_quant)


class Embedding(_QATEmbedding, Lookup, nn.Embedding):
    """``nn.Embedding`` whose lookup uses ``weight_fake_quant(weight)``.

    Takes ``nn.Embedding``'s arguments plus a keyword ``qconfig`` whose weight
    fake-quantize is per row (``per_channel_affine_float_qparams`` or a per-channel
    scheme on axis 0).

    Example:
        >>> emb = nn.Embedding(10, 4)
        >>> emb.qconfig = None
        >>> Embedding.from_float(emb)
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: qat.Embedding.from_float needs mod.qconfig ...
    """


class EmbeddingBag(_QATEmbedding, Pool, nn.EmbeddingBag):
    """``nn.EmbeddingBag`` whose pooling uses ``weight_fake_quant(weight)``."""
