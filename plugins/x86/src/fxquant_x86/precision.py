"""The precision of the float parts of x86's compiled deployment: bfloat16 where the CPU has it.

Between its int8 GEMMs and convs a quantized model still runs float ops:
LayerNorm, softmax, GELU, residual adds, attention's matmuls, the dequantized
GEMM outputs that feed them. On a CPU with AMX-BF16 or AVX512-BF16 those run
in bfloat16 at half the memory traffic (AMX for the matmuls), which is how
``torch.compile(model.bfloat16())`` gets its speed; in float32 they give back
much of what the int8 GEMMs gain.

:func:`float_parts_in` rewrites a flat reference graph so that every float
value between quantize/dequantize steps is a ``dtype`` tensor::

    q -> dq -> linear(w: dq) -> gelu -> q            (float32 between the steps)
    q -> dq -> to(bf16) -> linear(w: dq -> to(bf16), b: to(bf16)) -> gelu -> to(f32) -> q

the form inductor's x86 int8-mixed-bf16 passes match (pt2e's int8-mixed-bf16
under autocast gives the same casts): ``onednn.qlinear_pointwise`` with a
bfloat16 output where a float op follows, uint8 where a quantize step does.
The rewritten graph is itself a runnable model: the reference of what runs.

:func:`float_side_in` does the same node by node, where the reference model says so:
the nodes whose output it rounds to bfloat16 (``y.to(bfloat16).to(float32)``, written
by convert for a bfloat16 ``DTypeConfig``) run in bfloat16, the rest stays float32::

    dq -> linear -> to(bf16) -> to(f32) -> layer_norm -> to(bf16) -> to(f32) -> q
    dq -> to(bf16) -> linear -> layer_norm(w: to(bf16)) -> to_float32 -> q
"""

from __future__ import annotations

import functools
import operator
import os
from pathlib import Path
from typing import Any

import torch
import torch.fx.passes.shape_prop
import torch.nn.functional as F
from fxquant.errors import ConfigError
from fxquant.lowering import DEQUANTIZE_OPS, QDQ_OPS, QUANTIZE_OPS
from torch import fx

__all__ = [
    "BF16_CONFIG_NOTE",
    "BF16_ENV",
    "BF16_FLAGS",
    "BF16_NOTE",
    "bf16_accelerated",
    "bf16_unavailable_reason",
    "cpu_flags",
    "default_float_dtype",
    "float_parts_in",
    "float_side_in",
    "from_float32",
    "isa_cap_without_bf16",
    "rounded_to_bf16",
    "rounds_to_bf16",
    "to_float32",
]

BF16_ENV = "FXQUANT_X86_BF16"
"""Set to ``0`` or ``1``: whether x86 treats this CPU as computing bfloat16, whatever its flags."""

BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""The /proc/cpuinfo flags of x86 bfloat16 arithmetic in hardware (AMX tiles, AVX-512
dot products). Without them oneDNN emulates bfloat16 with float32 arithmetic plus
conversions: slower than float32."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


ONEDNN_ISAS_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)
"""``ONEDNN_MAX_CPU_ISA`` values that keep oneDNN off every bfloat16 dot-product ISA
(AVX512-BF16, AMX): under such a cap bfloat16 GEMMs and convs are emulated."""

ATEN_CAPABILITIES_WITHOUT_BF16 = frozenset({"default", "avx2"})
"""``ATEN_CPU_CAPABILITY`` values that keep ATen's kernels and inductor's C++ loops
(``torch._inductor.cpu_vec_isa.pick_vec_isa`` reads the same variable) off AVX-512."""


def isa_cap_without_bf16() -> str | None:
    """The environment setting that caps the ISA below bfloat16 arithmetic, or ``None``.

    oneDNN honours ``ONEDNN_MAX_CPU_ISA`` (or its older name ``DNNL_MAX_CPU_ISA``) and
    ATen with inductor ``ATEN_CPU_CAPABILITY``: a process capped this way runs bfloat16
    as emulation even where /proc/cpuinfo lists AMX-BF16, so x86's bfloat16 choices must
    not fire there (how a CPU without bfloat16 is benchmarked on one that has it).

    Example:
        >>> isa_cap_without_bf16() is None or "=" in isa_cap_without_bf16()
        True
    """
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(name, "").strip()
        if value.upper() in ONEDNN_ISAS_WITHOUT_BF16:
            return f"{name}={value}"
    value = os.environ.get("ATEN_CPU_CAPABILITY", "").strip()
    if value.lower() in ATEN_CAPABILITIES_WITHOUT_BF16:
        return f"ATEN_CPU_CAPABILITY={value}"
    return None


