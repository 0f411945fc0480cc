"""fxquant's quantize/dequantize ops as the ``quantized_decomposed`` ops ExecuTorch knows.

XNNPACK's partitioner, ExecuTorch's edge dialect and its portable runtime
recognise quantization by the ``quantized_decomposed`` operator library: the
partitioner groups ``dequantize -> op -> quantize`` into one int8 XNNPACK node,
and the runtime's quantized kernels run any step left outside a delegate.
fxquant's reference model spells the same steps with ``torch.ops.fxquant``
ops of the same schema (input, scale, zero point, quant range, dtype), so the
rewrite only swaps targets::

    fxquant.quantize_per_tensor(x, 0.02, -3, -128, 127, int8)
        -> quantized_decomposed.quantize_per_tensor(x, 0.02, -3, -128, 127, int8)

The dependency on torch.ao, isolated here: in torch 2.13 the
``quantized_decomposed`` library is defined by a module of
``torch/ao/quantization/fx/`` (``_decomposed.py``), which ExecuTorch imports
itself (``executorch.exir`` does on import). This module never imports torch.ao;
it asks ExecuTorch for the ops and fails with a clear error if they are
missing. Plan for when torch.ao is removed: ExecuTorch must then define the
library itself (its runtime kernels, ``kernels/quantized/quantized.yaml``, already
declare every schema); if a release does not, this module defines the ten
schemas :func:`rewrite_qdq` uses (they are public and stable) with
``torch.library``, backed by ``fxquant.numerics.qdq``'s kernels, and nothing else changes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from fxquant.errors import ConfigError
from fxquant.lowering import (
    CHOOSE_QPARAMS_OP,
    CHOOSE_QPARAMS_PER_TOKEN_OP,
    DEQUANTIZE_OF,
    QDQ_OPS,
)
from fxquant.tools.quiet import third_party_noise_filtered
from torch import fx

__all__ = [
    "choose_qparams_targets",
    "dequantize_for",
    "is_dequantize",
    "is_quantize",
    "qdq_targets",
    "quiet_toolchain",
    "rewrite_qdq",
    "target_name",
]

# every fxquant q/dq op -> the quantized_decomposed overload of the same name and schema
_SAME_SCHEMA = {op: (op.overloadpacket.__name__, op._overloadname) for op in QDQ_OPS}


# torchao logs that its CUDA kernels do not load on a CPU machine, and torch's pytree that
# torchao registers an enum the old way: both on ExecuTorch's import, neither the user's concern
_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def quiet_toolchain() -> Iterator[None]:
    """Silence the warnings ExecuTorch 1.5 raises about its own code.

    Its import chain (torchao, coremltools) and its lowering use deprecated
    torch and importlib APIs, and its batch-norm pass reads ``.grad`` of a
    non-leaf tensor: warnings the user can do nothing about, which fail test
    suites that turn warnings into errors. The import also logs that torchao's
    CUDA kernels do not load on a CPU machine; those log lines are held back
    too, and so are the ``[cpuinfo_utils.cpp:...]`` lines its runtime's C++ writes
    straight to descriptor 2 when it first loads a program (``fxquant.tools.quiet``: every
    other line written to stderr in the block is written back after it). Used around
    ExecuTorch's imports, lowering and runtime only, never around the user's model
    code (``torch.export`` of the model runs outside it).

    Example:
        >>> with quiet_toolchain():
        ...     pass
    """
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings(), third_party_noise_filtered():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", r"The \.grad attribute of a Tensor", UserWarning)
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


@functools.cache
def qdq_targets() -> Mapping[object, object]:
    """fxquant's quantize/dequantize overloads -> the ``quantized_decomposed`` ones.

    Raises:
        ConfigError: ExecuTorch did not register the ``quantized_decomposed`` library.

    Example:
        >>> ops = qdq_targets()
        >>> target_name(ops[torch.ops.fxquant.quantize_per_tensor.default])
        'quantized_decomposed::quantize_per_tensor.default'
    """
    with quiet_toolchain():
        import executorch.exir  # registers the quantized_decomposed library
        import executorch.kernels.quantized  # noqa: F401  # their out-variants, for the runtime

    namespace = torch.ops.quantized_decomposed
    targets: dict[object, object] = {}
    for ours, (name, overload) in _SAME_SCHEMA.items():
        packet = getattr(namespace, name, None)
        target = getattr(packet, overload, None) if packet is not None else None
        if target is None:
            msg = (
                f"ExecuTorch did not register torch.ops.quantized_decomposed.{name}.{overload}; "
                "fxquant-executorch needs the executorch release it pins (pip install "
                "'executorch==1.5.1') or one that defines the quantized_decomposed library"
            )
            raise ConfigError(msg)
        targets[ours] = target
    return targets


def is_quantize(node: fx.Node) -> bool:
    """A ``quantized_decomposed`` quantize step (after :func:`rewrite_qdq`).

    Example:
        >>> is_quantize(fx.Graph().placeholder("x"))
        False
    """
    return node.op == "call_function" and node.target in _quantize_set()


def is_dequantize(node: fx.Node) -> bool:
    """A ``quantized_decomposed`` dequantize step (after :func:`rewrite_qdq`).

    Example:
        >>> is_dequantize(fx.Graph().placeholder("x"))
        False
    """
    return node.op == "call_function" and node.target in _dequantize_for()


def dequantize_for(quantize: object) -> Callable[..., Any]:
    """The ``quantized_decomposed`` dequantize that inverts the quantize overload ``quantize``.

    Example:
        >>> qd = torch.ops.quantized_decomposed
        >>> dequantize_for(qd.quantize_per_tensor.default) is qd.dequantize_per_tensor.default
        True
    """
    target = _inverse()[quantize]
    assert callable(target)  # an OpOverload
    return target


@functools.cache
def _inverse() -> Mapping[object, object]:
    targets = qdq_targets()
    return {targets[ours]: targets[inverse] for ours, inverse in DEQUANTIZE_OF.items()}


@functools.cache
def _quantize_set() -> frozenset[object]:
    return frozenset(_inverse())


@functools.cache
def _dequantize_for() -> frozenset[object]:
    return frozenset(_inverse().values())


def choose_qparams_targets() -> Mapping[object, object]:
    """fxquant's dynamic-qparams ops -> ``quantized_decomposed``'s.

    Per tensor, ``choose_qparams.tensor``: the schemas differ (ExecuTorch's takes
    ``eps``), :func:`rewrite_qdq` rebuilds the arguments. Per token,
    ``choose_qparams_per_token_asymmetric``: the same schema.

    Example:
        >>> len(choose_qparams_targets())
        2
    """
    qdq_targets()  # registers the library
    namespace = torch.ops.quantized_decomposed
    return {
        CHOOSE_QPARAMS_OP: namespace.choose_qparams.tensor,
        CHOOSE_QPARAMS_PER_TOKEN_OP: namespace.choose_qparams_per_token_asymmetric.default,
    }


def target_name(target: object) -> str:
    """``namespace::op.overload`` of an operator overload, for messages.

    Example:
        >>> target_name(torch.ops.aten.relu.default)
        'aten::relu.default'
    """
    schema, overload = getattr(target, "_schema", None), getattr(target, "_overloadname", None)
    if schema is not None and overload is not None:  # torch's name() drops ".default"
        return f"{schema.name}.{overload}"
    return str(target)


_FLOAT_EPS = torch.finfo(torch.float32).eps


def rewrite_qdq(graph: fx.Graph) -> int:
    """Swap every fxquant quantize/dequantize node's target for ExecuTorch's; return the count.

    ``out_dtype=torch.float32`` (fxquant spells the default out) is dropped:
    ExecuTorch's kernels return float32 by default and its XNNPACK serializer
    does not read the keyword.

    Example:
        >>> # see fxquant_executorch.program.to_executorch
    """
    targets = qdq_targets()
    dynamic = choose_qparams_targets()
    count = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in targets:
            node.target = targets[node.target]
            if node.kwargs.get("out_dtype") in (None, torch.float32):
                node.kwargs = {k: v for k, v in node.kwargs.items() if k != "out_dtype"}
            count += 1
        elif node.target == CHOOSE_QPARAMS_PER_TOKEN_OP:
            node.target = dynamic[node.target]
            count += 1
        elif node.target in dynamic:
            x, quant_min, quant_max, dtype = node.args
            node.target = dynamic[node.target]
            node.args = (x, quant_min, quant_max, _FLOAT_EPS, dtype)
            count += 1
    return count
