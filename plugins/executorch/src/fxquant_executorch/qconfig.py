"""The default QConfigMapping of the executorch backend: what XNNPACK runs fast and accurately.

Linear layers: dynamic int8 with per-token activations, XNNPACK's dynamic
fully-connected path (its ``qd8`` kernels: int8 in, fp32 out). Each token (row over
the last dimension) of a Linear's input gets its own asymmetric int8 scale and zero
point at run time (``PerTokenObserver``: nothing to calibrate), the weights are
symmetric per-output-channel int8, and the output stays float. On a BERT-family
encoder a per-tensor int8 input spends its range on a few outlier channels and a
static int8 output requantizes the residual stream: all-MiniLM-L6-v2's ``.pte`` was
at 0.865 mean cosine to float with static int8 Linear layers, 0.999 with these
(``docs/guide/accuracy.md``). The ops of :data:`TRANSFORMER_FLOAT_OPS` (LayerNorm,
softmax, GELU, attention's matmuls, residual adds, the reshapes between them) and
standalone relus stay float: int8, XNNPACK would requantize between each of them
and the float Linear outputs. Convs (and their fused relu) keep static int8.

Everything else, PTQ: histogram observers on int8 activations over the full -128..127 range
(XNNPACK's ``qs8`` is asymmetric: the zero point follows the data), with
``eps = 2**-12`` so no scale falls under the backend's bound; symmetric
per-output-channel int8 weights in -127..127 (XNNPACK's ``qc8w``: zero point
0, one scale per channel). The same choice as ExecuTorch's own
``XNNPACKQuantizer`` with ``get_symmetric_quantization_config(is_per_channel=True)``,
so the two produce the same kind of program.

Overrides: transposed convs take per-tensor symmetric weights (a per-channel
observer's axis 0 is their *input* channel), embeddings weight-only int8
per row (looked up in the int8 table by the portable runtime's
``embedding_byte``), the activations of :data:`FLOAT_ACTIVATIONS` (sigmoid, tanh,
hardswish, hardsigmoid, SiLU, Mish, ELU) float: XNNPACK runs them in float32 between its
int8 nodes, and ``explain`` says ``qconfig_none`` for them.

QAT: moving-average fake-quantize on the same ranges (the Linear inputs per
token, unobserved while training), so a QAT model converts to the same kind of program.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.nn import intrinsic
from fxquant.patterns.qconfigs import embedding_qat_qconfig
from torch import nn

__all__ = [
    "FLOAT_ACTIVATIONS",
    "FLOAT_RELUS",
    "LINEAR_OPS",
    "TRANSFORMER_FLOAT_OPS",
    "default_qconfig_mapping",
    "dynamic_qconfig",
    "dynamic_qconfig_mapping",
    "global_qconfig",
    "static_qconfig_mapping",
]

TRANSFORMER_FLOAT_OPS: tuple[Any, ...] = (
    nn.LayerNorm, F.layer_norm, operator.add, torch.add, "add",
    nn.Softmax, F.softmax, torch.softmax, "softmax", nn.GELU, F.gelu,
    torch.matmul, operator.matmul, torch.bmm, "matmul",
    nn.Dropout, F.dropout, "view", "reshape", "permute", "transpose", "contiguous",
    torch.reshape, torch.permute, torch.transpose,
    # the head split of fxquant's own MultiheadAttention rewrite (flow/transformer.py)
    "narrow", "unflatten", "movedim", torch.narrow, torch.unflatten, torch.movedim,
    # sdpa is attention's matmuls in one call; eager attention's scores / sqrt(d) and a GELU
    # written out (ALBERT's pow) are float math like the rest. No XNNPACK pattern takes
    # them: left to the global qconfig, explain and strict mode reported each as skipped
    F.scaled_dot_product_attention, operator.truediv, torch.div, "div",
    operator.pow, torch.pow, "pow",
)  # fmt: skip
"""Kept float by the default mapping: a transformer's ops around its Linear layers.

The Linear layers return float (dynamic per-token int8); int8, each of these would
quantize its float input again and XNNPACK would requantize the residual stream and
LayerNorm's outlier channels between them. XNNPACK runs them in float32. A CNN's residual
adds run in float between its convs' int8 outputs and the next quantize step."""

