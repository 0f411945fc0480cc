"""A converted model as an ExecuTorch program (``.pte``) with the XNNPACK delegate.

:func:`to_executorch` is the whole route, with no torch.ao quantizer and no
pt2e annotation: fxquant's own converted model is the input::

    converted model (fxquant q/dq ops, reference modules)
      -> fxquant.tools.export.export_quantized     torch.export; weights folded into int8 constants
      -> edge_ops.rewrite_qdq                fxquant q/dq -> quantized_decomposed q/dq
      -> passes                              scalar qparams; one dequantize per reader;
                                             keep-dim means; int8 embedding lookups;
                                             moves on one grid
      -> to_edge_transform_and_lower         XnnpackPartitioner takes dq -> op -> q groups
      -> .to_executorch()                    the .pte bytes
      -> delegation.placements               what XNNPACK took, what it left, and why

The result runs in ExecuTorch's runtime in this process (its Python bindings)
and carries the delegation report in ``fxquant.explain`` form.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from fxquant.errors import ConfigError, ConfigTypeError, ExportError, QuantizationSkipped
from fxquant.flow.deployed import DeployedModel
from fxquant.flow.report import NodeStatus, ReasonCode, Report
from fxquant.flow.state import FlowState, flow_state
from fxquant.tools.export import export_quantized
from torch import fx
from torch.utils import _pytree as pytree

from fxquant_executorch.delegation import (
    Placement,
    capture_partitioner_reasons,
    delegation_report,
    placements,
)
from fxquant_executorch.edge_ops import quiet_toolchain, rewrite_qdq
from fxquant_executorch.passes import (
    constant_scalars,
    double_scales,
    duplicate_dequantize,
    inferred_batch_reshapes,
    keepdim_means,
    moves_on_one_grid,
    quantized_embeddings,
    scalar_qparams,
)

__all__ = ["ExecuTorchProgram", "ProgramInputError", "deploy", "to_executorch"]


class ExecuTorchProgram(DeployedModel):
    """An ExecuTorch program of a converted model, runnable in this process.

    The deployed-object protocol (``fxquant.registry.Deployed``): ``report``,
    ``explain()``, ``save(path)`` (the ``.pte`` and ``PATH.fxquant.json``) and
    ``ExecuTorchProgram.load(path)``.

    Attributes:
        buffer: the ``.pte`` bytes (what a phone or board loads).
        report: the converted model's report, told where each node runs:
            ``lowered`` (in XNNPACK), or the reason ``not_delegated``.
        placements: per node of the converted model, its edge ops in XNNPACK
            and in the portable runtime, with the partitioner's reasons.
        export_seconds: wall time of :func:`to_executorch`.

    Calling the program runs its ``forward`` in ExecuTorch's runtime (loaded
    on the first call) with the model's positional inputs and returns what
    the model returns.

    Example:
        >>> # program = to_executorch(converted, (x,)); program(x); program.save("model.pte")
    """

    def __init__(
        self,
        buffer: bytes,
        report: Report,
        found: Sequence[Placement],
        out_spec: pytree.TreeSpec | None,
        export_seconds: float,
    ) -> None:
        self.buffer = buffer
        self.report = report
        self.placements = tuple(found)
        self.export_seconds = export_seconds
        self._out_spec = out_spec
        # a single tensor out (most models): skip the pytree round trip on every call
        self._single = out_spec is not None and out_spec.is_leaf()
        self._method: Any = None

    @property
    def size(self) -> int:
        """Bytes of the ``.pte`` program."""
        return len(self.buffer)

    suffix = ".pte"

    def save_artifact(self, path: Path, **options: Any) -> Mapping[str, Any]:
        """The ``.pte`` program at ``path``; its output structure goes in the report file."""
        if options:
            msg = f"ExecuTorchProgram.save(path) takes no options, got {sorted(options)}"
            raise ConfigTypeError(msg)
        path.write_bytes(self.buffer)
        return {"out_spec": pytree.treespec_dumps(self._out_spec)}

    @classmethod
    def load_artifact(
        cls, path: Path, report: Report, extras: Mapping[str, Any]
    ) -> ExecuTorchProgram:
        """The program at ``path``; without its report file, outputs come back as a list."""
        spec = extras.get("out_spec")
        out_spec = pytree.treespec_loads(spec) if spec else None
        return cls(path.read_bytes(), report, (), out_spec, 0.0)

    def _loaded(self) -> Any:
        if self._method is None:
            # the runtime's C++ prints its CPU probing on the first load: held back in there
            with quiet_toolchain():
                from executorch.runtime import Runtime

                program = Runtime.get().load_program(self.buffer)
                self._method = program.load_method("forward")
        return self._method

    def __call__(self, *inputs: Any) -> Any:
        """Run ``forward`` in the ExecuTorch runtime."""
        method = self._method or self._loaded()
        # no global state on this path (warning filters, logger levels): it is the hot one,
        # and it may run on several threads at once
        flat = inputs if all(isinstance(x, torch.Tensor) for x in inputs) else None
        values = flat if flat is not None else pytree.tree_flatten(inputs)[0]
        try:
            outputs = method.execute(values)
        except RuntimeError as error:  # the runtime says only "set_inputs() ... error 0x10"
            mismatch = _input_mismatch(method.metadata, values)
            if mismatch is None:
                raise
            raise ProgramInputError(mismatch) from error
        if self._single:
            return outputs[0]
        if self._out_spec is None:
            return list(outputs)
        return pytree.tree_unflatten(list(outputs), self._out_spec)

    def __repr__(self) -> str:
        counts = {status: 0 for status in (NodeStatus.LOWERED, NodeStatus.REFERENCE)}
        for entry in self.report.entries():
            if entry.status in counts:
                counts[entry.status] += 1
        return (
            f"ExecuTorchProgram({self.size} bytes, {counts[NodeStatus.LOWERED]} nodes in "
            f"XNNPACK, {counts[NodeStatus.REFERENCE]} quantized nodes outside it)"
        )


class ProgramInputError(ConfigError, RuntimeError):
    """An :class:`ExecuTorchProgram` called with an input of another shape or dtype than
    the program was exported for (a RuntimeError too: what the runtime's own error was)."""


# the runtime's scalar type codes (c10's ScalarType numbering)
_SCALAR_TYPES = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    11: torch.bool,
    15: torch.bfloat16,
}

