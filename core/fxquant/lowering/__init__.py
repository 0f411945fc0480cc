"""The lowering vocabulary: the words the flow, the registry, kernels and plugins share.

    the q/dq ops       torch.ops.fxquant.{quantize,dequantize}_per_{tensor,channel,token},
                       choose_qparams_per_tensor and choose_qparams_per_token_asymmetric
                       (dynamic per-token activations): declared here (their schemas),
                       computed by ``fxquant.numerics.qdq``; the sets of them every module
                       tests nodes against
    QParams            how one tensor at a kernel's boundary is quantized
    Quantize/Dequantize  the steps next to a kernel, offered to its ``absorb``
    LoweringRule       a backend's kernel for one reference pattern (``fxquant_lowering_kernels``)
    LoweringMatch      one place in a reference model that a rule's ``build`` lowers
    Declined           what ``build`` returns instead of ``None`` to say why it declines

A leaf: it imports only the exception tree (``fxquant.errors``) and
``fxquant.config.pattern`` (which normalizes a rule's pattern; its own imports are
the exception tree and the torch.ao class names), both in the base layer, so the
flow, the registry, the core's kernels and every plugin import it without pulling
in each other. ``fxquant.registry.hookspecs`` re-exports the records
for plugins written against it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import torch

from fxquant.config.pattern import simple_to_complex, validate_complex
from fxquant.errors import ConfigError, wrong_type

if TYPE_CHECKING:
    from torch import fx, nn

__all__ = [
    "CHOOSE_QPARAMS_OP",
    "CHOOSE_QPARAMS_PER_TOKEN_OP",
    "DEQUANTIZE_OF",
    "DEQUANTIZE_OPS",
    "PER_CHANNEL_OPS",
    "PER_TOKEN_OPS",
    "QDQ_OPS",
    "QUANTIZE_OPS",
    "STATIC_DEQUANTIZE_OPS",
    "STATIC_QUANTIZE_OPS",
    "AddInput",
    "Declined",
    "Dequantize",
    "LoweringMatch",
    "LoweringRule",
    "QParams",
    "Quantize",
]

# --- the q/dq ops ------------------------------------------------------------------------------

_SCHEMAS = (
    "quantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, "
    "int quant_max, ScalarType dtype) -> Tensor",
    "quantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
    "int quant_max, ScalarType dtype) -> Tensor",
    "dequantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, "
    "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
    "dequantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
    "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
    "quantize_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis, "
    "int quant_min, int quant_max, ScalarType dtype) -> Tensor",
    "dequantize_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis, "
    "int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
    "choose_qparams_per_tensor(Tensor input, int quant_min, int quant_max, ScalarType dtype) "
    "-> (Tensor, Tensor)",
    # dynamic per-token activations: quantized_decomposed's schemas, so ExecuTorch's
    # exporter swaps only the namespace (XNNPACK's dynamic fully-connected path reads them)
    "choose_qparams_per_token_asymmetric(Tensor input, ScalarType dtype) -> (Tensor, Tensor)",
    "quantize_per_token(Tensor input, Tensor scales, Tensor zero_points, int quant_min, "
    "int quant_max, ScalarType dtype) -> Tensor",
    "dequantize_per_token(Tensor input, Tensor scales, Tensor zero_points, int quant_min, "
    "int quant_max, ScalarType dtype, ScalarType output_dtype) -> Tensor",
)


def _declare() -> torch.library.Library:
    # FRAGMENT, not DEF: fxquant.numerics.qdq adds the kernels to the namespace, plugins may add ops
    library = torch.library.Library("fxquant", "FRAGMENT")  # type: ignore[no-untyped-call]  # untyped
    for schema in _SCHEMAS:
        library.define(schema)  # type: ignore[no-untyped-call]  # torch.library is untyped
    return library


# kept alive: torch drops a library's definitions when the Library object is collected
_LIBRARY: Final = _declare()
_OPS = torch.ops.fxquant

DEQUANTIZE_OF: Final[Mapping[torch._ops.OpOverload, torch._ops.OpOverload]] = MappingProxyType(
    {
        _OPS.quantize_per_tensor.default: _OPS.dequantize_per_tensor.default,
        # scale/zero point as tensors: dynamic quantization
        _OPS.quantize_per_tensor.tensor: _OPS.dequantize_per_tensor.tensor,
        _OPS.quantize_per_channel.default: _OPS.dequantize_per_channel.default,
        # dynamic: one scale and zero point per row
        _OPS.quantize_per_token.default: _OPS.dequantize_per_token.default,
    }
)
"""Each quantize op -> the dequantize op with the same qparams arguments."""

QUANTIZE_OPS: Final[frozenset[torch._ops.OpOverload]] = frozenset(DEQUANTIZE_OF)
"""Every fxquant quantize op (float -> integers): what convert writes and export keeps."""

DEQUANTIZE_OPS: Final[frozenset[torch._ops.OpOverload]] = frozenset(DEQUANTIZE_OF.values())
"""Every fxquant dequantize op (integers -> float)."""

QDQ_OPS: Final = QUANTIZE_OPS | DEQUANTIZE_OPS
"""Every quantize and dequantize op: the steps of a reference model."""

STATIC_QUANTIZE_OPS: Final[frozenset[torch._ops.OpOverload]] = frozenset(
    {_OPS.quantize_per_tensor.default, _OPS.quantize_per_channel.default}
)
"""The quantize ops whose qparams are constants of the graph (observed at calibration)."""

STATIC_DEQUANTIZE_OPS: Final = frozenset(DEQUANTIZE_OF[op] for op in STATIC_QUANTIZE_OPS)
"""The dequantize ops whose qparams are constants of the graph."""

PER_CHANNEL_OPS: Final[frozenset[torch._ops.OpOverload]] = frozenset(
    {_OPS.quantize_per_channel.default, _OPS.dequantize_per_channel.default}
)
"""The ops with one scale and zero point per channel of an axis (``scales, zero_points, axis``)."""

PER_TOKEN_OPS: Final[frozenset[torch._ops.OpOverload]] = frozenset(
    {_OPS.quantize_per_token.default, _OPS.dequantize_per_token.default}
)
"""The ops with one scale and zero point per row over the last dimension (a token), chosen
at run time by :data:`CHOOSE_QPARAMS_PER_TOKEN_OP` (``scales, zero_points`` of shape
``input.shape[:-1] + (1,)``)."""

CHOOSE_QPARAMS_OP: Final[torch._ops.OpOverload] = _OPS.choose_qparams_per_tensor.default
"""Dynamic quantization's first step: ``(scale, zero_point)`` of a tensor at run time."""