FLOAT_RELUS: tuple[Any, ...] = (nn.ReLU, F.relu, torch.relu, "relu", "relu_")
"""Standalone relus stay float (after a float add or Linear output, an int8 relu would
only add a quantize step); a relu fused into a conv keeps its conv's int8 qconfig."""

FLOAT_ACTIVATIONS: tuple[Any, ...] = (
    nn.Sigmoid, torch.sigmoid, F.sigmoid, "sigmoid", nn.Tanh, torch.tanh, F.tanh, "tanh",
    nn.Hardswish, F.hardswish, nn.Hardsigmoid, F.hardsigmoid,
    nn.SiLU, F.silu, nn.Mish, F.mish, nn.ELU, F.elu,
)  # fmt: skip
"""Float in every mapping: XNNPACK runs them in float32 between its int8 nodes (ExecuTorch 1.5
has no int8 XNNPACK kernel for them; its ELU config is disabled, so ELU runs in the portable
runtime). Left to the global qconfig, they matched no pattern: ``explain`` called them
skipped and ``strict=True`` refused a MobileNetV3's hardswish or a RegNet's SE sigmoid,
where ``qconfig_none`` is what happens."""

LINEAR_OPS: tuple[Any, ...] = (nn.Linear, F.linear, intrinsic.LinearReLU)
"""Dynamic int8 per token by default (the fused class too: it outranks its parts)."""

_FUSED_WITH_RELU = (
    intrinsic.ConvReLU1d,
    intrinsic.ConvReLU2d,
    intrinsic.ConvBnReLU1d,
    intrinsic.ConvBnReLU2d,
    intrinsic.BNReLU2d,
)

_EPS = 2**-12
_ACTIVATION: dict[str, Any] = {
    "dtype": torch.int8,
    "quant_min": -128,
    "quant_max": 127,
    "qscheme": torch.per_tensor_affine,
    "eps": _EPS,
}
_WEIGHT: dict[str, Any] = {"dtype": torch.int8, "quant_min": -127, "quant_max": 127, "eps": _EPS}
_TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d, F.conv_transpose1d, F.conv_transpose2d)


def _qconfigs(is_qat: bool) -> tuple[QConfig, QConfig, QConfig]:
    """(global, transposed conv, embedding) qconfigs."""
    from fxquant.numerics import fake_quantize as fq
    from fxquant.numerics import observer as obs

    per_channel = {"qscheme": torch.per_channel_symmetric, "ch_axis": 0, **_WEIGHT}
    per_tensor = {"qscheme": torch.per_tensor_symmetric, **_WEIGHT}
    if is_qat:
        act: Any = fq.FakeQuantize.with_args(
            observer=obs.MovingAverageMinMaxObserver, **_ACTIVATION
        )
        weight: Any = fq.FakeQuantize.with_args(
            observer=obs.MovingAveragePerChannelMinMaxObserver, **per_channel
        )
        tensor_weight: Any = fq.FakeQuantize.with_args(
            observer=obs.MovingAverageMinMaxObserver, **per_tensor
        )
    else:
        act = obs.HistogramObserver.with_args(**_ACTIVATION)
        weight = obs.PerChannelMinMaxObserver.with_args(**per_channel)
        tensor_weight = obs.MinMaxObserver.with_args(**per_tensor)
    # QAT: the table's rows fake-quantized on the same symmetric int8 grid
    embedding = (
        embedding_qat_qconfig(torch.int8)
        if is_qat
        else QConfig(
            activation=obs.PlaceholderObserver.with_args(dtype=torch.float),
            weight=obs.PerChannelMinMaxObserver.with_args(**per_channel),
        )
    )
    return (
        QConfig(activation=act, weight=weight),
        QConfig(activation=act, weight=tensor_weight),
        embedding,
    )


def global_qconfig(is_qat: bool = False) -> QConfig:
    """The qconfig of every op but transposed convs and embeddings.

    Example:
        >>> observer = global_qconfig().activation()
        >>> observer.dtype, observer.quant_min, observer.quant_max
        (torch.int8, -128, 127)
    """
    return _qconfigs(is_qat)[0]