_DYNAMIC_BATCH = (
    "to_executorch(converted, (x,), dynamic_shapes=({0: torch.export.Dim('batch', max=N)},)) "
    "with an example x of batch 2 or more (torch.export fixes a dimension of size 1)"
)


def _input_mismatch(meta: Any, values: Sequence[Any]) -> str | None:
    """Which input the program cannot take, what it takes, and how to get a program that
    does; None when every input fits (the runtime failed for another reason)."""
    for i, value in enumerate(values[: meta.num_inputs()]):
        info = meta.input_tensor_meta(i)
        if not isinstance(value, torch.Tensor):
            continue
        planned, given = tuple(info.sizes()), tuple(value.shape)
        expected = _SCALAR_TYPES.get(info.dtype())
        if expected is not None and value.dtype != expected:
            return (
                f"input {i} of the ExecuTorch program is {expected}, got {value.dtype} "
                f"(shape {given}); call it with x.to({expected})"
            )
        if given != planned:
            return (
                f"input {i} of the ExecuTorch program takes shape {planned} (the example "
                f"input's at to_executorch; a dimension exported as dynamic, up to its size "
                f"here), got {given}. Export the program at this shape, or with a dynamic "
                f"batch: {_DYNAMIC_BATCH}"
            )
    return None


def _check_dynamic_sizes(
    example_inputs: tuple[Any, ...], dynamic_shapes: dict[str, Any] | tuple[Any, ...] | None
) -> None:
    """Refuse a dimension marked dynamic whose example size is 1: torch.export specializes
    it and says only "Constraints violated"."""
    if not isinstance(dynamic_shapes, (tuple, list)):
        return  # by parameter name: left to torch.export's own checks
    for i, (value, spec) in enumerate(zip(example_inputs, dynamic_shapes, strict=False)):
        if not isinstance(value, torch.Tensor) or not isinstance(spec, Mapping):
            continue
        for dim, marker in spec.items():
            if marker is not None and isinstance(dim, int) and value.shape[dim] == 1:
                msg = (
                    f"to_executorch(dynamic_shapes=...) marks dimension {dim} of example "
                    f"input {i} dynamic, but its size there is 1 (shape {tuple(value.shape)}): "
                    f"torch.export fixes a dimension of size 1; give an example input of "
                    f"size 2 or more there (e.g. torch.cat([x, x]))"
                )
                raise ConfigError(msg)


def _flow_state(model: object) -> FlowState:
    state = flow_state(model)
    if state is None:
        msg = (
            f"to_executorch expects a model returned by fxquant.convert_fx, got "
            f"{type(model).__name__}; prepare it with "
            "fxquant.get_backend_config('executorch'), calibrate, and convert it first"
        )
        raise ConfigTypeError(msg)
    return state