CHOOSE_QPARAMS_PER_TOKEN_OP: Final[torch._ops.OpOverload] = (
    _OPS.choose_qparams_per_token_asymmetric.default
)
"""Dynamic per-token quantization's first step: asymmetric ``(scales, zero_points)`` of each
row over the last dimension, at run time (XNNPACK's dynamic fully-connected input)."""


# --- the records around a kernel ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QParams:
    """How one tensor at the boundary of a lowered pattern is quantized.

    Args:
        dtype: the integer dtype: ``torch.uint8``, ``torch.int8`` or ``torch.int32``.
        quant_min: smallest integer used.
        quant_max: largest integer used.
        scale: a float (per tensor) or a 1-d float tensor (per channel);
            ``None`` when ``is_dynamic``.
        zero_point: an int (per tensor) or a 1-d integer tensor; ``None``
            when ``is_dynamic``.
        axis: the channel axis for per-channel qparams, else ``None``.
        is_dynamic: qparams are chosen from each input at run time
            (``fxquant.numerics.qdq.choose_qparams_per_tensor``); the kernel then
            receives the float tensor.

    Example:
        >>> import torch
        >>> QParams(torch.uint8, 0, 255, scale=0.02, zero_point=128).is_per_channel
        False
    """

    dtype: torch.dtype
    quant_min: int
    quant_max: int
    scale: float | torch.Tensor | None = None
    zero_point: int | torch.Tensor | None = None
    axis: int | None = None
    is_dynamic: bool = False

    @property
    def is_per_channel(self) -> bool:
        """True when ``scale`` and ``zero_point`` hold one value per channel of ``axis``."""
        return self.axis is not None


@dataclass(frozen=True, slots=True)
class Quantize:
    """A quantize step after a float-output kernel, offered to its ``absorb``.

    Example:
        >>> import torch
        >>> Quantize(QParams(torch.uint8, 0, 255, scale=0.1, zero_point=3)).qparams.zero_point
        3
    """

    qparams: QParams


@dataclass(frozen=True, slots=True)
class Dequantize:
    """The dequantize step after a kernel, offered to its ``absorb`` (see ``LoweringRule``).

    Example:
        >>> import torch
        >>> Dequantize(QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)).qparams.scale
        0.1
    """

    qparams: QParams


