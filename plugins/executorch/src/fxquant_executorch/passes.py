"""Rewrites of the exported program that let XNNPACK's partitioner take more of it.

Both keep the program's numerics; they run on the ATen program after the
quantize/dequantize rewrite, before ``to_edge_transform_and_lower``.

Scalar qparams. A reference module keeps a per-tensor weight's scale and zero
point as buffers, so its exported dequantize is the ``.tensor`` overload;
XNNPACK reads a per-tensor scale as a number, so constant 0-d qparams become
the ``.default`` overload's Python numbers.

One dequantize per reader. fxquant's reference model dequantizes a value once
for all its readers; XNNPACK's partitioner groups a dequantize with *one*
reader, so a shared one (a residual branch read by a conv and an add) would
land in one partition while its other reader's path leaves and re-enters
it, which ExecuTorch rejects as a dependency cycle::

    q -> dq -> conv ...            q -> dq   -> conv ...
           \\-> add                  \\-> dq' -> add

Embedding lookups on int8 tables. A weight-only int8 embedding is, in the
reference model, a dequantize of the whole table followed by the lookup;
ExecuTorch's ``quantized_decomposed.embedding_byte`` looks the rows up in the
int8 table and dequantizes only those (the portable runtime has its kernel;
XNNPACK has no embedding)::

    dequantize_per_channel(table, scales, 0s, axis 0) -> embedding(., ids)
        -> embedding_byte(table, scales, None, -127, 127, ids)

Constant scalars. A quantized binary op with a tensor constant operand
(``1.0 - mask`` in transformers' attention mask, traced as ``torch.tensor(1.0)``)
quantizes the constant at run time; exported, the 0-d constant is a lifted
placeholder, and XNNPACK's channels-last pass indexes the value of every
placeholder that a delegated dequantize reads as if it had a batch dimension:
``to_edge_transform_and_lower`` failed with ``IndexError`` on the BERT encoder.
The quantize -> dequantize of a 0-d constant is itself a constant:
the constant is replaced by its dequantized value (the same number the
reference model computes) and the steps are dropped::

    c = 1.0 -> q(c) -> dq -> sub          c' = dq(q(1.0)) -> sub

Keep-dim means. XNNPACK's mean takes 4-d tensors over the two innermost
dimensions with ``keepdim=True`` only; the common ``x.mean((2, 3))`` of a CNN
head becomes that mean followed by a reshape (on the same quantization grid,
so both stay int8 in XNNPACK)::

    dq -> mean(x, [2, 3]) -> q      dq -> mean(x, [2, 3], keepdim=True) -> q -> dq -> view -> q

Inferred batch reshapes. Under a dynamic batch, a flatten or view exports to a
shape naming the batch as a symbol (``[sym_size(x, 0), 8]``); XNNPACK's reshape
takes one inferred dimension and no symbolic one, so the view stayed in the
portable runtime. With every other dimension a number, ``-1`` is the same size::

    view(x, [sym_size(x, 0), 8])         view(x, [-1, 8])

Moves on one grid. XNNPACK's transpose, reshape, slice and copy take their
input and output on the same quantization grid: its runtime refuses the whole
program at load ("Failed to create static transpose node ...
xnn_status_invalid_parameter") when they differ. They differ where the moved
value is read by a ``cat``, whose inputs share the cat's observer: ViT's patch
tokens (``transpose(1, 2)``) beside its class token, apart after QAT's moving
averages (in PTQ the two ranges happen to coincide). A move copies values, so
requantizing before it gives the same integers::

    dq(s1) -> transpose -> q(s2)         dq(s1) -> q(s2) -> dq(s2) -> transpose -> q(s2)
"""

from __future__ import annotations

import torch
from torch import fx
from torch.export import ExportedProgram

from fxquant_executorch.edge_ops import dequantize_for, is_dequantize, is_quantize

__all__ = [
    "constant_scalars",
    "double_scales",
    "duplicate_dequantize",
    "inferred_batch_reshapes",
    "keepdim_means",
    "moves_on_one_grid",
    "quantized_embeddings",
    "scalar_qparams",
]

_ATEN = torch.ops.aten


