"""Ops without a quint8 kernel: replayed on the integers, or through float, in one module."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from fxquant.numerics import qdq
from torch import nn

from fxquant_quantized_engine.engine import (
    _engine_id,
)
from fxquant_quantized_engine.views import (
    TensorQParams,
    _quint8_input,
    _quint8_template,
    _run_on,
    _tensor_qparams,
    as_quint8,
)


@dataclass(frozen=True, slots=True)
class ChannelQParams:
    """Per-channel qparams of an integer input (a functional op's weight), dequantized in float.

    Example:
        >>> q = ChannelQParams(torch.tensor([0.5]), torch.tensor([0]), 0, -128, 127, torch.int8)
        >>> q.dequantize(torch.tensor([[2]], dtype=torch.int8)).tolist()
        [[1.0]]
    """

    scales: torch.Tensor
    zero_points: torch.Tensor
    axis: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype

    def dequantize(self, values: torch.Tensor) -> torch.Tensor:
        """The float values of ``values``."""
        return qdq.dequantize_per_channel(
            values,
            self.scales,
            self.zero_points,
            self.axis,
            self.quant_min,
            self.quant_max,
            self.dtype,
        )


@dataclass(frozen=True, slots=True)
class Step:
    """One op of a matched pattern, replayed by :class:`QuantizedOps`.

    ``target`` is a function, a method name (``kind == "method"``) or the index of a
    submodule (``kind == "module"``). In ``args``/``kwargs`` an ``("input", i)``
    reference stands for the kernel's i-th argument and ``("step", j)`` for the
    result of step j.

    Example:
        >>> Step("function", torch.sigmoid, (("input", 0),), {}).kind
        'function'
    """

    kind: str
    target: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _resolve(value: Any, inputs: Sequence[Any], results: Sequence[Any]) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] in ("input", "step"):
        return inputs[value[1]] if value[0] == "input" else results[value[1]]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, inputs, results) for v in value)
    return value


def _standard_strides(quantized: torch.Tensor) -> torch.Tensor:
    """A contiguous N x C x 1 x 1 tensor viewed with the standard strides (no copy).

    A quint8 conv result keeps channels_last strides; at a 1 x 1 spatial size (a
    classifier's last conv on small images: ShuffleNetV2's ``conv5`` at 32 x 32) they are
    ``(C, 1, C, C)``, which read as both formats, and torch's quint8 ``mean`` over the
    last dims then asks for a channels_last result of the reduced rank ("required rank 4
    tensor to use channels_last format"). The standard strides address the same memory.
    """
    if quantized.dim() != 4 or quantized.size(2) != 1 or quantized.size(3) != 1:
        return quantized
    if quantized.stride(3) == 1 or not quantized.is_contiguous():
        return quantized
    size = quantized.size()
    return quantized.as_strided(size, (size[1], 1, 1, 1), quantized.storage_offset())


class QuantizedOps(nn.Module):
    """Replays a pattern's ops on quint8 tensors (``native``) or on float values.

    Integer mode (``integer=True``) runs ops that are exact on the integers themselves
    (reshapes, max pooling, relu as ``clamp_min(zero_point)``) on the uint8 tensors,
    when the output keeps the input's qparams: no quint8 view, no engine. Native mode
    runs ops that torch implements on quint8 tensors (average pooling, sigmoid, tanh,
    ...); a result whose qparams differ from the output's is requantized. Float mode
    dequantizes the inputs with torch's vectorized kernel, runs the float ops and
    quantizes the result: for ops with no int8 kernel (``out=None``: returns it float,
    an int8-in, float-out pattern).

    Example:
        >>> q = TensorQParams(1 / 256, 0)
        >>> steps = (Step("function", torch.sigmoid, (("input", 0),), {}),)
        >>> kernel = QuantizedOps("fbgemm", steps, (TensorQParams(0.1, 128),), q, native=True)
        >>> kernel(torch.tensor([128], dtype=torch.uint8)).tolist()
        [128]
    """

    def __init__(  # noqa: PLR0913, PLR0917  # the op list, its qparams and three switches
        self,
        engine: str,
        steps: Sequence[Step],
        inputs: Sequence[TensorQParams | ChannelQParams | None],
        out: TensorQParams | None,
        native: bool,
        modules: Sequence[nn.Module] = (),
        integer: bool = False,
    ) -> None:
        super().__init__()
        self.engine, self.steps, self.inputs, self.out = engine, tuple(steps), tuple(inputs), out
        self.native, self.integer = native, integer
        self.step_modules = nn.ModuleList(modules)
        self._single_step = self._single()
        # no in-place method (resize_...) among the steps: they may read a kernel's result
        self._reads_only = not any(
            step.kind == "method" and str(step.target).endswith("_") for step in self.steps
        )
        self._engine = _engine_id(engine)

    def _single(self) -> Step | None:
        """The one step when it takes input 0 first and constants after (the common case)."""
        if len(self.steps) != 1 or len(self.inputs) != 1:
            return None
        step = self.steps[0]
        consts = step.args[1:]
        if not step.args or step.args[0] != ("input", 0) or step.kwargs:
            return None
        refs = [a for a in consts if isinstance(a, tuple) and a[:1] in (("input",), ("step",))]
        return None if refs else step

    def _run(self, values: Sequence[Any]) -> Any:
        single = self._single_step
        if single is not None:  # no argument templates to resolve: saves ~10 us per call
            x, consts = values[0], single.args[1:]
            if single.kind == "module":  # the dict itself: ModuleList indexing costs 1 us
                return self.step_modules._modules[str(single.target)](x, *consts)
            if single.kind == "method":
                return getattr(x, single.target)(*consts)
            return single.target(x, *consts)
        results: list[Any] = []
        for step in self.steps:
            args = _resolve(step.args, values, results)
            kwargs = {k: _resolve(v, values, results) for k, v in step.kwargs.items()}
            if step.kind == "module":
                results.append(self.step_modules[step.target](*args, **kwargs))
            elif step.kind == "method":
                results.append(getattr(args[0], step.target)(*args[1:], **kwargs))
            else:
                results.append(step.target(*args, **kwargs))
        return results[-1]

    def _view(self, value: Any, qparams: TensorQParams | ChannelQParams | None) -> Any:
        if qparams is None:
            return value
        if isinstance(qparams, ChannelQParams):
            return qparams.dequantize(value)
        if self._reads_only:  # a kernel's result, as it holds it: no new view
            template = _quint8_template(qparams.scale, qparams.zero_point)
            quantized = _quint8_input(value, template, qparams.scale, qparams.zero_point)
        else:
            quantized = as_quint8(value, qparams.scale, qparams.zero_point)
        return _standard_strides(quantized) if self.native else quantized.dequantize()

    def forward(self, *values: Any) -> torch.Tensor:
        if self.integer:
            return self._run(values)  # type: ignore[no-any-return]  # the last step's tensor
        return _run_on(self._engine, self._run_quantized, values)

    def _run_quantized(self, values: Sequence[Any]) -> torch.Tensor:
        """The steps on quint8 views (or their floats), then the result in ``out``'s integers."""
        result = self._run([self._view(v, q) for v, q in zip(values, self.inputs, strict=True)])
        out = self.out
        if out is None:  # a float output (int8 in, float out): as the float ops return it
            return result.dequantize() if result.is_quantized else result
        if result.is_quantized:
            if result.q_scale() == out.scale and result.q_zero_point() == out.zero_point:
                return out.finish(result)  # no holder: the result may view an input
            result = result.dequantize()
        return out.quantize(result)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # torch's is untyped
        self._engine = _engine_id(self.engine)  # engine ids belong to the running torch


def _input_qparams(qparams: Any) -> TensorQParams | ChannelQParams | None:
    if qparams is not None and qparams.is_per_channel and not qparams.is_dynamic:
        return ChannelQParams(
            torch.as_tensor(qparams.scale).detach().clone(),
            torch.as_tensor(qparams.zero_point).detach().clone(),
            int(qparams.axis),
            int(qparams.quant_min),
            int(qparams.quant_max),
            qparams.dtype,
        )
    return _tensor_qparams(qparams)