@dataclass(frozen=True, slots=True)
class AddInput:
    """A float add of a kernel's output and one other value, offered to its ``absorb``.

    ``True`` means the kernel takes that value as one more (last) argument and
    returns its output plus it, added in float32 after everything else the kernel
    computes, as the add did (a transformer's residual add: no new tensor for the
    sum). A kernel that accepts it then declines every later step.

    Example:
        >>> AddInput()
        AddInput()
    """


@dataclass(frozen=True, slots=True)
class Declined:
    """What a rule's ``build`` returns to decline with a reason: like ``None``, the place
    stays in reference form (``no_lowering_kernel``), and the report's words give ``reason``.

    For a kernel that would be wrong on these qparams on this machine (oneDNN's
    uint8 x int8 products saturate on full-range activations without VNNI): the
    user's model stays correct and ``fxquant.explain`` says what to change.

    Example:
        >>> Declined("the kernel saturates at quant range 0..255; use quant_max=127").reason
        'the kernel saturates at quant range 0..255; use quant_max=127'
    """

    reason: str


@dataclass(frozen=True, slots=True)
class LoweringRule:
    """How a backend lowers one reference pattern to its own kernel.

    ``convert_fx`` matches ``pattern`` in the reference model (the float op
    between ``dequantize`` and ``quantize`` steps: a function such as
    ``torch.add``, a method name, or a module class as it is in the reference
    model, e.g. ``fxquant.nn.reference.Linear`` or ``fxquant.nn.intrinsic.
    LinearReLU``), only where every matched node was quantized at prepare, and
    calls ``build(match)`` with a ``LoweringMatch``. ``build`` returns the
    kernel (an ``nn.Module``, or any callable) or ``None`` to decline, which
    leaves that place in reference form (reported as ``no_lowering_kernel``:
    "lowering rule NAME declined: ..."); :class:`Declined` declines the same way
    and the report gives its reason.

    The pattern must be one that can occur in a reference model: a float
    module that convert swaps for its reference module (``torch.nn.Linear``
    with int8 weights becomes ``fxquant.nn.reference.Linear``), a QAT module
    (converted to float) or a fusion pattern (one fused module by then)
    never does, and the registry refuses such a rule when it assembles the
    backend.

    The kernel is called as ``kernel(*args)``, one argument per entry of
    ``match.inputs``: the integer tensor for a statically quantized input,
    the float tensor for a dynamically quantized one, the value itself
    otherwise. It returns the integer tensor when ``match.output`` is set
    (the output ``quantize`` step is removed), else the float result.

    Epilogues: once every rule has run, a kernel module that defines
    ``absorb(step) -> bool`` is offered, one at a time, what alone reads its
    output: a module called on it alone (a clamp kernel, a float ``nn.GELU``; an
    ``F.gelu`` call is offered as the ``nn.GELU`` it computes),
    ``Dequantize(qparams)`` when only dequantize steps read it, or
    ``Quantize(qparams)`` when one quantize step does, or :class:`AddInput`
    when a float add of the output and another value does. ``True`` means the
    kernel now computes that step too (returning floats after a
    ``Dequantize``, integers after a ``Quantize``); the step is removed and
    the next one offered. Likewise a kernel module with ``absorb_input(step)``
    is offered ``Quantize(qparams)`` when a quantize step alone feeds its
    first argument from float values; ``True`` means the kernel takes the
    floats and quantizes them itself. Last, kernel modules of one class that
    each take the same value as their only argument (a transformer's query,
    key and value projections) are offered to the first one's
    ``merge(others) -> nn.Module | None``; a module returned replaces them all
    and returns a tuple, one result per kernel, in graph order (``None``
    keeps them apart). Results must stay within one output step of the
    reference. An ``nn.Identity`` kernel is removed without asking.

    A rule with ``quantized=False`` lowers float ops instead: it matches only
    where no node of the pattern computes integers (attention's matmul, softmax,
    matmul left float by the qconfig mapping, or asked in bfloat16: then the
    pattern spells out the reference model's ``.to(bfloat16).to(float32)``
    roundings), every ``match.inputs`` entry is ``None`` (the kernel gets the
    float values), ``match.output`` is ``None`` (it returns floats), and the
    report marks the bfloat16 nodes ``lowered`` (float32 ones were never
    quantized). Its kernel must compute what the float ops compute, up to the
    rounding of their dtype.

    Args:
        pattern: the op(s), in the simple pattern format of
            ``BackendPatternConfig`` (or the reversed nested format when
            ``complex_format`` is True).
        build: ``build(match: LoweringMatch)`` -> kernel, ``None`` or :class:`Declined`.
        name: a short name shown by ``fxquant show`` (e.g. ``"qlinear"``).
        complex_format: whether ``pattern`` is in the reversed nested format.
        tolerance: how far the kernel's output may be from the reference
            model's, in quantization steps of the output (default 1: within
            one step). ``fxquant check`` holds the kernel to it on random
            shapes; declare more only for a kernel whose arithmetic is known
            to round differently (and say why next to the rule).
        quantized: ``True`` (the default): the pattern is quantized ops in
            reference form; ``False``: float ops, replaced by a faster float kernel.

    Raises:
        ConfigTypeError: when ``build`` is not callable, ``name`` not a str or
            ``tolerance`` not a number.
        ConfigError: when ``name`` is empty, ``pattern`` is not a valid pattern
            or ``tolerance`` is negative.

    Example:
        >>> from fxquant.nn import reference
        >>> rule = LoweringRule(reference.Linear, build=lambda match: match, name="qlinear")
        >>> rule.name
        'qlinear'
    """

    pattern: Any
    build: Callable[..., Any]
    name: str
    complex_format: bool = False
    tolerance: float = 1.0
    quantized: bool = True

    def __post_init__(self) -> None:
        if self.pattern is None:
            msg = f"LoweringRule {self.name!r} needs a pattern, got None; pass e.g. torch.nn.Linear"
            raise ConfigError(msg)
        if not callable(self.build):
            hint = "; pass a function that builds the kernel"
            raise wrong_type(self.build, "LoweringRule build", "callable", hint)
        if not isinstance(self.name, str):
            raise wrong_type(self.name, "LoweringRule name", "a str")
        if not self.name:
            msg = "LoweringRule name must not be empty; give the kernel a short name"
            raise ConfigError(msg)
        if not isinstance(self.tolerance, (int, float)) or isinstance(self.tolerance, bool):
            raise wrong_type(self.tolerance, "LoweringRule tolerance", "a number of output steps")
        if not self.tolerance >= 0:  # also refuses NaN
            msg = f"LoweringRule tolerance must be >= 0 output steps, got {self.tolerance!r}"
            raise ConfigError(msg)
        _ = self.key  # validates the pattern now, not when the flow first needs it

    @property
    def key(self) -> Hashable:
        """The pattern in the reversed nested format: the key for matching and conflicts."""
        to_key = validate_complex if self.complex_format else simple_to_complex
        key: Hashable = to_key(self.pattern)
        return key


