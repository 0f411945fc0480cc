"""Lowering rules: which kernel replaces each reference pattern (shared with fxquant-x86).

    reference.Linear, LinearReLU/LeakyReLU/Tanh   QLinear (onednn.qlinear_pointwise + post op),
                                                  DynamicQLinear, Fp16Linear
    reference.Conv1d/2d/3d, ConvReLU1d/2d/3d      QConv (onednn.qconv{1,2,3}d_pointwise)
    ConvUnary2d (x86's conv + activation)         QConv with a hardtanh / hardswish / swish post op
    ConvAdd2d, ConvAddReLU2d                      QConv with the ``.binary`` "sum" post op
    add (+ relu)                                  QAdd (int arithmetic)
    relu6, hardtanh                               IntegerClamp (absorbed by a conv or linear)
    identity, dropout                             nn.Identity (removed by the flow)
    max pools, reshapes, relu, ...                IntegerOp: the op on the integers themselves
    avg pools, mean                               IntegerOp: averaged integers, rounded
    every other quantized op                      FloatOp: dequantize -> op -> quantize, one module
    float attention (matmul, softmax, matmul)     Attention: scaled_dot_product_attention
                                                  (fxquant_onednn.attention, float-op rules)

Every rule is built from a backend's pattern list (:func:`lowering_rules`), so
each pattern the backend quantizes has a rule.

On a CPU without VNNI oneDNN's uint8 x int8 products saturate in int16 pairs
unless the weights stay within +-64 (``fxquant.lowering.kernels.cpu``): there the linear
and conv rules decline other weights (``Declined``, the report says why), and
the pattern stays in reference form, correct, instead of lowered and wrong.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.backend import BackendPatternConfig, ObservationType
from fxquant.lowering import Declined, LoweringMatch, LoweringRule, QParams
from fxquant.lowering.kernels import boundary, cpu
from fxquant.lowering.kernels.integer import IntegerClamp
from fxquant.nn import intrinsic, reference
from fxquant.numerics import qdq
from torch import fx, nn

from fxquant_onednn.modules import (
    DynamicQLinear,
    Fp16Linear,
    QAdd,
    QConv,
    QLinear,
    explicit_padding,
    symmetric_weight,
)
from fxquant_onednn.patterns import ConvUnary2d, LinearLeakyReLU, LinearTanh

__all__ = ["FloatOp", "IntegerOp", "IntegerReLU", "lowering_rules"]

_ADD = (operator.add, torch.add, "add")
_RELU = (nn.ReLU, F.relu, torch.relu, "relu")
# clamps with fixed bounds: (min, max) from the module, or the function's arguments
_HARDTANH = (nn.ReLU6, nn.Hardtanh, F.relu6, F.hardtanh, F.hardtanh_)
# ops that pick or move values: exact on the integers when input and output share qparams
_SELECT = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d, nn.Identity, nn.Dropout, nn.Flatten, F.max_pool1d, F.max_pool2d,
    F.max_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d,
    F.dropout, torch.flatten, torch.transpose, torch.squeeze, torch.unsqueeze, torch.permute,
    "flatten", "reshape", "view", "permute", "transpose", "squeeze", "unsqueeze",
    "contiguous", "repeat", "detach", "expand", "narrow", "unflatten", "movedim",
)  # fmt: skip
# identities at inference: removed from the lowered model (a conv or linear before them
# can then take over the dequantize step after them)
_IDENTITY = (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
# torch 2.13's uint8 max pooling fails on channels_last input and is slow (8x) on NCHW:
# pool the integers as float (exact) in channels_last instead. 1-d and 3-d: torch has no
# uint8 max_pool1d/3d at all (NotImplementedError; found by `fxquant check x86`)
_MAX_POOL = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d, F.max_pool1d, F.max_pool2d, F.max_pool3d, F.adaptive_max_pool1d,
    F.adaptive_max_pool2d, F.adaptive_max_pool3d,
)  # fmt: skip
# averaging ops: the mean of the integers, rounded, is the reference's result
_AVERAGE = (
    nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d,
    F.adaptive_avg_pool2d, F.adaptive_avg_pool3d, torch.mean, "mean",
)  # fmt: skip


def _tensor(value: object) -> torch.Tensor | None:
    """A module attribute (bias, weight) as a tensor, or None."""
    return value if isinstance(value, torch.Tensor) else None


def _op_of(node: fx.Node, module: nn.Module | None) -> Any:
    return type(module) if module is not None else node.target


# --- weighted ops ---------------------------------------------------------------------------


def _linear_post_op(fused: nn.Module) -> tuple[str, tuple[float, ...]]:
    act = getattr(fused, "act", None)
    if isinstance(fused, intrinsic.LinearReLU):
        return "relu", ()
    if isinstance(act, nn.LeakyReLU):
        return "leaky_relu", (float(act.negative_slope),)
    if isinstance(act, nn.Tanh):
        return "tanh", ()
    return "none", ()


def _saturates(weight: torch.Tensor, x: QParams) -> Declined | None:
    """Declined when oneDNN's u8 x s8 products of ``weight`` and inputs quantized as ``x``
    could saturate on this CPU (no VNNI, weights beyond +-64: ``fxquant.lowering.kernels.cpu``)."""
    reason = cpu.saturation_reason("oneDNN", weight, x)
    return None if reason is None else Declined(reason)


def build_linear(match: LoweringMatch) -> nn.Module | Declined | None:
    """QLinear / DynamicQLinear / Fp16Linear for a reference linear (maybe fused).

    Where oneDNN's products could saturate on this CPU (no VNNI, weights beyond
    +-64), a static input is declined with the reason, and a dynamic one over 7
    bits runs as two exact 7-bit GEMMs (``DynamicQLinear``'s ``split``).

    Example:
        >>> build_linear.__name__
        'build_linear'
    """
    fused = match.module
    if fused is None or len(match.inputs) != 1:
        return None
    linear = fused[0] if isinstance(fused, nn.Sequential) else fused
    post_op, post_op_args = _linear_post_op(fused)
    bias = _tensor(linear.bias)
    x = match.inputs[0]
    if getattr(linear, "weight_dtype", None) == torch.float16 and post_op == "none":
        weight16 = _tensor(linear.weight)
        assert weight16 is not None  # a linear always has a weight
        return Fp16Linear(weight16, bias) if x is None and match.output is None else None
    weight = symmetric_weight(linear)
    if weight is None or x is None:
        return None
    if x.is_dynamic:
        if post_op != "none":
            return None
        # the kernel quantizes its input itself: two exact 7-bit GEMMs where one would saturate
        return DynamicQLinear(*weight, bias, x, split=_saturates(weight[0], x) is not None)
    if x.dtype != torch.uint8:
        return None
    return _saturates(weight[0], x) or QLinear(
        *weight, bias, x, match.output, post_op=post_op, post_op_args=post_op_args
    )


def build_conv(match: LoweringMatch) -> nn.Module | Declined | None:
    """QConv for a reference conv 1d/2d/3d, conv + relu, conv + relu6 / hardtanh / hardswish /
    SiLU (``ConvUnary2d``: the activation as the conv's post op), or conv + add (+ relu).

    Declined (with the reason) where oneDNN's products could saturate on this CPU
    (no VNNI, weights beyond +-64); the added tensor of conv + add is only summed.

    Example:
        >>> build_conv.__name__
        'build_conv'
    """
    fused = match.module
    if fused is None or not match.inputs or any(q is None or q.is_dynamic for q in match.inputs):
        return None
    conv = fused[0] if isinstance(fused, nn.Sequential) else fused
    weight = symmetric_weight(conv)
    if weight is None:
        return None
    padding = explicit_padding(conv)
    if isinstance(padding, str):  # reflect padding, or 'same' padded more on one side
        return Declined(f"{padding}: the conv runs as its reference (float) module")
    relu = isinstance(
        fused, (intrinsic.ConvReLU1d, intrinsic.ConvReLU2d, intrinsic.ConvReLU3d,
                intrinsic.ConvAddReLU2d)
    )  # fmt: skip
    qparams = tuple(q for q in match.inputs if q is not None)
    if any(q.dtype != torch.uint8 for q in qparams) or match.output is None:
        return None
    x, *extra = qparams
    declined = _saturates(weight[0], x)
    if declined is not None:
        return declined
    if extra:
        kernel = QConv(*weight, _tensor(conv.bias), conv, (x, match.output, extra[0]), relu=relu)
        kernel.reuse_accumulate = _last_use_of_accumulate(match)
        return kernel
    kernel = QConv(*weight, _tensor(conv.bias), conv, (x, match.output), relu=relu)
    if isinstance(fused, ConvUnary2d) and not kernel.take_post_op(*fused.post_op()):
        return Declined(
            f"{type(fused.act).__name__} after a 7-bit output's range clamp: oneDNN's conv "
            "takes one post op; the conv runs as its reference module"
        )
    return kernel


def _last_use_of_accumulate(match: LoweringMatch) -> bool:
    """Whether the tensor added by a conv + add is dead after it (the kernel may write into it).

    The kernel receives the integers behind the add's second input; they may be
    overwritten when every other reader of them runs before the anchor.
    """
    inside = set(match.nodes)
    extra = [a for n in match.nodes for a in n.args if isinstance(a, fx.Node) and a not in inside]
    if len(extra) != 2:  # (x, accumulate)
        return False
    source = extra[1].args[0] if extra[1].args else None
    x_source = extra[0].args[0] if extra[0].args else None
    if not isinstance(source, fx.Node) or source is x_source or extra[0] is extra[1]:
        return False  # conv(y) + y: the kernel reads y while it writes the sum
    readers = {
        r
        for d in source.users
        for r in (d.users if d is extra[1] or "dequantize" in str(d.target) else [d])
    }
    order = {node: i for i, node in enumerate(match.anchor.graph.nodes)}
    position = order[match.anchor]
    return all(r in inside or order[r] < position for r in readers)


# --- ops without weights -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Arg:
    """Position of a kernel argument inside a replayed node's arguments."""

    index: int


@dataclass(frozen=True, slots=True)
class _Step:
    """One matched node, replayable without the graph: its op and argument template."""

    kind: str  # "call_function" | "call_method" | "call_module"
    target: Any  # function, method name, or index into the kernel's modules
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _template(value: Any, inside: dict[fx.Node, int], count: list[int]) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v, inside, count) for v in value)
    if isinstance(value, fx.Node):
        if value in inside:
            return _Arg(-1 - inside[value])  # negative: result of an earlier step
        count[0] += 1
        return _Arg(count[0] - 1)
    return value


