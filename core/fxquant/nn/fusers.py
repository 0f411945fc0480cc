"""Fuser methods (``fuser_method(is_qat, *modules)``) and the BatchNorm folding they use.

A fuser method receives the matched modules in pattern order and returns the
one module that replaces them. For post-training quantization BatchNorm is
folded into the preceding weight (it is a per-channel affine map once its
statistics are frozen); for QAT it is kept, in a fused container that
``fxquant.nn.intrinsic.qat`` turns into a module that folds while training.

    PTQ:  Conv2d -> BatchNorm2d -> ReLU   =>  ConvReLU2d[Conv2d(folded), ReLU]
    QAT:  Conv2d -> BatchNorm2d -> ReLU   =>  ConvBnReLU2d[Conv2d, BatchNorm2d, ReLU]

A ReLU matched as a function (``F.relu``) arrives as the function; the fusers
replace it with an ``nn.ReLU`` module so the fused container holds modules only.

Folding, per output channel ``c`` with ``s = gamma / sqrt(running_var + eps)``:
``w'[c] = w[c] * s[c]`` and ``b'[c] = (b[c] - running_mean[c]) * s[c] + beta[c]``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.nn import intrinsic as nni
from fxquant.nn.intrinsic import relu_module, type_label

_M = TypeVar("_M", bound=nn.Module)

__all__ = [
    "bn_scale_and_shift",
    "check_qat_bn",
    "fold_bn_into_conv",
    "fold_bn_into_linear",
    "fold_bn_weights",
    "fuse_bn_relu",
    "fuse_conv_bn",
    "fuse_conv_bn_relu",
    "fuse_conv_relu",
    "fuse_convtranspose_bn",
    "fuse_linear_bn",
    "fuse_linear_relu",
    "sequential_fuser",
]

ConvNd = nn.Conv1d | nn.Conv2d | nn.Conv3d
ConvTransposeNd = nn.ConvTranspose1d | nn.ConvTranspose2d | nn.ConvTranspose3d
BatchNormNd = nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d
# an nn.ReLU module, or F.relu / torch.relu when the pattern matched the function
ReLULike = nn.ReLU | Callable[[torch.Tensor], torch.Tensor]

# the BatchNorm that normalizes each foldable layer's output
_BN_AFTER: dict[type[nn.Module], type[nn.modules.batchnorm._BatchNorm]] = {
    nn.Linear: nn.BatchNorm1d,
    nn.Conv1d: nn.BatchNorm1d,
    nn.Conv2d: nn.BatchNorm2d,
    nn.Conv3d: nn.BatchNorm3d,
    nn.ConvTranspose1d: nn.BatchNorm1d,
    nn.ConvTranspose2d: nn.BatchNorm2d,
    nn.ConvTranspose3d: nn.BatchNorm3d,
}
_CONVS = tuple(layer for layer in _BN_AFTER if layer is not nn.Linear)


def _by_first_part(*classes: type[nni.FusedModule]) -> dict[type[nn.Module], type[nni.FusedModule]]:
    return {cls.PARTS[0][1]: cls for cls in classes}


_CONV_BN = _by_first_part(nni.ConvBn1d, nni.ConvBn2d, nni.ConvBn3d)
_CONV_BN_RELU = _by_first_part(nni.ConvBnReLU1d, nni.ConvBnReLU2d, nni.ConvBnReLU3d)
_CONV_RELU = _by_first_part(nni.ConvReLU1d, nni.ConvReLU2d, nni.ConvReLU3d)
_BN_RELU = _by_first_part(nni.BNReLU2d, nni.BNReLU3d)


# ---------------------------------------------------------------- folding math


def bn_scale_and_shift(bn: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel ``(scale, shift)`` an eval-mode BatchNorm applies: ``y = x * scale + shift``.

    Raises:
        ConfigError: when ``bn`` tracks no running statistics (nothing to fold).

    Example:
        >>> bn = nn.BatchNorm1d(2).eval()
        >>> scale, shift = bn_scale_and_shift(bn)
        >>> x = torch.randn(3, 2)
        >>> torch.allclose(bn(x), x * scale + shift)
        True
    """
    mean, var = bn.running_mean, bn.running_var
    if mean is None or var is None:
        msg = (
            f"cannot fold {bn!r}: it has no running statistics (track_running_stats=False); "
            "only a BatchNorm with track_running_stats=True can be folded into a weight"
        )
        raise ConfigError(msg)
    scale = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    shift = -mean * scale
    if bn.bias is not None:
        shift = shift + bn.bias
    return scale, shift