def static_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """Static int8 wherever XNNPACK has an int8 kernel (opt-in; the default keeps a
    transformer's ops around its Linear layers float).

    Linear layers with int8 outputs on a calibrated grid, adds, relus and reshapes
    int8: every op of a CNN in XNNPACK's int8 kernels, with no float step between
    them. Not for transformers (all-MiniLM-L6-v2: 0.865 mean cosine to float).

    Example:
        >>> mapping = static_qconfig_mapping()
        >>> mapping.qconfig_for("", torch.add) is mapping.global_qconfig
        True
        >>> mapping.qconfig_for("", torch.nn.Linear).activation().is_dynamic
        False
    """
    base, transposed, embedding = _qconfigs(is_qat)
    mapping = QConfigMapping().set_global(base)
    overrides: list[tuple[tuple[Any, ...], QConfig | None]] = [
        (_TRANSPOSED, transposed),
        ((nn.Embedding, nn.EmbeddingBag, F.embedding), embedding),
        (FLOAT_ACTIVATIONS, None),
    ]
    for ops, qconfig in overrides:
        for op in ops:
            mapping.set_object_type(op, qconfig)
    return mapping


def default_qconfig_mapping(is_qat: bool = False) -> QConfigMapping:
    """The mapping ``fxquant.get_default_qconfig_mapping("executorch", is_qat)`` returns.

    :func:`static_qconfig_mapping` with dynamic per-token int8 Linear layers and a
    transformer's other ops and standalone relus float (module docstring).

    Example:
        >>> mapping = default_qconfig_mapping()
        >>> weight = mapping.global_qconfig.weight()
        >>> weight.qscheme, weight.quant_min, weight.quant_max
        (torch.per_channel_symmetric, -127, 127)
        >>> mapping.qconfig_for("", torch.nn.Linear).activation().is_per_token
        True
        >>> mapping.qconfig_for("", torch.nn.LayerNorm) is None
        True
    """
    base = global_qconfig(is_qat)
    mapping = static_qconfig_mapping(is_qat)
    for op in (*TRANSFORMER_FLOAT_OPS, *FLOAT_RELUS):
        mapping.set_object_type(op, None)
    # a fused class outranks its parts' entries: conv + relu stays int8 with the relus float
    for fused in _FUSED_WITH_RELU:
        mapping.set_object_type(fused, base)
    linear = dynamic_qconfig(is_qat)
    for op in LINEAR_OPS:
        mapping.set_object_type(op, linear)
    return mapping


def dynamic_qconfig(is_qat: bool = False) -> QConfig:
    """Dynamic int8 linear: per-token int8 activations, symmetric per-channel int8 weights.

    What XNNPACK's dynamic fully-connected kernels run (int8 in, fp32 out): each
    token (row over the last dimension) of the input quantized at run time with
    its own asymmetric qparams (``fxquant.observer.PerTokenObserver``; XNNPACK
    quantizes a dynamic input per token whatever the graph says, so the reference
    model does too). One XNNPACK node, no calibration; the output stays float.
    ``is_qat``: the weights are fake-quantized while training.

    Example:
        >>> observer = dynamic_qconfig().activation()
        >>> observer.is_dynamic, observer.is_per_token
        (True, True)
    """
    from fxquant.numerics import fake_quantize as fq
    from fxquant.numerics import observer as obs

    per_channel = {"qscheme": torch.per_channel_symmetric, "ch_axis": 0, **_WEIGHT}
    weight: Any = obs.PerChannelMinMaxObserver.with_args(**per_channel)
    if is_qat:
        weight = fq.FakeQuantize.with_args(
            observer=obs.MovingAveragePerChannelMinMaxObserver, **per_channel
        )
    return QConfig(activation=obs.PerTokenObserver.with_args(dtype=torch.int8), weight=weight)


def dynamic_qconfig_mapping() -> QConfigMapping:
    """Dynamic int8 for every linear layer, everything else float (no calibration needed).

    Example:
        >>> dynamic_qconfig_mapping().object_type_qconfigs[torch.nn.Linear].activation().dtype
        torch.int8
    """
    mapping = QConfigMapping()
    for op in LINEAR_OPS:
        mapping.set_object_type(op, dynamic_qconfig())
    return mapping
