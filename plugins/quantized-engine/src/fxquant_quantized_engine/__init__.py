"""fxquant-quantized-engine: what the fbgemm and qnnpack backends share.

PyTorch's quint8-based int8 kernels (``torch.ops.quantized``) behind
plain-integer modules, the lowering rules that pick them, and the patterns
and default mapping of a backend on them. A library for the two plugins that
depend on it (``fxquant-fbgemm``, ``fxquant-qnnpack``): it registers no backend.

The fbgemm and qnnpack engines only have kernels that take ``torch.quint8``
tensors, which PyTorch 2.13 deprecates. The modules here keep those tensors
inside: the lowered graph carries plain ``torch.uint8`` tensors, and each
kernel views them as quint8 for the call, then views the result back::

    uint8 --view--> quint8 --torch.ops.quantized.linear (engine E)--> quint8 --view--> uint8

Both views share storage (measured on a 131 kB activation, 1 thread: the view
costs 5-8 us, ``int_repr()`` 280 us and ``_make_per_tensor_quantized_tensor``
6-20 us, both copies), so a chain of kernels passes its activations without
a copy. Each call selects the module's engine and restores the previous one;
the deprecation warning torch raises (once per process) when a quint8 tensor
is created is filtered inside the kernel, by its exact message, so a lowered
model's forward never shows it. Prepacked weights are rebuilt from the integer
weight buffers after ``load_state_dict``, unpickling and ``copy.deepcopy``.

Per-call cost is all that differs between these kernels and torch.ao's modules (same ops),
so: each forward is a closure bound on first call (op, packed weight, qparams);
a kernel's uint8 output is remembered, weakly, with the quint8 result it views,
and a kernel it feeds takes that result instead of a new view; conv/linear/add
kernels ``absorb`` the relu/relu6 clamp and the dequantize that alone follow
them (clamped in place on their fresh result; ``r.dequantize()``), and
``absorb_input`` a float quantize that alone feeds them.

    engine.py    the engine switch; torch's deprecation warning kept inside kernels
    views.py     uint8 <-> quint8 views; kernel outputs remembered for the next kernel
    modules.py   weighted, binary, cat, unary and clamp kernel modules (and ``absorb``)
    ops.py       ops without a quint8 kernel (on the integers, or through float)
    conv_add.py  conv + add (+ relu): the engine's conv, then its add
    rules.py     which kernel runs each reference pattern (``lowering_rules``)
    patterns.py  a backend's patterns from its engine's constraints (``engine_pattern_configs``)
    qconfig.py   its default mapping (``engine_default_qconfig_mapping``; a transformer's
                 adds, LayerNorm, softmax, GELU and matmuls float; ``conv_adds_int8``)
    float_output.py  int8 in, float out linear on each engine
    backend.py   a backend's hooks from its data (``engine_plugin``): fbgemm's and
                 qnnpack's plugin.py are a few lines each
    recurrent.py     dynamic int8 LSTM / GRU / cells on torch's quantized recurrent ops
"""

from __future__ import annotations

from fxquant.lowering.kernels.integer import IntegerClamp

from fxquant_quantized_engine.backend import EngineHooks, engine_plugin
from fxquant_quantized_engine.conv_add import QuantizedConvAdd
from fxquant_quantized_engine.engine import (
    DEPRECATION_MESSAGE,
    EngineScope,
)
from fxquant_quantized_engine.modules import (
    QuantizedBinary,
    QuantizedCat,
    QuantizedConv,
    QuantizedConvTranspose,
    QuantizedLinear,
    QuantizedLinearDynamic,
    QuantizedLinearFP16,
    QuantizedUnary,
)
from fxquant_quantized_engine.ops import (
    ChannelQParams,
    QuantizedOps,
    Step,
)
from fxquant_quantized_engine.patterns import engine_pattern_configs
from fxquant_quantized_engine.qconfig import (
    TRANSFORMER_FLOAT_OPS,
    conv_adds_int8,
    engine_default_qconfig_mapping,
    transformer_ops_int8,
)
from fxquant_quantized_engine.recurrent import (
    QuantizedRecurrent,
    QuantizedRecurrentCell,
    recurrent_rules,
)
from fxquant_quantized_engine.rules import (
    build_conv_add,
    build_conv_transpose,
    build_ops,
    build_weighted,
    lowering_rules,
    max_pool_integers,
)
from fxquant_quantized_engine.views import (
    TensorQParams,
    as_quint8,
    as_uint8,
    weight_as_qint8,
)

__all__ = [
    "DEPRECATION_MESSAGE",
    "TRANSFORMER_FLOAT_OPS",
    "ChannelQParams",
    "EngineHooks",
    "EngineScope",
    "IntegerClamp",
    "QuantizedBinary",
    "QuantizedCat",
    "QuantizedConv",
    "QuantizedConvAdd",
    "QuantizedConvTranspose",
    "QuantizedLinear",
    "QuantizedLinearDynamic",
    "QuantizedLinearFP16",
    "QuantizedOps",
    "QuantizedRecurrent",
    "QuantizedRecurrentCell",
    "QuantizedUnary",
    "Step",
    "TensorQParams",
    "as_quint8",
    "as_uint8",
    "build_conv_add",
    "build_conv_transpose",
    "build_ops",
    "build_weighted",
    "conv_adds_int8",
    "engine_default_qconfig_mapping",
    "engine_pattern_configs",
    "engine_plugin",
    "lowering_rules",
    "max_pool_integers",
    "recurrent_rules",
    "transformer_ops_int8",
    "weight_as_qint8",
]