def fold_bn_weights(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    bn: nn.modules.batchnorm._BatchNorm,
    *,
    transpose: bool = False,
    groups: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold an eval-mode BatchNorm into a conv/linear weight and bias; returns new tensors.

    Args:
        weight: ``(out, in/groups, *k)`` for conv and linear, ``(in, out/groups, *k)``
            when ``transpose`` (a transposed convolution).
        bias: the layer's bias, or ``None`` (treated as zeros).
        bn: the BatchNorm applied to the layer's output.
        transpose: ``weight`` is a transposed convolution's.
        groups: the transposed convolution's groups (its output channels are
            spread over dimension 1 of each group's block).

    Example:
        >>> conv, bn = nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3).eval()
        >>> w, b = fold_bn_weights(conv.weight, conv.bias, bn)
        >>> x = torch.randn(1, 2, 4, 4)
        >>> torch.allclose(bn(conv(x)), nn.functional.conv2d(x, w, b), atol=1e-6)
        True
    """
    scale, shift = bn_scale_and_shift(bn)
    scale = scale.to(weight.dtype)
    if bias is None:
        bias = torch.zeros_like(scale)
    new_bias = (bias * scale + shift).to(bias.dtype)
    spatial = [1] * (weight.dim() - 2)
    if not transpose:
        return weight * scale.reshape(-1, 1, *spatial), new_bias
    in_channels, out_per_group = weight.shape[0], weight.shape[1]
    # weight[g * in/groups + i, j] feeds output channel g * out/groups + j
    blocks = weight.reshape(groups, in_channels // groups, out_per_group, *weight.shape[2:])
    scaled = blocks * scale.reshape(groups, 1, out_per_group, *spatial)
    return scaled.reshape(weight.shape), new_bias


def _folded_copy(
    fuser: str, layer: _M, bn: nn.modules.batchnorm._BatchNorm, transpose: bool = False
) -> _M:
    """A copy of ``layer`` with the eval-mode ``bn`` folded into new weight and bias Parameters."""
    _check_eval(fuser, bn)
    weight: torch.Tensor = layer.weight  # type: ignore[assignment]  # a conv or linear
    bias: torch.Tensor | None = getattr(layer, "bias", None)
    transpose = transpose or isinstance(layer, nn.modules.conv._ConvTransposeNd)
    with torch.no_grad():  # new leaf parameters: recording the fold for autograd is waste
        groups = int(getattr(layer, "groups", 1))
        new_weight, new_bias = fold_bn_weights(weight, bias, bn, transpose=transpose, groups=groups)
    # deepcopy minus the weight and bias about to be replaced: copying them would be thrown
    # away (on a ResNet-50 that is 100 MB copied for nothing)
    memo: dict[int, Any] = {id(t): None for t in (weight, bias) if t is not None}
    fused = copy.deepcopy(layer, memo)
    # a frozen layer stays frozen (a user fine-tuning the rest of the model relies on it)
    trains = weight.requires_grad, (bias if bias is not None else weight).requires_grad
    fused.weight = nn.Parameter(new_weight, requires_grad=trains[0])
    fused.bias = nn.Parameter(new_bias, requires_grad=trains[1])
    return fused


def fold_bn_into_conv(
    conv: ConvNd | ConvTransposeNd, bn: nn.modules.batchnorm._BatchNorm, transpose: bool = False
) -> nn.Module:
    """A copy of ``conv`` with the eval-mode ``bn`` folded into its weight and bias.

    Args:
        conv: ``nn.Conv1d/2d/3d`` or, with ``transpose=True``, ``nn.ConvTranspose1d/2d/3d``.
        bn: the BatchNorm of the same dimension that follows ``conv``, in eval mode.
        transpose: ``conv`` is a transposed convolution (detected anyway; kept for
            callers that spell it out, as ``torch.nn.utils.fuse_conv_bn_eval`` does).

    Raises:
        ConfigTypeError: ``conv``/``bn`` are not convolution/BatchNorm modules of one dimension.
        ConfigError: channel counts differ, or ``bn`` is in training mode.

    Example:
        >>> conv, bn = nn.Conv1d(2, 3, 3), nn.BatchNorm1d(3).eval()
        >>> folded = fold_bn_into_conv(conv, bn)
        >>> x = torch.randn(2, 2, 8)
        >>> torch.allclose(folded(x), bn(conv(x)), atol=1e-6)
        True
    """
    _check_layer_bn("fold_bn_into_conv", "conv", conv, bn, _CONVS)
    return _folded_copy("fold_bn_into_conv", conv, bn, transpose)


def fold_bn_into_linear(linear: nn.Linear, bn: nn.BatchNorm1d) -> nn.Linear:
    """A copy of ``linear`` with the eval-mode ``bn`` folded into its weight and bias.

    Example:
        >>> linear, bn = nn.Linear(4, 3), nn.BatchNorm1d(3).eval()
        >>> x = torch.randn(5, 4)
        >>> torch.allclose(fold_bn_into_linear(linear, bn)(x), bn(linear(x)), atol=1e-6)
        True
    """
    _check_layer_bn("fold_bn_into_linear", "linear", linear, bn, (nn.Linear,))
    return _folded_copy("fold_bn_into_linear", linear, bn)


# ---------------------------------------------------------------- validation


def _check_eval(fuser: str, bn: nn.Module) -> None:
    if bn.training:
        msg = (
            f"{fuser}: {bn!r} is in training mode, so its running statistics are not final "
            "and cannot be folded; call model.eval() before post-training fusion "
            "(fuse_fx / prepare_fx), or use prepare_qat_fx to keep BatchNorm trainable"
        )
        raise ConfigError(msg)


def _check_layer_bn(
    fuser: str, arg: str, layer: object, bn: object, layers: tuple[type[nn.Module], ...]
) -> None:
    """``layer`` is one of ``layers`` and ``bn`` the BatchNorm of its dimension and width."""
    if type(layer) not in layers:
        choices = " or ".join(type_label(t) for t in layers)
        msg = (
            f"{fuser}: argument {arg!r} must be a {choices}, "
            f"got {layer!r} of type {type_label(type(layer))}"
        )
        raise ConfigTypeError(msg)
    expected_bn = _BN_AFTER[type(layer)]  # type: ignore[index]  # one of layers, checked above
    if type(bn) is not expected_bn:
        msg = (
            f"{fuser}: argument 'bn' must be a {type_label(expected_bn)} to follow "
            f"{type_label(type(layer))}, got {bn!r} of type {type_label(type(bn))}"
        )
        raise ConfigTypeError(msg)
    what = "out_features" if isinstance(layer, nn.Linear) else "out_channels"
    channels, features = getattr(layer, what), getattr(bn, "num_features", None)
    if channels != features:
        msg = (
            f"{fuser}: the layer's {what} ({channels}) must equal bn.num_features "
            f"({features}); this BatchNorm does not normalize this layer's output"
        )
        raise ConfigError(msg)


def check_qat_bn(owner: str, bn: nn.Module) -> None:
    """Raise :class:`ConfigError` unless QAT can fold ``bn`` while training: it must be affine
    and track running statistics.

    Example:
        >>> check_qat_bn("fuse_conv_bn", nn.BatchNorm2d(3, affine=False))
        Traceback (most recent call last):
        fxquant.errors.ConfigError: fuse_conv_bn: QAT needs a BatchNorm with affine=True ...
    """
    if not (bn.affine and bn.track_running_stats):
        msg = (
            f"{owner}: QAT needs a BatchNorm with affine=True and "
            f"track_running_stats=True, got {bn!r}"
        )
        raise ConfigError(msg)


def _fused_class(
    fuser: str, table: dict[type[nn.Module], type[nni.FusedModule]], module: object
) -> type[nni.FusedModule]:
    found = table.get(type(module)) if isinstance(module, nn.Module) else None
    if found is None:
        choices = ", ".join(type_label(t) for t in table)
        msg = f"{fuser}: cannot fuse {module!r}; expected one of {choices}"
        raise ConfigTypeError(msg)
    return found


# ---------------------------------------------------------------- fuser methods


def fuse_conv_bn(is_qat: bool, conv: ConvNd, bn: BatchNormNd) -> nn.Module:
    """Conv + BatchNorm: a folded plain conv for PTQ, a ``ConvBnNd`` container for QAT.

    Raises:
        ConfigTypeError: the modules are not a conv and a BatchNorm of one dimension.
        ConfigError: channel mismatch; PTQ with ``bn`` in training mode; QAT with a
            BatchNorm that is not affine or tracks no statistics.

    Example:
        >>> conv, bn = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)
        >>> type(fuse_conv_bn(True, conv, bn)).__name__
        'ConvBn2d'
        >>> type(fuse_conv_bn(False, conv.eval(), bn.eval())).__name__
        'Conv2d'
    """
    fused_cls = _fused_class("fuse_conv_bn", _CONV_BN, conv)
    _check_layer_bn("fuse_conv_bn", "conv", conv, bn, _CONVS)
    if is_qat:
        check_qat_bn("fuse_conv_bn", bn)
        return fused_cls(conv, bn)
    return fold_bn_into_conv(conv, bn)


def fuse_conv_bn_relu(is_qat: bool, conv: ConvNd, bn: BatchNormNd, relu: ReLULike) -> nn.Module:
    """Conv + BatchNorm + ReLU: ``ConvReLUNd`` of the folded conv (PTQ) or ``ConvBnReLUNd`` (QAT).

    Example:
        >>> conv, bn = nn.Conv1d(2, 3, 3).eval(), nn.BatchNorm1d(3).eval()
        >>> type(fuse_conv_bn_relu(False, conv, bn, nn.ReLU())).__name__
        'ConvReLU1d'
    """
    relu = relu_module("fuse_conv_bn_relu", relu)
    fused_cls = _fused_class("fuse_conv_bn_relu", _CONV_BN_RELU if is_qat else _CONV_RELU, conv)
    _check_layer_bn("fuse_conv_bn_relu", "conv", conv, bn, _CONVS)
    if is_qat:
        check_qat_bn("fuse_conv_bn_relu", bn)
        return fused_cls(conv, bn, relu)
    return fused_cls(fold_bn_into_conv(conv, bn), relu)


def fuse_linear_bn(is_qat: bool, linear: nn.Linear, bn: nn.BatchNorm1d) -> nn.Module:
    """Linear + BatchNorm1d: a folded ``nn.Linear`` (PTQ) or a ``LinearBn1d`` container (QAT).

    Example:
        >>> linear, bn = nn.Linear(4, 3), nn.BatchNorm1d(3)
        >>> type(fuse_linear_bn(True, linear, bn)).__name__
        'LinearBn1d'
    """
    _check_layer_bn("fuse_linear_bn", "linear", linear, bn, (nn.Linear,))
    if is_qat:
        check_qat_bn("fuse_linear_bn", bn)
        return nni.LinearBn1d(linear, bn)
    return fold_bn_into_linear(linear, bn)


def fuse_convtranspose_bn(is_qat: bool, convt: ConvTransposeNd, bn: BatchNormNd) -> nn.Module:
    """ConvTranspose + BatchNorm, folded (PTQ only: there is no QAT ConvTransposeBn module).

    Raises:
        ConfigError: with ``is_qat=True``; BatchNorm in training mode; channel mismatch.

    Example:
        >>> convt, bn = nn.ConvTranspose2d(2, 3, 3).eval(), nn.BatchNorm2d(3).eval()
        >>> type(fuse_convtranspose_bn(False, convt, bn)).__name__
        'ConvTranspose2d'
    """
    if not isinstance(convt, nn.modules.conv._ConvTransposeNd):
        msg = (
            "fuse_convtranspose_bn: argument 'convt' must be a torch.nn.ConvTranspose1d/2d/3d, "
            f"got {convt!r}"
        )
        raise ConfigTypeError(msg)
    if is_qat:
        msg = (
            "fuse_convtranspose_bn: ConvTranspose + BatchNorm cannot be fused for QAT (no QAT "
            "module keeps the BatchNorm); leave this pattern unfused in the QAT backend config"
        )
        raise ConfigError(msg)
    return fold_bn_into_conv(convt, bn, transpose=True)


def fuse_conv_relu(is_qat: bool, conv: ConvNd, relu: ReLULike) -> nn.Module:
    """Conv + ReLU -> ``ConvReLU1d/2d/3d`` (the same for PTQ and QAT).

    Example:
        >>> type(fuse_conv_relu(False, nn.Conv3d(1, 1, 1), nn.ReLU())).__name__
        'ConvReLU3d'
    """
    del is_qat  # a ReLU has no state: both modes keep the same container
    fused_cls = _fused_class("fuse_conv_relu", _CONV_RELU, conv)
    return fused_cls(conv, relu_module("fuse_conv_relu", relu))


def fuse_linear_relu(is_qat: bool, linear: nn.Linear, relu: ReLULike) -> nn.Module:
    """Linear + ReLU -> ``LinearReLU``.

    Example:
        >>> type(fuse_linear_relu(True, nn.Linear(2, 2), nn.ReLU())).__name__
        'LinearReLU'
    """
    del is_qat
    return nni.LinearReLU(linear, relu_module("fuse_linear_relu", relu))


def fuse_bn_relu(is_qat: bool, bn: nn.BatchNorm2d | nn.BatchNorm3d, relu: ReLULike) -> nn.Module:
    """BatchNorm2d/3d + ReLU -> ``BNReLU2d/3d``.

    Example:
        >>> type(fuse_bn_relu(False, nn.BatchNorm2d(3), nn.ReLU())).__name__
        'BNReLU2d'
    """
    del is_qat
    return _fused_class("fuse_bn_relu", _BN_RELU, bn)(bn, relu_module("fuse_bn_relu", relu))


def sequential_fuser(
    fused_cls: Callable[[nn.Module, nn.Module], nn.Module],
) -> Callable[[bool, nn.Module, nn.Module], nn.Module]:
    """A fuser method that wraps two modules in ``fused_cls`` whatever ``is_qat`` is.

    Backends use it for fusions that keep the modules as they are (``Linear + ReLU``).

    Example:
        >>> fuser = sequential_fuser(nni.LinearReLU)
        >>> type(fuser(False, nn.Linear(2, 2), nn.ReLU())).__name__
        'LinearReLU'
    """

    def fuser(is_qat: bool, first: nn.Module, second: nn.Module) -> nn.Module:
        del is_qat
        return fused_cls(first, second)

    fuser.__name__ = f"fuse_to_{getattr(fused_cls, '__name__', 'module')}"
    fuser.__qualname__ = fuser.__name__
    return fuser