def duplicate_dequantize(graph: fx.Graph) -> int:
    """Give every reader of a shared dequantize step its own copy; return the copies made.

    Example:
        >>> from fxquant_executorch.edge_ops import qdq_targets
        >>> _ = qdq_targets()  # ExecuTorch registers the quantized_decomposed ops
        >>> g = fx.Graph(); q = g.placeholder("q")
        >>> dq = g.call_function(torch.ops.quantized_decomposed.dequantize_per_tensor.default,
        ...                      (q, 0.1, 0, -128, 127, torch.int8))
        >>> _ = g.output((g.call_function(torch.relu, (dq,)), g.call_function(torch.neg, (dq,))))
        >>> duplicate_dequantize(g)
        1
    """
    made = 0
    for node in list(graph.nodes):
        if not is_dequantize(node) or len(node.users) < 2:
            continue
        for user in list(node.users)[1:]:
            with graph.inserting_before(user):
                copy = graph.node_copy(node)
            user.replace_input_with(node, copy)
            made += 1
    return made


def _innermost_two(dims: object, rank: int) -> bool:
    if not isinstance(dims, (list, tuple)) or len(dims) != 2:
        return False
    return sorted(int(d) % rank for d in dims) == [rank - 2, rank - 1]


def _mean_to_fix(node: fx.Node) -> bool:
    if node.op != "call_function" or node.target != _ATEN.mean.dim:
        return False
    value = node.args[0]
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    shape = getattr(value, "meta", {}).get("val")
    return (
        not keepdim
        and not node.kwargs.get("dtype")
        and isinstance(shape, torch.Tensor)
        and shape.dim() == 4
        and _innermost_two(node.args[1], 4)
    )


def keepdim_means(graph: fx.Graph) -> int:
    """Rewrite 4-d ``mean(x, [h, w])`` as a keep-dim mean and a reshape; return how many.

    Example:
        >>> # see the module docstring; tests/test_passes.py runs it on a CNN head
    """
    fixed = 0
    for node in list(graph.nodes):
        if not _mean_to_fix(node):
            continue
        out_shape = list(node.meta["val"].shape)
        # a dynamic batch is a symbol: the view takes it as -1 (one view dimension can be)
        symbolic = [i for i, size in enumerate(out_shape) if not isinstance(size, int)]
        if len(symbolic) > 1:
            continue
        view_shape = [-1 if i in symbolic else size for i, size in enumerate(out_shape)]
        quantize = next(iter(node.users)) if len(node.users) == 1 else None
        with graph.inserting_before(node):
            mean = graph.call_function(_ATEN.mean.dim, (node.args[0], list(node.args[1]), True))
        mean.meta = {**node.meta, "val": node.meta["val"].reshape([*out_shape, 1, 1])}
        source = mean
        if quantize is not None and is_quantize(quantize):
            # the grid of the mean's output, so the reshape after it stays int8 in XNNPACK
            target = quantize.target
            assert callable(target)  # a quantize op, checked by is_quantize
            with graph.inserting_after(mean):
                requantize = graph.call_function(target, (mean, *quantize.args[1:]))
            with graph.inserting_after(requantize):
                source = graph.call_function(
                    dequantize_for(target), (requantize, *quantize.args[1:])
                )
            integers = mean.meta["val"].to(quantize.meta["val"].dtype)
            requantize.meta = {**quantize.meta, "val": integers}
            source.meta = dict(mean.meta)
        with graph.inserting_after(source):
            view = graph.call_function(_ATEN.view.default, (source, view_shape))
        view.meta = dict(node.meta)
        node.replace_all_uses_with(view)
        graph.erase_node(node)
        fixed += 1
    return fixed


def _constant(program: ExportedProgram, node: object) -> torch.Tensor | None:
    if not isinstance(node, fx.Node) or node.op != "placeholder":
        return None
    signature = program.graph_signature
    target = (
        signature.inputs_to_lifted_tensor_constants.get(node.name)
        or signature.inputs_to_buffers.get(node.name)
        or signature.inputs_to_parameters.get(node.name)
    )
    if target is None:
        return None
    value = program.constants.get(target, program.state_dict.get(target))
    return value if isinstance(value, torch.Tensor) else None


def _table_lookup(program: ExportedProgram, node: fx.Node) -> fx.Node | None:
    """The per-row int8 dequantize of a table ``node`` (an embedding) looks up, if it is one."""
    if node.op != "call_function" or node.target != _ATEN.embedding.default:
        return None
    table = node.args[0]
    if not isinstance(table, fx.Node) or not is_dequantize(table) or len(table.users) != 1:
        return None
    if "per_channel" not in str(table.target) or table.args[3] != 0:
        return None
    zero_points = _constant(program, table.args[2])
    integers = table.args[0]
    shape = getattr(integers, "meta", {}).get("val")
    if zero_points is None or bool(zero_points.any()) or getattr(shape, "ndim", 0) != 2:
        return None  # only symmetric 2-d tables: embedding_byte takes float zero points
    return table