def _steps(match: LoweringMatch) -> tuple[list[_Step], list[nn.Module]]:
    """The matched nodes as steps; external inputs numbered in the flow's order."""
    inside: dict[fx.Node, int] = {}
    count = [0]
    steps, modules = [], []
    for node, module in zip(match.nodes, match.modules, strict=True):
        target: Any = node.target
        if module is not None:
            modules.append(module)
            target = len(modules) - 1
        args = _template(tuple(node.args), inside, count)
        kwargs = {k: _template(v, inside, count) for k, v in node.kwargs.items()}
        steps.append(_Step(str(node.op), target, args, kwargs))
        inside[node] = len(steps) - 1
    return steps, modules


def _fill(value: Any, inputs: Sequence[Any], results: list[Any]) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_fill(v, inputs, results) for v in value)
    if isinstance(value, dict):  # keyword arguments (F.layer_norm's weight=, bias=)
        return {k: _fill(v, inputs, results) for k, v in value.items()}
    if isinstance(value, _Arg):
        return inputs[value.index] if value.index >= 0 else results[-1 - value.index]
    return value


class _Replay(nn.Module):
    """Runs the matched nodes again on the kernel's arguments."""

    def __init__(self, match: LoweringMatch) -> None:
        super().__init__()
        steps, modules = _steps(match)
        self.steps = steps
        self.ops = nn.ModuleList(modules)

    def replay(self, inputs: Sequence[Any]) -> Any:
        results: list[Any] = []
        for step in self.steps:
            args = _fill(step.args, inputs, results)
            kwargs = _fill(step.kwargs, inputs, results)
            if step.kind == "call_module":
                results.append(self.ops[step.target](*args, **kwargs))
            elif step.kind == "call_method":
                results.append(getattr(args[0], step.target)(*args[1:], **kwargs))
            else:
                results.append(step.target(*args, **kwargs))
        return results[-1]


