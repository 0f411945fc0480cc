"""The lowering rules: which kernel runs each reference pattern, for any quint8 engine.

The same for every quint8 engine: the plugins call ``lowering_rules(engine, their
pattern configs)`` and state only the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from fxquant.lowering import Declined, LoweringRule
from fxquant.lowering.kernels import cpu
from fxquant.lowering.kernels.integer import IntegerClamp
from fxquant.nn import intrinsic
from fxquant.nn import reference as reference_modules
from torch import nn

from fxquant_quantized_engine.bias import (
    bias_rounding_reason,
    depthwise_saturation_reason,
    requantize_overflow_reason,
)
from fxquant_quantized_engine.conv_add import QuantizedConvAdd
from fxquant_quantized_engine.embedding import embedding_rule
from fxquant_quantized_engine.engine import (
    _QINT8,
    _Quiet,
)
from fxquant_quantized_engine.float_output import float_output_reason
from fxquant_quantized_engine.modules import (
    QuantizedBinary,
    QuantizedCat,
    QuantizedConv,
    QuantizedConvTranspose,
    QuantizedLinear,
    QuantizedLinearDynamic,
    QuantizedLinearFP16,
    QuantizedUnary,
    explicit_padding,
)
from fxquant_quantized_engine.ops import (
    ChannelQParams,
    QuantizedOps,
    Step,
    _input_qparams,
)
from fxquant_quantized_engine.recurrent import recurrent_rules
from fxquant_quantized_engine.upsample import has_quint8_kernel, interpolate_quint8
from fxquant_quantized_engine.views import (
    TensorQParams,
    _tensor_qparams,
    as_quint8,
    as_uint8,
)


def build_conv_transpose(engine: str) -> Callable[[Any], nn.Module | Declined | None]:
    """A rule builder for reference transposed convs: per-tensor weights -> the quint8 kernel.

    Per-channel weights (not supported by the engines' transposed kernels) are replayed
    in float by the reference module itself, and so is every transposed conv on fbgemm:
    FBGEMM's ``quantized::conv_transpose2d`` in torch 2.13 is wrong once both channel
    counts reach 8 (2.6 off a 0.018 step at 8 -> 8 channels; torch.ao's own fbgemm
    lowering shows the same error), which the hypothesis test of the fbgemm plugin found.
    QNNPACK's ``quantized::conv_transpose3d`` is wrong for every shape (a 1x1x1 kernel is
    3.3 off a 0.02 step; -4.6 dB against the reference's 36.7, lowered without a word):
    a 3-d transposed conv on qnnpack is replayed too. A kernel whose requantization could
    pass int32 is declined, as for a conv (:func:`requantize_overflow_reason`).

    Example:
        >>> callable(build_conv_transpose("fbgemm"))
        True
    """

    def build(match: Any) -> nn.Module | Declined | None:
        reference = match.module
        qx, out = _tensor_qparams(match.inputs[0]), _tensor_qparams(match.output)
        if qx is None or out is None:
            return None
        per_tensor = torch.as_tensor(reference.get_weight_qparams()["scale"]).numel() == 1
        broken = engine == "fbgemm" or (engine == "qnnpack" and reference.weight.dim() == 5)
        if per_tensor and not broken:
            overflow = requantize_overflow_reason(engine, reference, qx, out)
            if overflow is not None:
                return Declined(overflow)
            return QuantizedConvTranspose(engine, reference, qx, out)
        step = Step("module", 0, (("input", 0),), {})
        return QuantizedOps(engine, [step], [qx], out, native=False, modules=[reference])

    return build


_NATIVE_FUNCTIONS: frozenset[Any] = frozenset(
    {
        torch.nn.functional.max_pool1d,
        torch.nn.functional.max_pool2d,
        torch.nn.functional.max_pool3d,
        torch.nn.functional.relu,
        torch.nn.functional.dropout,
        torch.nn.functional.interpolate,
        torch.nn.functional.pixel_shuffle,
        torch.nn.functional.pixel_unshuffle,
        torch.relu,
        torch.flatten,
        torch.mean,
        torch.squeeze,
        torch.unsqueeze,
        torch.transpose,
        torch.chunk,
        torch.repeat_interleave,
        torch.sigmoid,
        torch.tanh,
        torch.nn.functional.hardsigmoid,
    }
)


_NATIVE_METHODS = frozenset(
    {
        "relu", "contiguous", "detach", "flatten", "mean", "permute", "repeat",
        "reshape", "resize_", "shape", "size", "squeeze", "transpose", "unsqueeze", "view",
        "chunk", "sigmoid", "tanh", "expand", "narrow", "unflatten", "movedim",
    }
)  # fmt: skip


_NATIVE_MODULES: tuple[type[nn.Module], ...] = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.ReLU, nn.Identity,
    nn.Dropout, nn.Flatten, nn.Upsample, nn.PixelShuffle,
    nn.Sigmoid, nn.Tanh, nn.Hardsigmoid,
)  # fmt: skip


# average pooling runs in float (dequantize, average, quantize), as the reference does: the
# quint8 kernels round an average's ties their own way, one step off on most of a 2x2
# window's outputs, which a float-output linear after it no longer hides (ResNet's
# head on fbgemm, 1.6 dB below its reference)


def _is_native(kind: str, target: Any, module: nn.Module | None) -> bool:
    if kind == "module":
        return isinstance(module, _NATIVE_MODULES)
    if kind == "method":
        return target in _NATIVE_METHODS
    return target in _NATIVE_FUNCTIONS


def _template(value: Any, refs: dict[Any, Any], counter: list[int]) -> Any:
    """Node args -> Step args, numbering outside inputs in the order the flow passes them."""
    if isinstance(value, torch.fx.Node):
        if value in refs:
            return refs[value]
        counter[0] += 1
        return ("input", counter[0] - 1)
    if isinstance(value, (list, tuple)):
        return type(value)(_template(v, refs, counter) for v in value)
    return value


def _steps(match: Any) -> tuple[list[Step], list[nn.Module], bool]:
    """The matched nodes as Steps, the modules they call, and whether all run on quint8."""
    refs: dict[Any, Any] = {}
    counter = [0]
    steps: list[Step] = []
    modules: list[nn.Module] = []
    native = True
    for index, (node, module) in enumerate(zip(match.nodes, match.modules, strict=True)):
        args = _template(tuple(node.args), refs, counter)
        kwargs = {k: _template(v, refs, counter) for k, v in node.kwargs.items()}
        kind = {"call_module": "module", "call_method": "method"}.get(node.op, "function")
        target: Any = node.target
        if kind == "module":
            modules.append(module)
            target = len(modules) - 1
        native = native and _is_native(kind, node.target, module)
        if node.target is torch.nn.functional.interpolate:  # the kernels' gaps: upsample.py
            native = native and has_quint8_kernel(args, kwargs)
            target = interpolate_quint8
        steps.append(Step(kind, target, args, kwargs))
        refs[node] = ("step", index)
    return steps, modules, native


_VIEW_METHODS = frozenset(
    {"contiguous", "detach", "flatten", "permute", "reshape", "squeeze", "transpose",
     "unsqueeze", "view", "expand", "narrow", "repeat", "unflatten", "movedim"}
)  # fmt: skip


_INTEGER_FUNCTIONS: frozenset[Any] = frozenset(
    {
        torch.flatten, torch.squeeze, torch.unsqueeze, torch.transpose,
        torch.nn.functional.max_pool1d, torch.nn.functional.max_pool2d,
        torch.nn.functional.max_pool3d,
    }
)  # fmt: skip


_INTEGER_MODULES: tuple[type[nn.Module], ...] = (
    nn.Flatten, nn.Identity, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
)  # fmt: skip


_RELUS: frozenset[Any] = frozenset({torch.relu, torch.nn.functional.relu, "relu"})


_MAX_POOLS: tuple[type[nn.Module], ...] = (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d)


_MAX_POOL_FUNCTIONS: frozenset[Any] = frozenset(
    {torch.nn.functional.max_pool1d, torch.nn.functional.max_pool2d, torch.nn.functional.max_pool3d}
)


def max_pool_integers(
    x: torch.Tensor, pool: Callable[..., torch.Tensor], *args: Any, **kwargs: Any
) -> torch.Tensor:
    """Max pooling of uint8 values through a quint8 view (no copy; max ignores qparams).

    torch 2.13's uint8 max pooling refuses channels_last inputs of 32x32 and more
    ("input_depth * input_height * input_width <= int max"), and the conv kernels
    return channels_last; the quint8 kernel pools them natively.

    Example:
        >>> x = torch.arange(16, dtype=torch.uint8).reshape(1, 1, 4, 4)
        >>> max_pool_integers(x, torch.nn.functional.max_pool2d, 2).flatten().tolist()
        [5, 7, 13, 15]
    """
    if x.dtype != torch.uint8:
        return pool(x, *args, **kwargs)
    with _Quiet():
        return as_uint8(pool(as_quint8(x, 1.0, 0), *args, **kwargs))


def _integer_step(step: Step, module: nn.Module | None, out: TensorQParams) -> Step | None:
    """``step`` as an op on the integers (same qparams in and out), or None.

    relu is ``clamp_min(zero_point)`` and relu6 a clamp to the integers of 0 and 6:
    exact, where QNNPACK's quint8 relu6 is off by up to 119 steps (torch 2.13).
    """
    zero_point = out.zero_point
    six = min(out.quant_max, round(6.0 / out.scale) + zero_point)
    relu6 = isinstance(module, nn.ReLU6) or step.target is torch.nn.functional.relu6
    if relu6 and not step.kwargs.get("inplace", False):
        return Step("function", torch.clamp, (step.args[0], zero_point, six), {})
    if step.kind == "module":
        if isinstance(module, nn.ReLU):
            return Step("function", torch.clamp_min, (*step.args, zero_point), {})
        if isinstance(module, _MAX_POOLS):
            return Step("function", max_pool_integers, (step.args[0], module), {})
        return step if isinstance(module, _INTEGER_MODULES) else None
    if step.target in _RELUS and not step.kwargs.get("inplace", False):
        return Step("function", torch.clamp_min, (step.args[0], zero_point), {})
    if step.kind == "method":
        return step if step.target in _VIEW_METHODS else None
    if step.target in _MAX_POOL_FUNCTIONS:
        pooled = (step.args[0], step.target, *step.args[1:])
        return Step("function", max_pool_integers, pooled, dict(step.kwargs))
    return step if step.target in _INTEGER_FUNCTIONS else None


def _integer_steps(
    steps: Sequence[Step],
    modules: Sequence[nn.Module],
    inputs: Sequence[Any],
    out: TensorQParams,
) -> list[Step] | None:
    """The steps run on the integers when that is exact, else None."""
    if len(inputs) != 1 or inputs[0] != out:
        return None  # requantization needed: not a pure integer op
    found = []
    for step in steps:
        module = modules[step.target] if step.kind == "module" else None
        integer = _integer_step(step, module, out)
        if integer is None:
            return None
        found.append(integer)
    return found


def build_ops(engine: str) -> Callable[[Any], nn.Module | None]:
    """A rule builder for non-weighted patterns: add/mul/cat kernels, else replayed ops.

    Example:
        >>> callable(build_ops("fbgemm"))
        True
    """

    def build(match: Any) -> nn.Module | None:
        out = _tensor_qparams(match.output)
        if out is None and match.output is not None:
            return None
        inputs = [_input_qparams(q) for q in match.inputs]
        if any(q is None and p is not None for q, p in zip(inputs, match.inputs, strict=True)):
            return None  # an int8 activation or a dynamic input: no quint8 kernel takes it
        if out is None:  # int8 in, float out (an F.linear): the float ops on the inputs
            if not any(n.target is torch.nn.functional.linear for n in match.nodes):
                return None  # a tensor-info op (size, shape): its output is no tensor
            steps, modules, _ = _steps(match)
            return QuantizedOps(engine, steps, inputs, None, native=False, modules=modules)
        tensors = [q for q in inputs if not isinstance(q, ChannelQParams)]
        kernel = _special(engine, match, tensors, out) if len(tensors) == len(inputs) else None
        if kernel is not None:
            return kernel
        steps, modules, native = _steps(match)
        integer = _integer_steps(steps, modules, inputs, out)
        if integer is not None:
            clamp = _integer_clamp(integer)
            if clamp is not None:
                return clamp
            return QuantizedOps(engine, integer, inputs, out, True, modules, integer=True)
        native = native and len(tensors) == len(inputs)
        return QuantizedOps(engine, steps, inputs, out, native=native, modules=modules)

    return build


def _integer_clamp(steps: Sequence[Step]) -> IntegerClamp | None:
    """The integer steps as an :class:`IntegerClamp` when they are one relu or relu6."""
    if len(steps) != 1 or steps[0].args[:1] != (("input", 0),):
        return None
    step = steps[0]
    if step.target is torch.clamp_min and len(step.args) == 2:
        return IntegerClamp(int(step.args[1]))
    if step.target is torch.clamp and len(step.args) == 3:
        return IntegerClamp(int(step.args[1]), int(step.args[2]))
    return None


def _special(
    engine: str, match: Any, inputs: Sequence[TensorQParams | None], out: TensorQParams
) -> nn.Module | None:
    names = [_op_name(n, m) for n, m in zip(match.nodes, match.modules, strict=True)]
    tensors = [q for q in inputs if q is not None]
    if len(tensors) != len(inputs):
        return None
    relu = len(names) == 2 and names[1] == "relu"
    if names[0] in ("add", "iadd", "mul", "imul") and len(inputs) == 2 and len(names) <= 1 + relu:
        op = "mul" if "mul" in names[0] else "add"
        return QuantizedBinary(engine, op, (tensors[0], tensors[1]), out, relu=relu)
    if names == ["cat"] and len(inputs) >= 1:
        node = match.nodes[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        return QuantizedCat(engine, tensors, out, int(dim))
    if names == ["hardswish"] and len(inputs) == 1:
        return QuantizedUnary(engine, "hardswish", tensors[0], out)
    return None


def _op_name(node: Any, module: nn.Module | None) -> str:
    if node.op == "call_method":
        return str(node.target)
    if module is not None:
        return type(module).__name__.lower()
    return str(getattr(node.target, "__name__", ""))


def _fbgemm_saturation(engine: str, reference: Any, x: Any) -> str | None:
    """Why FBGEMM's u8 x s8 products of this weight could saturate on this CPU, or None.

    FBGEMM adds pairs of products in int16 on CPUs without VNNI, as oneDNN does
    (``fxquant.lowering.kernels.cpu``: exact for weights within +-64, or a dynamic input
    within 7 bits), and its depthwise conv on every CPU. QNNPACK's kernels widen every
    product first: never.
    """
    if engine != "fbgemm" or x is None:
        return None
    weight = reference.get_quantized_weight()
    weight = weight.int_repr() if weight.dtype == _QINT8 else weight
    if not x.is_dynamic and not isinstance(reference, nn.Linear):
        depthwise = depthwise_saturation_reason(reference, weight, x)
        if depthwise is not None:
            return depthwise
    return cpu.saturation_reason("FBGEMM", weight, x)


def build_weighted(engine: str, relu: bool) -> Callable[[Any], nn.Module | Declined | None]:
    """A rule builder for reference linear/conv modules (plain, or fused with relu).

    Static uint8 -> :class:`QuantizedLinear` / :class:`QuantizedConv`; a dynamic input
    -> :class:`QuantizedLinearDynamic`; an fp16 weight -> :class:`QuantizedLinearFP16`.
    On fbgemm without VNNI, weights beyond +-64 are declined with the reason (static)
    or split in two exact halves (dynamic: :class:`QuantizedLinearDynamic`'s ``split``).

    Example:
        >>> callable(build_weighted("qnnpack", relu=True))
        True
    """

    def build(match: Any) -> nn.Module | Declined | None:
        module = match.module
        reference = module[0] if relu else module
        weight_dtype = reference.get_weight_qparams().get("dtype")
        is_linear = isinstance(reference, nn.Linear)
        x = match.inputs[0] if match.inputs else None
        if weight_dtype == torch.float16 and is_linear and not relu and match.output is None:
            return QuantizedLinearFP16(engine, reference)
        if weight_dtype not in (torch.int8, _QINT8):
            return None
        saturation = _fbgemm_saturation(engine, reference, x)
        if x is not None and x.is_dynamic and is_linear and not relu:
            narrow = int(x.quant_max) - int(x.quant_min) <= 127
            split = saturation is not None
            return QuantizedLinearDynamic(engine, reference, reduce_range=narrow, split=split)
        qx, out = _tensor_qparams(x), _tensor_qparams(match.output)
        if qx is None or (out is None and not (is_linear and match.output is None)):
            return None
        saturation = saturation or requantize_overflow_reason(engine, reference, qx, out)
        saturation = saturation or bias_rounding_reason(engine, reference, qx, out)
        if saturation is not None:
            return Declined(saturation)
        if out is None:  # int8 in, float out
            reason = float_output_reason(engine, qx)
            if reason is not None:
                return Declined(reason)
        if not is_linear:
            padding = explicit_padding(reference)
            if isinstance(padding, str):
                return Declined(f"{padding}: the conv runs as its reference (float) module")
        kernel = QuantizedLinear if is_linear else QuantizedConv
        return kernel(engine, reference, qx, out, relu=relu)

    return build


def build_conv_add(engine: str, relu: bool) -> Callable[[Any], nn.Module | Declined | None]:
    """A rule builder for ``ConvAdd2d`` / ``ConvAddReLU2d``: :class:`QuantizedConvAdd`.

    Both inputs and the output static uint8; on fbgemm without VNNI, weights beyond
    +-64 are declined with the reason, as for a plain conv.

    Example:
        >>> callable(build_conv_add("fbgemm", relu=False))
        True
    """

    def build(match: Any) -> nn.Module | Declined | None:
        reference = match.module[0]
        if reference.get_weight_qparams().get("dtype") not in (torch.int8, _QINT8):
            return None
        if len(match.inputs) != 2:
            return None
        x, extra = (_tensor_qparams(q) for q in match.inputs)
        out = _tensor_qparams(match.output)
        if x is None or extra is None or out is None:
            return None
        saturation = _fbgemm_saturation(engine, reference, match.inputs[0])
        saturation = saturation or requantize_overflow_reason(engine, reference, x, out)
        saturation = saturation or bias_rounding_reason(engine, reference, x, out)
        if saturation is not None:
            return Declined(saturation)
        padding = explicit_padding(reference)
        if isinstance(padding, str):
            return Declined(f"{padding}: the conv runs as its reference (float) module")
        return QuantizedConvAdd(engine, reference, (x, extra, out), relu=relu)

    return build


_WEIGHTED: tuple[tuple[str, bool], ...] = (
    ("Linear", False), ("Conv1d", False), ("Conv2d", False), ("Conv3d", False),
    ("LinearReLU", True), ("ConvReLU1d", True), ("ConvReLU2d", True), ("ConvReLU3d", True),
)  # fmt: skip


def lowering_rules(engine: str, configs: Sequence[Any]) -> list[Any]:
    """One LoweringRule per reference pattern of ``configs``, running on ``engine``.

    Weighted modules (reference linear/conv, fused with relu or not) get the prepacked
    kernels; every other simple pattern gets :func:`build_ops` (add/mul/cat kernels, ops
    replayed on quint8 tensors, or the float fallback). Patterns that never appear in a
    reference model (float weighted modules, QAT modules, fusion inputs) get no rule.

    Example:
        >>> from fxquant.patterns import linear_configs
        >>> sorted(r.name for r in lowering_rules("fbgemm", linear_configs([])))[:2]
        ['fbgemm_conv1d', 'fbgemm_conv2d']
    """
    rules: dict[Any, Any] = {}
    for name, relu in _WEIGHTED:
        cls = getattr(intrinsic if relu else reference_modules, name)
        rule = LoweringRule(
            cls, build=build_weighted(engine, relu), name=f"{engine}_{name.lower()}"
        )
        rules[rule.key] = rule
    for cls, relu in ((intrinsic.ConvAdd2d, False), (intrinsic.ConvAddReLU2d, True)):
        name = f"{engine}_{cls.__name__.lower()}"
        rule = LoweringRule(cls, build=build_conv_add(engine, relu), name=name)
        rules[rule.key] = rule
    for dims in (1, 2, 3):
        cls = getattr(reference_modules, f"ConvTranspose{dims}d")
        name = f"{engine}_conv_transpose{dims}d"
        rule = LoweringRule(cls, build=build_conv_transpose(engine), name=name)
        rules[rule.key] = rule
    for rule in recurrent_rules(engine):  # dynamic int8 LSTM / GRU / cells
        rules[rule.key] = rule
    lookup = embedding_rule(engine)  # weight-only tables: rows gathered, then dequantized
    rules[lookup.key] = lookup
    for config in configs:
        pattern = _reference_pattern(config)
        if pattern is None:
            continue
        rule = LoweringRule(pattern, build=build_ops(engine), name=f"{engine}_ops")
        rules.setdefault(rule.key, rule)
    return list(rules.values())


def _reference_pattern(config: Any) -> Any:
    """The pattern as it appears in the reference model, or None when it never does."""
    if config.pattern is None or config.reference_quantized_module is not None:
        return None  # complex-format patterns, and weighted modules (swapped at convert)
    if config.fused_module is not None:
        return config.fused_module  # e.g. (BatchNorm2d, ReLU) is BNReLU2d after fusion
    if config.fuser_method is not None or config.qat_module is not None:
        return None
    pattern = config.pattern
    parts = pattern if isinstance(pattern, tuple) else (pattern,)
    if any(isinstance(p, type) and p.__module__.startswith("fxquant.nn.qat") for p in parts):
        return None
    return pattern