def _edge_ready(
    model: fx.GraphModule,
    example_inputs: tuple[Any, ...],
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | None,
) -> torch.export.ExportedProgram:
    """``model`` exported, in the q/dq form XNNPACK's partitioner matches."""
    program = export_quantized(model, example_inputs, dynamic_shapes=dynamic_shapes)
    rewrite_qdq(program.graph)
    scalar_qparams(program)
    constant_scalars(program)
    duplicate_dequantize(program.graph)
    keepdim_means(program.graph)
    moves_on_one_grid(program.graph)
    inferred_batch_reshapes(program.graph)
    quantized_embeddings(program)
    program.graph_module.recompile()
    return program


def _partitioner(*, dynamic: bool, per_op_mode: bool = False) -> Any:
    """XNNPACK's partitioner; for a program with dynamic shapes, its means in float.

    XNNPACK's int8 mean (global average pooling: a CNN's ``AdaptiveAvgPool2d(1)`` or
    ``x.mean((2, 3))``) returns wrong rows when the program runs at a larger batch than on
    its first call (ExecuTorch 1.5.1: batches 5-8 off by up to 2.0 after a call at 2, the
    same with pt2e's XNNPACKQuantizer); its float mean is right at every batch.
    Taken as float, the mean runs in XNNPACK between int8 -> float -> int8 conversions: the
    reference model's dequantize -> mean -> quantize.
    """
    with quiet_toolchain():
        from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
        from executorch.backends.xnnpack.partition.config.generic_node_configs import (
            MeanDimConfig,
        )
        from executorch.backends.xnnpack.partition.config.xnnpack_config import (
            ConfigPrecisionType,
        )
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    if not dynamic:
        return XnnpackPartitioner(per_op_mode=per_op_mode)

    class FloatMeanConfig(MeanDimConfig):  # type: ignore[misc]
        def supported_precision_types(self) -> list[Any]:
            return [ConfigPrecisionType.FP32]

    configs = [c for c in ALL_PARTITIONER_CONFIGS if c is not MeanDimConfig]
    return XnnpackPartitioner(configs=[*configs, FloatMeanConfig], per_op_mode=per_op_mode)


def _lower(
    program: torch.export.ExportedProgram,
    rebuild: Callable[[], torch.export.ExportedProgram],
    *,
    dynamic: bool,
) -> tuple[bytes, list[Placement]]:
    """Partition and lower ``program``; on failure, retry once on a fresh ``rebuild()`` (the
    lowering may have edited ``program``; rebuilding only then, rather than keeping a deep copy
    for every model, does not double the weights' memory on the path that works)."""
    with quiet_toolchain():
        from executorch.exir import to_edge_transform_and_lower

    with quiet_toolchain(), capture_partitioner_reasons() as reasons:
        try:
            edge = to_edge_transform_and_lower(program, partitioner=[_partitioner(dynamic=dynamic)])
        except Exception as error:  # the toolchain's own failure: say where, as ours
            # XNNPACK's partitioner merges ops into partitions that can depend on each other
            # through ops it leaves out: T5's relative-position buckets (div, log, mul) and the
            # permute of the bias looked up from them (a portable embedding_byte between) landed
            # in one partition, "Invalid partition, found dependency cycles". One
            # partition per op (its q/dq steps with it) cannot form a cycle: XNNPACK still
            # runs every op it took, in more delegate calls.
            try:
                edge = to_edge_transform_and_lower(
                    rebuild(), partitioner=[_partitioner(dynamic=dynamic, per_op_mode=True)]
                )
            except Exception:  # the first failure is the one to explain
                raise ExportError(_lowering_failed(error)) from error
        found = placements(edge.exported_program(), reasons)
        double_scales(edge.exported_program())
        return edge.to_executorch().buffer, found


def _lowering_failed(error: BaseException) -> str:
    """The message for a failure inside ``to_edge_transform_and_lower``: the graph node the
    innermost frame of the toolchain was working on (a local named ``node``), and why."""
    node = None
    chain: BaseException | None = error
    while chain is not None and node is None:  # the pass's own error, under its wrapper's
        traceback = chain.__traceback__
        while traceback is not None:
            candidate = traceback.tb_frame.f_locals.get("node")
            if isinstance(candidate, fx.Node):
                node = candidate
            traceback = traceback.tb_next
        chain = chain.__cause__ or chain.__context__
    where = "at an unknown node"
    if node is not None:
        where = f"at node {node.name!r} ({node.op} {str(node.target).split(':')[0]})"
        trace = node.meta.get("stack_trace")
        if trace:
            where += f", from {trace.strip().splitlines()[-2].strip()}"
    why = " ".join(str(error).split())[:300] or "(no message)"
    return (
        f"ExecuTorch's to_edge_transform_and_lower (XNNPACK partitioning and lowering) failed "
        f"{where}: {type(error).__name__}: {why}; keep that module float "
        f"(QConfigMapping().set_module_name(name, None)) or deploy with another backend"
    )