def _pair(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


@dataclass(frozen=True, slots=True)
class _Pool:
    """A 2-d max pool that :func:`_max_pool_uint8` computes (no dilation, floor mode)."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]


_POOL_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")


def _pool_of(node: fx.Node, module: nn.Module | None) -> _Pool | None:
    if isinstance(module, nn.MaxPool2d):
        given: dict[str, Any] = {name: getattr(module, name) for name in _POOL_ARGS}
    elif node.target is F.max_pool2d:
        given = dict(zip(_POOL_ARGS, node.args[1:], strict=False)) | dict(node.kwargs)
    else:
        return None
    stride = given.get("stride") or given["kernel_size"]
    if (
        _pair(given.get("dilation", 1)) != (1, 1)
        or given.get("ceil_mode")
        or given.get("return_indices")
    ):
        return None
    return _Pool(_pair(given["kernel_size"]), _pair(stride), _pair(given.get("padding", 0)))


def _max_pool_uint8(x: torch.Tensor, pool: _Pool) -> torch.Tensor:
    """Max pool as k strided maxima per axis: exact, channels_last kept, ~3x faster than float.

    Zero padding is exact for uint8: 0 is the smallest value, as -inf is for floats.
    """
    pad_h, pad_w = pool.padding
    if pad_h or pad_w:
        x = F.pad(x, (pad_w, pad_w, pad_h, pad_h))
    for axis in (2, 3):
        size, kernel, stride = x.shape[axis], pool.kernel[axis - 2], pool.stride[axis - 2]
        span = (size - kernel) // stride * stride + 1
        result = x.narrow(axis, 0, span)[(slice(None),) * axis + (slice(None, None, stride),)]
        for offset in range(1, kernel):
            window = x.narrow(axis, offset, span)
            result = torch.maximum(
                result, window[(slice(None),) * axis + (slice(None, None, stride),)]
            )
        x = result
    return x


class IntegerOp(_Replay):
    """An op run on the integers themselves (selection ops), or averaged and rounded.

    Exact when the input and output share qparams, as the backend configures these ops.

    Example:
        >>> IntegerOp.__name__
        'IntegerOp'
    """

    def __init__(self, match: LoweringMatch, *, average: bool) -> None:
        super().__init__(match)
        self.average = average
        self.via_float = _op_of(match.nodes[0], match.modules[0]) in _MAX_POOL
        self.pool = _pool_of(match.nodes[0], match.modules[0])
        out = match.output
        assert out is not None  # checked by the builder
        assert out.zero_point is not None  # static qparams
        self.dtype = out.dtype
        self.zero_point = float(out.zero_point)
        self.bounds = (out.quant_min, out.quant_max)

    def forward(self, *inputs: Any) -> Any:
        """The op on the integer input."""
        if self.pool is not None and inputs[0].dim() == 4:  # NCHW
            return _max_pool_uint8(inputs[0], self.pool)
        if self.via_float:
            return self.replay([inputs[0].float(), *inputs[1:]]).to(self.dtype)
        if not self.average:
            return self.replay(inputs)
        # averaged around the zero point: a padded zero is the real 0 (the zero point), and
        # a divisor_override divides the reals; the plain integers' average was 112 steps off
        # with count_include_pad, 150 with divisor_override=3 (8.1 and -1.8 dB)
        centered = [
            x.float() - self.zero_point if isinstance(x, torch.Tensor) else x for x in inputs
        ]
        averaged = self.replay(centered).round_().add_(self.zero_point)
        return averaged.clamp_(*self.bounds).to(self.dtype)


class IntegerReLU(IntegerClamp):
    """relu on the integers: values below the zero point (negative reals) become it.

    A clamp (:class:`IntegerClamp`), so a conv or linear before it absorbs it.

    Example:
        >>> q = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=100)
        >>> IntegerReLU(q)(torch.tensor([3, 150], dtype=torch.uint8)).tolist()
        [100, 150]
    """

    def __init__(self, out: QParams) -> None:
        super().__init__(int(out.zero_point))  # type: ignore[arg-type]  # static qparams


def _clamp_bounds(node: fx.Node, module: nn.Module | None) -> tuple[float, float] | None:
    """(min, max) of a relu6 / hardtanh node, or None when they are not constants."""
    if isinstance(module, nn.Hardtanh):  # nn.ReLU6 is a Hardtanh(0, 6)
        return float(module.min_val), float(module.max_val)
    if node.target is F.relu6:
        return 0.0, 6.0
    given = dict(zip(("min_val", "max_val"), node.args[1:3], strict=False)) | dict(node.kwargs)
    low, high = given.get("min_val", -1.0), given.get("max_val", 1.0)
    numbers = all(isinstance(v, (int, float)) for v in (low, high))
    return (float(low), float(high)) if numbers else None


def _dequantize(value: Any, q: QParams | None) -> Any:
    if q is None or q.is_dynamic or not isinstance(value, torch.Tensor):
        return value
    if q.is_per_channel:
        assert isinstance(q.scale, torch.Tensor)  # per-channel qparams
        assert isinstance(q.zero_point, torch.Tensor)
        assert q.axis is not None
        return qdq.dequantize_per_channel(
            value, q.scale, q.zero_point, q.axis, q.quant_min, q.quant_max, q.dtype
        )
    assert q.scale is not None  # static qparams
    assert q.zero_point is not None
    return qdq.dequantize_per_tensor(
        value, q.scale, q.zero_point, q.quant_min, q.quant_max, q.dtype
    )


class FloatOp(_Replay):
    """Dequantize the inputs, run the float op, quantize the output: one module, same numerics.

    Example:
        >>> FloatOp.__name__
        'FloatOp'
    """

    def __init__(self, match: LoweringMatch) -> None:
        super().__init__(match)
        self.inputs = match.inputs
        self.output = match.output

    def forward(self, *inputs: Any) -> Any:
        """Reference numerics, with the boundaries kept inside the module."""
        floats = [_dequantize(x, q) for x, q in zip(inputs, self.inputs, strict=True)]
        y = self.replay(floats)
        out = self.output
        if out is None:
            return y
        assert out.scale is not None  # static qparams
        assert out.zero_point is not None
        # float32 quantize: within one step, as every kernel here (2x the float64 path)
        return boundary.quantize_per_tensor(
            y, float(out.scale), int(out.zero_point), out.quant_min, out.quant_max, out.dtype
        )


def _same_qparams(match: LoweringMatch) -> bool:
    out = match.output
    first = match.inputs[0] if match.inputs else None
    return (
        out is not None
        and first is not None
        and not first.is_per_channel
        and (first.dtype, first.scale, first.zero_point) == (out.dtype, out.scale, out.zero_point)
    )


def build_op(match: LoweringMatch) -> nn.Module | Declined:
    """The kernel for an op without weights: QAdd, IntegerOp or FloatOp.

    Example:
        >>> build_op.__name__
        'build_op'
    """
    static = [q for q in match.inputs if q is not None]
    if any(q.is_dynamic for q in static):
        return Declined("its input is quantized per call (dynamic): no static kernel for it")
    if not static:
        return Declined(
            "no integer input: a float op on a reduced float side (bfloat16 or float16 casts "
            "around it); eager runs the reference form, x86's compiled deployment runs it in "
            "bfloat16 (fxquant_x86.deploy)"
        )
    if match.output is None:
        # int8 in, float out (F.linear's config says so): the reference numerics in one module
        return FloatOp(match)
    ops = [_op_of(n, m) for n, m in zip(match.nodes, match.modules, strict=True)]
    if (
        ops[0] in _ADD
        and len(static) == 2 == len(match.inputs)
        and ops[1:] in ([], *[[r] for r in _RELU])
    ):
        return QAdd(static[0], static[1], match.output, relu=len(ops) == 2)
    if len(ops) == 1 and len(static) == 1 and _same_qparams(match):
        if ops[0] in _IDENTITY:
            return nn.Identity()
        if ops[0] in _RELU:
            return IntegerReLU(match.output)
        bounds = _clamp_bounds(match.nodes[0], match.modules[0]) if ops[0] in _HARDTANH else None
        if bounds is not None:
            return IntegerClamp.for_reals(match.output, *bounds)
        if ops[0] in _SELECT:
            return IntegerOp(match, average=False)
        if ops[0] in _AVERAGE:
            return IntegerOp(match, average=True)
    return FloatOp(match)


# --- the rules ------------------------------------------------------------------------------

_Build = Callable[[LoweringMatch], nn.Module | Declined | None]

_WEIGHTED: tuple[tuple[type[nn.Module], _Build, str], ...] = (
    (reference.Linear, build_linear, "onednn.qlinear_pointwise"),
    (intrinsic.LinearReLU, build_linear, "onednn.qlinear_pointwise(relu)"),
    (LinearLeakyReLU, build_linear, "onednn.qlinear_pointwise(leaky_relu)"),
    (LinearTanh, build_linear, "onednn.qlinear_pointwise(tanh)"),
    (reference.Conv1d, build_conv, "onednn.qconv1d_pointwise"),
    (reference.Conv2d, build_conv, "onednn.qconv2d_pointwise"),
    (reference.Conv3d, build_conv, "onednn.qconv3d_pointwise"),
    (intrinsic.ConvReLU1d, build_conv, "onednn.qconv1d_pointwise(relu)"),
    (intrinsic.ConvReLU2d, build_conv, "onednn.qconv2d_pointwise(relu)"),
    (intrinsic.ConvReLU3d, build_conv, "onednn.qconv3d_pointwise(relu)"),
    (ConvUnary2d, build_conv, "onednn.qconv2d_pointwise(hardtanh / hardswish / swish)"),
    (intrinsic.ConvAdd2d, build_conv, "onednn.qconv2d_pointwise.binary(sum)"),
    (intrinsic.ConvAddReLU2d, build_conv, "onednn.qconv2d_pointwise.binary(sum, relu)"),
    # oneDNN has no int8 transposed conv on plain tensors: reference numerics in one module
    (reference.ConvTranspose1d, build_op, "FloatOp(conv_transpose1d)"),
    (reference.ConvTranspose2d, build_op, "FloatOp(conv_transpose2d)"),
    (reference.ConvTranspose3d, build_op, "FloatOp(conv_transpose3d)"),
)


def _in_reference_model(config: BackendPatternConfig) -> bool:
    """Whether the config's pattern survives to the reference model as quantized ops (not
    fused away, not a shape read such as ``x.size()``, which prepare leaves float)."""
    return (
        config.observation_type is not ObservationType.INPUT_OUTPUT_NOT_OBSERVED
        and config.fuser_method is None
        and config.reference_quantized_module is None
        and config.fused_module is None
        and config.qat_module is None
    )


def _op_name(config: BackendPatternConfig) -> str:
    from fxquant.config.pattern import pattern_str

    pattern = config.pattern if config.pattern is not None else config.normalized_pattern
    return f"kernel for {pattern_str(pattern)}"


def lowering_rules(
    configs: Sequence[BackendPatternConfig], *, recurrent_engine: str = "onednn"
) -> list[LoweringRule]:
    """A rule for every pattern in ``configs`` that can appear in a reference model.

    Weighted modules get the oneDNN kernels above; every other pattern gets
    :func:`build_op` (QAdd, IntegerOp, FloatOp). The float attention rules of
    :mod:`fxquant_onednn.attention` come last. Dynamic int8 LSTM / GRU / cells run
    torch's quantized recurrent ops on the quantized engine ``recurrent_engine``
    (``fxquant_quantized_engine.recurrent``): oneDNN has no plain-tensor RNN kernel.

    Example:
        >>> from fxquant_onednn.patterns import pattern_configs
        >>> rules = lowering_rules(pattern_configs())
        >>> rules[0].name
        'onednn.qlinear_pointwise'
    """
    # imported here: attention's kernel replays its ops with this module's _Replay
    # torch's quantized recurrent ops, on a quint8 engine
    from fxquant_quantized_engine.embedding import embedding_rule
    from fxquant_quantized_engine.recurrent import recurrent_rules

    from fxquant_onednn.attention import attention_rules

    rules = [LoweringRule(cls, build=build, name=name) for cls, build, name in _WEIGHTED]
    rules += recurrent_rules(recurrent_engine)
    rules.append(embedding_rule("onednn"))  # weight-only tables: rows gathered, dequantized
    seen = {rule.key for rule in rules}
    for config in configs:
        key = config.normalized_pattern
        if key in seen or not _in_reference_model(config) or _is_weighted_class(key):
            continue
        seen.add(key)
        rules.append(LoweringRule(key, build=build_op, name=_op_name(config), complex_format=True))
    return [*rules, *attention_rules()]


def _is_weighted_class(key: Any) -> bool:
    # float/QAT weighted modules are swapped for reference modules before lowering
    weighted = (nn.Linear, nn.modules.conv._ConvNd, nn.Embedding, nn.EmbeddingBag, nn.RNNBase)
    return isinstance(key, type) and issubclass(key, weighted)