def bf16_accelerated() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AMX-BF16 or AVX512-BF16).

    /proc/cpuinfo's flags where Linux has them; elsewhere torch's own probe of
    AVX512-BF16 (``torch.cpu._is_avx512_bf16_supported``). The environment variable
    :data:`BF16_ENV` overrides the probe: ``0`` treats the CPU as one without
    (x86's defaults then keep every float part float32: the attention too), ``1`` as one
    with. Unset, it is False, whatever the CPU has, in a process whose ISA is capped below
    bfloat16 (:func:`isa_cap_without_bf16`).

    Raises:
        ConfigError: :data:`BF16_ENV` is set to something else than ``0`` or ``1``.

    Example:
        >>> isinstance(bf16_accelerated(), bool)
        True
    """
    override = os.environ.get(BF16_ENV, "")
    if override:
        if override not in ("0", "1"):
            msg = (
                f"environment variable {BF16_ENV}={override!r}: expected '0' (float32 float "
                "parts, as on a CPU without bfloat16 arithmetic) or '1' (bfloat16 where x86 "
                "offers it); unset it to read the CPU's flags"
            )
            raise ConfigError(msg)
        return override == "1"
    if isa_cap_without_bf16() is not None:
        return False
    flags = cpu_flags()
    if flags:
        return any(flag in flags for flag in BF16_FLAGS)
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(probe()) if probe is not None else False


def bf16_unavailable_reason() -> str:
    """Why x86 offers no bfloat16 float side on this CPU (the words of the fallback).

    Example:
        >>> "bfloat16" in bf16_unavailable_reason()
        True
    """
    if os.environ.get(BF16_ENV) == "0":
        return (
            f"bfloat16 float side not offered: {BF16_ENV}=0 in the environment says this CPU "
            "computes none, so the float parts stay float32 and Linear int8 in, float32 out"
        )
    cap = isa_cap_without_bf16()
    if cap is not None:
        return (
            f"bfloat16 float side not offered: {cap} caps oneDNN, ATen and inductor below "
            f"bfloat16 arithmetic (whatever /proc/cpuinfo lists), so bfloat16 would be "
            f"emulated, slower than float32; unset it to let x86 choose bfloat16"
        )
    flags = cpu_flags()
    seen = "none" if not flags else ", ".join(f for f in sorted(flags) if "avx" in f or "amx" in f)
    return (
        f"bfloat16 float side not offered: this CPU computes no bfloat16 in hardware (none of "
        f"{', '.join(BF16_FLAGS)} among its flags: {seen or 'none'}); oneDNN would emulate it, "
        f"slower than float32, so the float parts stay float32 and Linear int8 in, float32 out"
    )


BF16_NOTE = (
    "float parts in bfloat16: every float op between quantize steps (LayerNorm, softmax, "
    "GELU, residual adds, attention) runs in bfloat16 and the int8 GEMMs/convs feeding them "
    "output bfloat16 (float_dtype=torch.bfloat16; the default is float32)"
)


BF16_CONFIG_NOTE = (
    "bfloat16 float side as the config says: the {count} ops the reference model rounds to "
    "bfloat16 (a bfloat16 DTypeConfig: explain names them) run in bfloat16; the rest as "
    "the reference model does"
)


def default_float_dtype() -> torch.dtype:
    """The dtype x86's compiled deployment runs the float parts in by default: float32.

    bfloat16 float parts are opt-in (a bfloat16 ``DTypeConfig`` chosen by the mapping,
    :func:`fxquant_x86.qconfig.bf16_qconfig_mapping`, or ``float_dtype=torch.bfloat16``
    for every float part): on the AMX
    Xeon they were measured (plugins/x86/README.md, "bfloat16 on a CPU that computes it") no faster
    than float32 on the BERT-base-like encoder at batch 1 (0.58x against 0.57x
    bf16 + compile's latency, in one interleaved run) and slower on the quick models,
    at 2.3 dB less SQNR (34.1 against 36.3 dB: a bfloat16 residual stream adds
    noise of an 8-bit mantissa, about int8's). On a CPU without bfloat16 arithmetic
    (:func:`bf16_accelerated` False) oneDNN emulates it: slower still.

    Example:
        >>> default_float_dtype()
        torch.float32
    """
    return torch.float32


def to_float32(value: Any) -> Any:
    """``value`` in float32 if it is a bfloat16 tensor, else as it is (for quantize steps and
    the model's outputs: the caller gets float32, as from the reference model)."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
        return value.float()
    return value


def from_float32(value: Any, dtype: torch.dtype) -> Any:
    """``value`` in ``dtype`` if it is a float32 tensor, else as it is (for the model's inputs:
    token ids stay integers)."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
        return value.to(dtype)
    return value


def _float_attribute(node: fx.Node, model: fx.GraphModule) -> bool:
    """An attribute holding a float32 tensor: a float value entering the graph that float ops
    may read (a bias, LayerNorm's gamma, an embedding table)."""
    if node.op != "get_attr":
        return False
    value = operator.attrgetter(str(node.target))(model)
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32


def _is_qdq(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in QDQ_OPS


# the activations of x86's conv + activation pattern (ConvUnary2d), as its forward traces
_CONV_ACTIVATIONS = (F.hardtanh, F.relu6, F.hardswish, F.silu, F.relu, torch.relu)


def _quantized_after(node: fx.Node) -> bool:
    """Whether every path from ``node`` ends at a quantize step, directly or through a
    conv's activation that reads nothing else (``conv -> hardtanh -> q``: ConvUnary2d)."""
    return bool(node.users) and all(
        u.op == "call_function"
        and (
            u.target in QUANTIZE_OPS
            or (
                u.target in _CONV_ACTIVATIONS
                and u.all_input_nodes == [node]
                and _quantized_after(u)
            )
        )
        for u in node.users
    )


def _between_quantize_steps(node: fx.Node) -> bool:
    """A node whose value only quantize steps read (directly, or after ops that read nothing
    else) and whose inputs all enter from outside the float parts (dequantize steps,
    attributes, placeholders): ``dq -> relu6 / max pool / conv (-> relu6) -> q``.

    It stays float32, as in the reference model: its output is integers anyway, and
    inductor's patterns for it (the clamp as the kernel's post-op, the max pool on the
    integers, ``dq -> conv (-> activation) -> q`` as one int8 kernel) want no casts in
    between."""
    if not _quantized_after(node):
        return False
    return all(
        source.op in ("get_attr", "placeholder")
        or (source.op == "call_function" and source.target in DEQUANTIZE_OPS)
        for source in node.all_input_nodes
    )


def _cast_for(graph: fx.Graph, node: fx.Node, users: list[fx.Node], dtype: torch.dtype) -> None:
    """Insert a cast of ``node`` to ``dtype`` after it and make ``users`` read the cast (of a
    float32 tensor only, for an input whose dtype the graph does not say)."""
    with graph.inserting_after(node):
        if node.op == "placeholder":
            cast = graph.call_function(from_float32, (node, dtype))
        else:
            cast = graph.call_method("to", (node, dtype))
    for user in users:
        user.replace_input_with(node, cast)


def _is_cast(node: object, dtype: torch.dtype) -> bool:
    return (
        isinstance(node, fx.Node)
        and node.op == "call_method"
        and node.target == "to"
        and node.args[1:] == (dtype,)
        and not node.kwargs
    )


def rounded_to_bf16(node: fx.Node) -> bool:
    """Whether ``node``'s one reader rounds it to bfloat16 (``.to(bfloat16).to(float32)``).

    Example:
        >>> graph = fx.Graph()
        >>> x = graph.placeholder("x")
        >>> rounded_to_bf16(x)
        False
    """
    if len(node.users) != 1:
        return False
    (low,) = node.users
    return _is_cast(low, torch.bfloat16) and all(_is_cast(u, torch.float32) for u in low.users)


def _rounding_pairs(graph: fx.Graph) -> list[tuple[fx.Node, fx.Node]]:
    """``x.to(bfloat16).to(float32)``: convert's reference form of a bfloat16 value."""
    pairs = []
    for node in graph.nodes:
        low = node.args[0] if _is_cast(node, torch.float32) else None
        if _is_cast(low, torch.bfloat16) and len(low.users) == 1:  # type: ignore[union-attr]  # a Node when it is a cast
            pairs.append((low, node))
    return pairs


def rounds_to_bf16(model: fx.GraphModule) -> bool:
    """Whether the reference model rounds any value to bfloat16 (a bfloat16 float side).

    Example:
        >>> rounds_to_bf16(fx.symbolic_trace(torch.nn.Linear(2, 2)))
        False
    """
    return bool(_rounding_pairs(model.graph))


def _computes(node: fx.Node) -> bool:
    """An op that computes a value (not an input, a weight or a dequantize step)."""
    return node.op in ("call_function", "call_method") and node.target not in QDQ_OPS


def _is_float32(node: fx.Node) -> bool:
    meta = node.meta.get("tensor_meta")
    return getattr(meta, "dtype", None) == torch.float32


def _collapse_pairs(graph: fx.Graph) -> tuple[set[fx.Node], set[fx.Node]]:
    """Drop each rounding pair's ``to(float32)`` (and, after an op every reader of which reads
    it rounded, its ``to(bfloat16)``: the op itself will compute bfloat16). Returns the ops
    that run in bfloat16 and every bfloat16 value (those ops, and the casts left: of inputs,
    weights, dequantize steps and of ops that others read unrounded)."""
    runs, values = set(), set()
    for low, high in _rounding_pairs(graph):
        high.replace_all_uses_with(low)
        graph.erase_node(high)
        source = low.args[0]
        assert isinstance(source, fx.Node)  # the convert wrote x.to(dtype)
        if _computes(source) and len(source.users) == 1:
            low.replace_all_uses_with(source)
            graph.erase_node(low)
            runs.add(source)
            values.add(source)
        else:
            values.add(low)
    return runs, values


def float_side_in(model: fx.GraphModule, example_inputs: tuple[Any, ...]) -> int:
    """Run in bfloat16 the ops a flat reference graph rounds to bfloat16; in place.

    Each such op reads bfloat16: the bfloat16 values before it, and a cast of any
    float32 input (a dequantize step, a weight, an input, a float32 op's output).
    Every other reader of a bfloat16 value (a quantize step, a float32 op, the
    model's outputs) gets float32 back (:func:`to_float32`). The graph computes
    what the reference does, with bfloat16 arithmetic where the reference rounds.

    Returns:
        How many ops run in bfloat16.

    Example:
        >>> # flat = flatten_for_compile(reference); float_side_in(flat, (x,))
    """
    torch.fx.passes.shape_prop.ShapeProp(model).propagate(*example_inputs)
    graph = model.graph
    runs, values = _collapse_pairs(graph)
    casts: dict[fx.Node, fx.Node] = {}
    for node in [n for n in graph.nodes if n in runs]:
        for arg in node.all_input_nodes:
            if arg in values or not _is_float32(arg):
                continue
            if arg not in casts:
                with graph.inserting_after(arg):
                    casts[arg] = graph.call_method("to", (arg, torch.bfloat16))
            node.replace_input_with(arg, casts[arg])
    for value in values:
        for user in [u for u in value.users if u not in runs and u not in casts.values()]:
            with graph.inserting_before(user):
                back = graph.call_function(to_float32, (value,))
            user.replace_input_with(value, back)
    graph.lint()
    model.recompile()
    return len(runs)


def float_parts_in(model: fx.GraphModule, dtype: torch.dtype = torch.bfloat16) -> int:
    """Run the float parts of a flat reference graph in ``dtype``; in place. Returns the casts.

    Every dequantize output, and every float input or attribute that a float op
    reads, is cast to ``dtype``, so the float ops between them compute in
    ``dtype``; every quantize step and the model's outputs get float32 back
    (:func:`to_float32`). Weights that only quantize steps read (integers,
    scales) are left alone. A placeholder read only by a quantize step (a CNN's
    image) stays float32: casting it first would round it twice. An op between
    two quantize steps (a CNN's conv, relu6 or max pool) stays float32 too
    (see :func:`_between_quantize_steps`): a CNN keeps the float32 form.

    Example:
        >>> # flat = flatten_for_compile(reference); float_parts_in(flat); flat.recompile()
    """
    graph = model.graph
    casts = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in DEQUANTIZE_OPS:
            # a dequantized output goes out as it is: float32, no round trip through bf16
            readers = [u for u in node.users if u.op != "output" and not _between_quantize_steps(u)]
        elif node.op == "placeholder" or _float_attribute(node, model):
            readers = [
                u
                for u in node.users
                if u.op != "output"
                and not _is_qdq(u)
                and u.target is not getattr
                and not _between_quantize_steps(u)
            ]
        else:
            continue
        if readers:
            _cast_for(graph, node, readers, dtype)
            casts += 1
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in QUANTIZE_OPS:
            source = node.args[0]
            if isinstance(source, fx.Node) and source.op != "placeholder":
                with graph.inserting_before(node):
                    back = graph.call_function(to_float32, (source,))
                node.replace_input_with(source, back)
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    with graph.inserting_before(output):
        restored = fx.node.map_arg(output.args, lambda n: graph.call_function(to_float32, (n,)))
    output.args = restored
    graph.lint()
    model.recompile()
    return casts