def quantized_embeddings(program: ExportedProgram) -> int:
    """Look embeddings up in their int8 tables (``embedding_byte``); return how many.

    Example:
        >>> # see the module docstring; tests/test_passes.py runs it on a BERT-like model
    """
    graph = program.graph
    rewritten = 0
    for node in list(graph.nodes):
        table = _table_lookup(program, node)
        if table is None:
            continue
        integers, scales, _, _, quant_min, quant_max = table.args[:6]
        with graph.inserting_before(node):
            lookup = graph.call_function(
                torch.ops.quantized_decomposed.embedding_byte.default,
                (integers, scales, None, quant_min, quant_max, node.args[1]),
            )
        lookup.meta = dict(node.meta)
        node.replace_all_uses_with(lookup)
        graph.erase_node(node)
        graph.erase_node(table)
        rewritten += 1
    return rewritten


def scalar_qparams(program: ExportedProgram) -> int:
    """Per-tensor q/dq steps with constant 0-d qparams -> the overload taking numbers.

    Example:
        >>> # see the module docstring; tests/test_patterns.py lowers a transposed conv
    """
    rewritten = 0
    for node in program.graph.nodes:
        if not (is_quantize(node) or is_dequantize(node)):
            continue
        if getattr(node.target, "_overloadname", "") != "tensor":
            continue
        scale, zero_point = (_constant(program, a) for a in node.args[1:3])
        if scale is None or zero_point is None or scale.numel() != 1 or zero_point.numel() != 1:
            continue  # computed per call (dynamic quantization): stays as it is
        node.target = node.target._overloadpacket.default
        node.args = (node.args[0], float(scale), int(zero_point), *node.args[3:])
        rewritten += 1
    return rewritten


# what export writes around a tensor created in forward (``torch.tensor(1.0)``): no arithmetic
_COPIES = frozenset({_ATEN.lift_fresh_copy.default, _ATEN.detach.default, _ATEN.detach_.default})


def _constant_key(program: ExportedProgram, node: fx.Node) -> str | None:
    """The ``program.constants`` key of the lifted tensor constant ``node`` copies, if any."""
    while node.op == "call_function" and node.target in _COPIES and len(node.users) == 1:
        source = node.args[0]
        if not isinstance(source, fx.Node):
            return None
        node = source
    if node.op != "placeholder" or len(node.users) != 1:
        return None
    key = program.graph_signature.inputs_to_lifted_tensor_constants.get(node.name)
    return key if key is not None and key in program.constants else None


def constant_scalars(program: ExportedProgram) -> int:
    """Fold quantize -> dequantize of 0-d tensor constants into the constants; return how many.

    Example:
        >>> # see the module docstring; tests/test_program.py exports ``1.0 - x`` quantized
    """
    folded = 0
    for node in list(program.graph.nodes):
        if not is_quantize(node) or not isinstance(node.args[0], fx.Node):
            continue
        source = node.args[0]
        key = _constant_key(program, source)
        value = program.constants.get(key) if key is not None else None
        readers = list(node.users)
        if (
            not isinstance(value, torch.Tensor)
            or value.dim() != 0
            or len(source.users) != 1
            or not readers
            or not all(is_dequantize(r) and r.args[1:] == node.args[1:] for r in readers)
        ):
            continue
        target, dequantize = node.target, readers[0].target
        assert callable(target)  # a quantize op: checked by is_quantize
        assert callable(dequantize)
        program.constants[str(key)] = dequantize(target(value, *node.args[1:]), *node.args[1:])
        for reader in readers:
            reader.replace_all_uses_with(source)
            program.graph.erase_node(reader)
        program.graph.erase_node(node)
        folded += 1
    return folded


