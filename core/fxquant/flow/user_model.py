"""The user's model is never changed by prepare_fx or by calibrating its result.

``prepare_fx`` works on a copy of the model that shares its *parameters* (no
second copy of the weights) and owns everything else: the module objects, their
attributes and their *buffers* (BatchNorm's ``running_mean``, ``running_var``,
``num_batches_tracked``, any buffer a custom module updates in ``forward``).
Calibrating the prepared model, even in training mode, then cannot write into the
user's tensors: the forward pass never writes parameters, only buffers. (Training
the prepared model with an optimizer would update the shared weights: train with
``prepare_qat_fx``, which copies the whole model.)

A model in training mode is a mistake for post-training quantization:
BatchNorm then normalizes with each batch's statistics and dropout drops values,
so the observers record ranges the eval-mode model never produces. prepare_fx
warns once (:class:`fxquant.errors.CalibrationWarning`) and names the fix, when
the model holds one of torch's modules whose forward depends on the mode
(BatchNorm, InstanceNorm with running statistics, dropout, RReLU); a model
without them computes the same numbers in both modes and gets no warning.
Converting a model left in training mode (``prepared.train()`` for calibration,
a QAT model not put back in eval) warns too, naming the modules that would keep
dropping values or normalizing by batch statistics in the converted model.

Calibrating in training mode, then calling ``.eval()`` before convert, is caught too:
observers follow the prepared model's mode and note a batch they recorded in training
(``observed_in_training``); convert of a PTQ model then warns, naming the mode-dependent
modules. Their effect outlives ``.eval()``: the ranges were recorded from dropout's scaled
values, and BatchNorm's running statistics in the prepared model moved toward the
calibration batches' (14 dB from the float model before quantizing, on a small MLP).

A float64, float16 or bfloat16 model is refused by prepare_fx and prepare_qat_fx
(:class:`fxquant.errors.ConfigTypeError` naming the parameter or buffer and its
dtype): every backend's quantize, dequantize and int8 kernels take and give
float32 (scales are float32), so such a model either failed at run time with
torch's "mat1 and mat2 must have the same dtype" or silently returned float32.
An int8 model keeps nothing of float64's precision: ``model.float()`` first.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from fxquant.errors import CalibrationWarning, ConfigTypeError
from fxquant.numerics.observer import ObserverBase

__all__ = [
    "observe_in_model_mode",
    "own_copy",
    "raise_if_not_float32",
    "warn_if_calibrated_in_training",
    "warn_if_converted_in_training",
    "warn_if_training",
]


def own_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` that shares its parameters and owns its buffers and modules.

    Example:
        >>> bn = nn.BatchNorm1d(2)
        >>> mine = own_copy(bn)
        >>> mine.weight is bn.weight, mine.running_mean is bn.running_mean
        (True, False)
    """
    memo: dict[int, object] = {id(p): p for p in model.parameters()}
    try:
        return copy.deepcopy(model, memo)
    except Exception:  # any attribute deepcopy cannot copy (a lock, a handle)
        if model.training:
            # training would write the user's buffers; refuse rather than share them
            msg = (
                f"prepare_fx needs to copy the buffers of {type(model).__name__} in training "
                "mode (calibration would update the user's BatchNorm statistics) but the model "
                "cannot be deep-copied; call model.eval() before prepare_fx"
            )
            raise TypeError(msg) from None
        return model  # eval mode: forward writes no buffer of torch's modules


def raise_if_not_float32(model: nn.Module, step: str) -> None:
    """Raise ConfigTypeError when a floating parameter or buffer of ``model`` is not float32.

    Example:
        >>> raise_if_not_float32(nn.Linear(1, 1).double(), "prepare_fx")
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigTypeError: prepare_fx quantizes float32 models, ...
    """
    tensors = [*model.named_parameters(), *model.named_buffers()]
    others = [
        f"{name!r} ({str(t.dtype).removeprefix('torch.')})"
        for name, t in tensors
        if t.is_floating_point() and t.dtype != torch.float32
    ]
    if not others:
        return
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    msg = (
        f"{step} quantizes float32 models, but {type(model).__name__} holds {shown}: the "
        "quantized kernels of every backend take and return float32 activations with "
        "float32 scales. Call model.float() and pass float32 example and calibration inputs "
        "(cast the converted model's outputs back if you need another dtype; int8 keeps none "
        "of float64's precision)"
    )
    raise ConfigTypeError(msg)