@dataclass(frozen=True, slots=True)
class LoweringMatch:
    """What ``LoweringRule.build`` receives: one place in a reference model to lower.

    Args:
        rule: the rule that matched.
        backend: the backend being lowered to.
        nodes: the matched float nodes (``torch.fx.Node``) in graph order; the
            last is the anchor. Read constant arguments (``dim``, ``alpha``...)
            from ``node.args``/``node.kwargs``.
        modules: for each node, its module when it is a ``call_module`` node
            (a reference module such as ``fxquant.nn.reference.Linear``, which
            has ``get_quantized_weight()`` and ``get_weight_qparams()``), else
            ``None``.
        inputs: one entry per kernel argument, in order: the arguments of the
            matched nodes that are graph values from outside the match
            (positional then keyword, nodes in graph order). ``QParams`` for a
            quantized input, ``None`` for one passed as is (a float bias...).
        output: the qparams of the output ``quantize`` step, or ``None`` when
            the pattern's output stays float (dynamic and weight-only patterns).

    Two shortcuts: ``match.anchor`` is the last node (its result is the pattern's),
    ``match.module`` the first module among ``modules`` (the weighted one: a reference
    Linear or Conv), or ``None``.

    Copy what the kernel needs out of the match: keeping the match itself
    (it holds graph nodes) would keep the whole reference model alive.

    Example:
        >>> import torch
        >>> rule = LoweringRule(torch.add, build=lambda match: None, name="qadd")
        >>> uint8 = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)
        >>> match = LoweringMatch(rule, "mine", (), (), (uint8, uint8), uint8)
        >>> match.output.scale
        0.1
    """

    rule: LoweringRule
    backend: str
    nodes: tuple[fx.Node, ...]
    modules: tuple[nn.Module | None, ...]
    inputs: tuple[QParams | None, ...]
    output: QParams | None

    @property
    def anchor(self) -> fx.Node:
        """The last matched node (its result is the pattern's result)."""
        return self.nodes[-1]

    @property
    def module(self) -> nn.Module | None:
        """The first module among the matched nodes (the weighted one), or ``None``."""
        return next((m for m in self.modules if m is not None), None)