def double_scales(program: ExportedProgram) -> int:
    """Cast the scales of per-channel quantize steps left outside XNNPACK to float64.

    ExecuTorch's portable ``quantize_per_channel`` kernel aborts the process on float32
    scales (``scale.scalar_type() == ScalarType::Double``); a weight computed in
    ``forward`` (``nn.MultiheadAttention``'s packed projection split into query and
    key/value) is quantized there at run time. Runs on the edge program after partitioning.

    Example:
        >>> # nn.Transformer on executorch: tests/zoo (the zoo's nn_transformer)
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    quantize = exir_ops.edge.quantized_decomposed.quantize_per_channel.default
    cast = exir_ops.edge.aten._to_copy.default
    graph, changed = program.graph, 0
    for node in list(graph.nodes):
        scale = node.args[1] if node.target is quantize else None
        value = scale.meta.get("val") if isinstance(scale, fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dtype == torch.float64:
            continue
        with graph.inserting_before(node):
            double = graph.call_function(cast, (scale,), {"dtype": torch.float64})
        double.meta["val"] = value.to(torch.float64)
        node.replace_input_with(scale, double)
        changed += 1
    if changed:
        program.graph_module.recompile()
    return changed


_MOVES = frozenset(
    {
        _ATEN.transpose.int,
        _ATEN.permute.default,
        _ATEN.view.default,
        _ATEN.reshape.default,
        _ATEN._unsafe_view.default,
        _ATEN.flatten.using_ints,
        _ATEN.squeeze.dim,
        _ATEN.squeeze.dims,
        _ATEN.unsqueeze.default,
        _ATEN.slice.Tensor,
        _ATEN.select.int,
        _ATEN.expand.default,
        _ATEN.clone.default,
    }
)
"""Ops whose every output element is one of the input's: requantizing before them or
after gives the same integers."""


def _regridded(node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """``(dequantize, quantize)`` around a move whose output grid differs from its input's."""
    source = node.args[0] if node.args else None
    if node.target not in _MOVES or not isinstance(source, fx.Node):
        return None
    if not is_dequantize(source) or len(node.users) != 1:
        return None
    (reader,) = node.users
    # per-tensor steps with their qparams as numbers (scalar_qparams made them so)
    if not is_quantize(reader) or not all(isinstance(a, (int, float)) for a in reader.args[1:3]):
        return None
    if source.target is not dequantize_for(reader.target):
        return None
    return None if tuple(source.args[1:]) == tuple(reader.args[1:]) else (source, reader)


def moves_on_one_grid(graph: fx.Graph) -> int:
    """Requantize to the output's grid before a move between two grids; return how many.

    Example:
        >>> from fxquant_executorch.edge_ops import qdq_targets
        >>> _ = qdq_targets()  # ExecuTorch registers the quantized_decomposed ops
        >>> qd, int8 = torch.ops.quantized_decomposed, torch.int8
        >>> g = fx.Graph(); x = g.placeholder("x")
        >>> dq = g.call_function(qd.dequantize_per_tensor.default, (x, 0.1, 0, -128, 127, int8))
        >>> t = g.call_function(torch.ops.aten.transpose.int, (dq, 0, 1))
        >>> q = g.call_function(qd.quantize_per_tensor.default, (t, 0.2, 3, -128, 127, int8))
        >>> _ = g.output(q)
        >>> moves_on_one_grid(g)
        1
    """
    moved = 0
    for node in list(graph.nodes):
        found = _regridded(node)
        if found is None:
            continue
        source, reader = found
        with graph.inserting_before(node):
            requantized = graph.call_function(reader.target, (source, *reader.args[1:]))
            on_grid = graph.call_function(source.target, (requantized, *reader.args[1:]))
        node.replace_input_with(source, on_grid)
        moved += 1
    return moved


_RESHAPES = frozenset(
    {
        _ATEN.view.default,
        _ATEN.reshape.default,
        _ATEN._unsafe_view.default,
        _ATEN.flatten.using_ints,
    }
)


def inferred_batch_reshapes(graph: fx.Graph) -> int:
    """Reshapes to one symbolic dimension -> the same with ``-1`` there; return how many.

    Under a dynamic batch, a CNN head's flatten becomes ``view(x, [sym_size(x, 0), 8])``;
    XNNPACK's reshape takes one inferred dimension but no symbolic one, so it stayed in the
    portable runtime. The other dimensions are numbers: ``-1`` names the same size.

    Example:
        >>> # see the module docstring; tests/test_program.py flattens a pooled CNN head
    """
    rewritten = 0
    for node in graph.nodes:
        value = node.meta.get("val")
        if node.target not in _RESHAPES or not isinstance(value, torch.Tensor):
            continue
        sizes = list(value.shape)
        symbolic = [i for i, size in enumerate(sizes) if not isinstance(size, int)]
        if len(symbolic) != 1:
            continue
        shape = [-1 if i in symbolic else int(size) for i, size in enumerate(sizes)]
        # a flatten or reshape of a non-contiguous input copies: it stays a reshape
        views = (_ATEN.view.default, _ATEN._unsafe_view.default)
        target = _ATEN.view.default if node.target in views else _ATEN.reshape.default
        node.target, node.args, node.kwargs = target, (node.args[0], shape), {}
        rewritten += 1
    return rewritten