def warn_if_training(model: nn.Module, step: str) -> None:
    """One :class:`CalibrationWarning` for a model in training mode given to ``step``.

    Example:
        >>> warn_if_training(nn.Linear(1, 1).eval(), "prepare_fx")  # eval: no warning
    """
    if not model.training:
        return
    trained = sorted(
        {type(m).__name__ for m in model.modules() if m.training and _changes_in_training(m)}
    )
    if not trained:
        return  # torch's other modules compute the same in both modes: no number changes
    msg = (
        f"{step} got {type(model).__name__} in training mode, where {_compute(trained)} "
        "differently (batch statistics, dropped values): calibration would record "
        "ranges the model in eval mode never produces. Call model.eval() before "
        f"{step} (prepare_qat_fx is the flow for training). The prepared model works on its "
        "own copy of every buffer: your model's BatchNorm statistics are not changed"
    )
    warnings.warn(msg, CalibrationWarning, stacklevel=3)


def _compute(names: list[str]) -> str:
    """``"Dropout computes"``, ``"BatchNorm2d, Dropout compute"``: the verb agrees."""
    return f"{', '.join(names)} {'computes' if len(names) == 1 else 'compute'}"


def _changes_in_training(module: nn.Module) -> bool:
    # torch's modules whose forward reads self.training; a user's module may too, which
    # the docs ask to avoid by calling model.eval()
    if isinstance(module, nn.modules.batchnorm._NormBase):  # BatchNorm, InstanceNorm
        return bool(module.track_running_stats) or isinstance(
            module, nn.modules.batchnorm._BatchNorm
        )
    return isinstance(module, (nn.modules.dropout._DropoutNd, nn.RReLU))


def _mode_dependent(model: nn.Module, *, training_only: bool) -> list[str]:
    """``'path' (Class)`` of each module of ``model`` whose forward depends on the mode."""
    return [
        f"{name!r} ({type(m).__name__})"
        for name, m in model.named_modules()
        if _changes_in_training(m) and (m.training or not training_only)
    ]


def warn_if_converted_in_training(converted: nn.Module, step: str) -> None:
    """One :class:`CalibrationWarning` when ``converted`` runs mode-dependent modules in training.

    Example:
        >>> warn_if_converted_in_training(nn.Dropout().eval(), "convert_fx")  # eval: no warning
    """
    trained = _mode_dependent(converted, training_only=True)
    if not trained:
        return
    msg = (
        f"{step} got a model in training mode: in the converted model {', '.join(trained)} "
        "would drop values or normalize with each batch's statistics, so its outputs differ "
        f"from the calibrated model's on every call. Call prepared.eval() before {step} (or "
        "converted.eval() after it)"
    )
    warnings.warn(msg, CalibrationWarning, stacklevel=4)


def observe_in_model_mode(prepared: nn.Module) -> None:
    """Put every observer of ``prepared`` in the model's mode (nn.Module makes them training).

    Example:
        >>> from fxquant.observer import MinMaxObserver
        >>> model = nn.Sequential(nn.Linear(1, 1), MinMaxObserver()).eval()
        >>> model[1].training = True  # as a freshly built observer is
        >>> observe_in_model_mode(model)
        >>> model[1].training
        False
    """
    for module in prepared.modules():
        if isinstance(module, ObserverBase):
            module.train(prepared.training)


def warn_if_calibrated_in_training(prepared: nn.Module, step: str) -> None:
    """One :class:`CalibrationWarning` when ``prepared`` was calibrated in training mode.

    Only for post-training quantization (QAT trains in training mode by design), and only
    when the model holds a module whose forward depends on the mode.

    Example:
        >>> warn_if_calibrated_in_training(nn.Dropout(), "convert_fx")  # no observer: silent
    """
    observed = [m for m in prepared.modules() if getattr(m, "observed_in_training", False)]
    changed = _mode_dependent(prepared, training_only=False)
    if not observed or not changed:
        return
    msg = (
        f"{step}: the prepared model was calibrated in training mode ({len(observed)} "
        f"observer(s) recorded batches while training); in training mode "
        f"{_compute(changed)} differently: dropout scales the values it keeps "
        "by 1/(1-p), BatchNorm normalizes with each batch's statistics and moves its "
        "running statistics toward the calibration batches'. The recorded ranges (and "
        "those statistics) are not the eval-mode model's, even after .eval(). Prepare "
        "again, call prepared.eval() and calibrate"
    )
    warnings.warn(msg, CalibrationWarning, stacklevel=4)