def _check_runs(program: ExecuTorchProgram, example_inputs: tuple[Any, ...]) -> None:
    """Run the program once: a program the runtime cannot run fails here, not on a device."""
    try:
        program(*example_inputs)
    except RuntimeError as error:
        portable = [
            f"{p.node or '(boundary)'}: {', '.join(p.portable)}"
            + (f" (XNNPACK: {'; '.join(p.why)})" if p.why else "")
            for p in program.placements
            if p.portable
        ]
        outside = "; ".join(portable) or "none"
        msg = (
            f"ExecuTorch's runtime could not run the program on the example inputs: {error}; "
            f"the ops outside XNNPACK, which its portable kernels must run: {outside}"
        )
        raise ExportError(msg) from error


def to_executorch(
    model: fx.GraphModule,
    example_inputs: tuple[Any, ...],
    *,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | None = None,
    strict: bool = False,
) -> ExecuTorchProgram:
    """Export a converted model as an ExecuTorch program with the XNNPACK delegate.

    Args:
        model: the model ``fxquant.convert_fx`` returned for the ``executorch``
            backend (or ``convert_to_reference_fx``'s); it is not modified.
        example_inputs: positional inputs of ``model``; their shapes are the
            program's (XNNPACK plans its memory for them).
        dynamic_shapes: passed to ``torch.export.export``; a dynamic dimension
            needs an example size of 2 or more (torch.export fixes size 1).
        strict: raise :class:`fxquant.QuantizationSkipped` when a quantized
            node is not delegated to XNNPACK, instead of reporting it.

    Returns:
        The program: ``.buffer`` (the ``.pte`` bytes), ``.save(path)``,
        ``.report`` (``lowered`` in XNNPACK, or why not), and callable in
        ExecuTorch's runtime.

    Raises:
        ConfigTypeError: ``model`` is not a converted fxquant model.
        ConfigError: ``dynamic_shapes`` marks a dimension of size 1 dynamic.
        fxquant.errors.ExportError: ``torch.export`` could not capture the
            model (the message names the node and the user's source line), or
            ExecuTorch's runtime could not run the program on
            ``example_inputs`` (the message lists the ops outside XNNPACK).
        QuantizationSkipped: ``strict=True`` and a quantized node stays
            outside XNNPACK.

    Example:
        >>> # prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=executorch)
        >>> # program = to_executorch(fxquant.convert_fx(prepared), (x,)); program(x)
    """
    state = _flow_state(model)
    _check_dynamic_sizes(example_inputs, dynamic_shapes)
    start = time.perf_counter()
    program = _edge_ready(model, example_inputs, dynamic_shapes)
    out_spec = program.call_spec.out_spec
    buffer, found = _lower(
        program,
        lambda: _edge_ready(model, example_inputs, dynamic_shapes),
        dynamic=dynamic_shapes is not None,
    )
    report = delegation_report(state.report, found)
    result = ExecuTorchProgram(buffer, report, found, out_spec, time.perf_counter() - start)
    _check_runs(result, example_inputs)
    if strict:
        outside = [
            e for e in report.entries() if e.reason and e.reason.code == ReasonCode.NOT_DELEGATED
        ]
        quantized = [e for e in outside if e.status == NodeStatus.REFERENCE]
        if quantized:
            lines = "\n".join(f"  {e.reason.words}" for e in quantized if e.reason)
            msg = f"to_executorch(strict=True): {len(quantized)} quantized nodes not delegated:\n"
            raise QuantizationSkipped(msg + lines, quantized)  # type: ignore[arg-type]
    return result


def deploy(model: fx.GraphModule, example_inputs: tuple[Any, ...]) -> ExecuTorchProgram:
    """The ``fxquant_deployment`` entry: :func:`to_executorch` with the defaults.

    Example:
        >>> # fxquant.registry.get_deployment("executorch").deploy(converted, (x,))
    """
    return to_executorch(model, example_inputs)
