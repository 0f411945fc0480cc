"""Run one cell of the invariant matrix and check every invariant on it (#30).

For a cell (model, backend, move) :func:`check` quantizes a fresh model as the move says,
builds each output form (``convert_fx``, ``convert_to_reference_fx``, the deployment) and
returns an :class:`Outcome`: one line per broken invariant, each naming the invariant:

- ``untouched``: the caller's model, example inputs and call inputs are never modified;
- ``agrees``: the lowered (and the deployed) model agrees with its reference model within
  one quantization step per quantized node, or the report names the node and why;
- ``custom_cost``: a customization costs each Linear and Conv it does not name at most 1 dB
  of local SQNR;
- ``refused``: nothing float runs is refused (an error is a failure, listed with its words);
- ``explain``: every node ``explain`` calls lowered is a backend kernel in the graph, and
  every kernel is reported lowered;
- ``threads``: three threads quantizing at once give the serial result, bit for bit;
- ``strict``: strict mode raises exactly when the default run skips a node, naming each;
- ``state_dict``: a converted model's state_dict loads into a fresh one and gives its output.
"""

from __future__ import annotations

import copy
import io
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from tests.invariants.cells import Cell
from tests.zoo.runner import CALIBRATION, EXAMPLE, ZOO, ZooModel, main_output, quiet

__all__ = ["Outcome", "check"]

STEP_SLACK = 1.0 + 1e-3  # one step, and float rounding of the step count itself
COST_DB = 1.0
CAP_DB = 60.0  # above this a node's local SQNR is float rounding: no cost to speak of
EVAL = (99, 100)
QAT_STEPS = 2


@dataclass
class Outcome:
    """What a cell broke: ``(invariant, words)`` pairs; empty when every invariant held."""

    cell: Cell
    broken: list[tuple[str, str]] = field(default_factory=list)
    forms: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, invariant: str, words: str) -> None:
        self.broken.append((invariant, " ".join(words.split())[:500]))

    @property
    def ok(self) -> bool:
        return not self.broken


@dataclass
class _Shared:
    """Work every move of one model x backend repeats, done once: the default move's run
    (the baseline of custom_cost and strict, the serial run of threads, the model state_dict
    saves), what ``_forms`` found on it, and the float graph custom_cost compares against.
    Deterministic work only: a move that builds the same lowered model gets the same checks."""

    key: tuple[str, str]
    default: _Run | None = None
    forms: list[tuple[str, str]] | None = None
    form_names: list[str] = field(default_factory=list)
    compiled: bool = False
    base_sqnr: dict[str, float | None] | None = None
    graph: fx.GraphModule | None = None


_shared: list[_Shared] = []
"""The cache of the model x backend the runner is on (one: the runner goes model by model)."""


def _shared_for(cell: Cell) -> _Shared:
    key = (cell.model, cell.backend)
    if not _shared or _shared[0].key != key:
        _shared[:] = [_Shared(key)]
    return _shared[0]


def _default_run(cell: Cell) -> _Run:
    """The default move's run of the cell's model and backend, built once."""
    shared = _shared_for(cell)
    if shared.default is None:
        zoo = ZOO[cell.model]
        default = Cell(cell.model, cell.backend, "default")
        shared.default = quantize(default, zoo.build(), zoo.inputs(EXAMPLE))
    return shared.default


@dataclass
class _Run:
    """The quantized models of one move, and what they were built from."""

    prepared: fx.GraphModule
    lowered: nn.Module
    reference: nn.Module
    report: Any


def _fingerprint(value: Any) -> list[torch.Tensor]:
    """Clones of every tensor ``value`` holds (a module's state, or a tuple of inputs)."""
    if isinstance(value, nn.Module):
        tensors = [t for _, t in value.state_dict(keep_vars=True).items()]
        return [t.detach().clone() for t in tensors if isinstance(t, torch.Tensor)]
    return [t.detach().clone() for t in value if isinstance(t, torch.Tensor)]


def _changed(before: list[torch.Tensor], value: Any) -> bool:
    after = _fingerprint(value)
    return len(before) != len(after) or not all(
        a.shape == b.shape and torch.equal(a, b) for a, b in zip(before, after, strict=True)
    )


def _backend_config(cell: Cell) -> Any:
    import fxquant

    return None if cell.move == "no_backend_config" else fxquant.get_backend_config(cell.backend)


def _qconfig_mapping(cell: Cell, model: nn.Module) -> Any:
    import fxquant
    from fxquant.numerics.observer import default_weight_observer

    if cell.move == "no_backend_config":  # a torch.ao script as written: the default mapping
        return fxquant.get_default_qconfig_mapping()
    mapping = fxquant.get_default_qconfig_mapping(cell.backend, is_qat=cell.move == "qat")
    if cell.move == "module_none":
        mapping.set_module_name(customized_module(model), None)
    elif cell.move == "object_type":
        kind = customized_type(model)
        base = mapping.global_qconfig
        per_tensor = fxquant.QConfig(activation=base.activation, weight=default_weight_observer)
        mapping.set_object_type(kind, per_tensor)
    return mapping


def customized_module(model: nn.Module) -> str:
    """The module the ``module_none`` move sets to None: the last Linear or Conv2d (a head),
    else the last module holding a weight of its own (GPT-2's layers are transformers'
    ``Conv1D``)."""
    names = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    weighted = [n for n, m in model.named_modules() if "weight" in m._parameters]
    return (names or weighted)[-1]


def customized_type(model: nn.Module) -> type[nn.Module]:
    """The type the ``object_type`` move changes: Linear where the model has one, else Conv2d."""
    has_linear = any(isinstance(m, nn.Linear) for m in model.modules())
    return nn.Linear if has_linear else nn.Conv2d


def _calibrate(prepared: nn.Module, zoo: ZooModel, seeds: tuple[int, ...], qat: bool) -> None:
    if qat:
        train(prepared, zoo, seeds[:QAT_STEPS])
        return
    with torch.no_grad():
        for seed in seeds:
            prepared(*zoo.inputs(seed))


def train(prepared: nn.Module, zoo: ZooModel, seeds: tuple[int, ...]) -> None:
    """The qat move's training, torchvision's QAT reference recipe cut to a step per seed:
    SGD at lr 1e-4, momentum 0.9, weight decay 1e-4, the float model's output as the target
    (a user without labels distils), BatchNorm statistics frozen. The reference trains its
    BatchNorms on 32 images of 224 x 224 and freezes them after 3 epochs; the zoo's batches
    are 2 images of 32 x 32, where EfficientNet's last stages run at 1 x 1 and a training
    BatchNorm normalizes 2 values per channel: its gradients reach 6e6 on the first step and
    1e10 on the second, the weights 1e6, training no user would run."""
    from fxquant.nn.intrinsic.qat import freeze_bn_stats

    teacher = zoo.build().eval()
    prepared.apply(freeze_bn_stats)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-4, momentum=0.9, weight_decay=1e-4)
    for seed in seeds:
        inputs = zoo.inputs(seed)
        with torch.no_grad():
            target = main_output(teacher(*inputs))
        optimizer.zero_grad()
        (main_output(prepared(*inputs)) - target).pow(2).mean().backward()
        optimizer.step()
    prepared.eval()


def quantize(
    cell: Cell,
    model: nn.Module,
    example: tuple[Any, ...],
    *,
    strict: bool = False,
    calibration: tuple[int, ...] = CALIBRATION,
) -> _Run:
    """``model`` prepared, calibrated (or trained two steps) and converted both ways."""
    import fxquant

    zoo = ZOO[cell.model]
    config = _backend_config(cell)
    mapping = _qconfig_mapping(cell, model)
    if cell.move == "qat":
        prepared = fxquant.prepare_qat_fx(model.train(), mapping, example, backend_config=config)
    else:
        prepared = fxquant.prepare_fx(model, mapping, example, backend_config=config, strict=strict)
    _calibrate(prepared, zoo, calibration, cell.move == "qat")
    lowered = fxquant.convert_fx(prepared, backend_config=config, strict=strict)
    reference = fxquant.convert_to_reference_fx(prepared, backend_config=config)
    return _Run(prepared, lowered, reference, fxquant.explain(lowered, show=False))


def _outputs(model: Callable[..., Any], zoo: ZooModel) -> list[torch.Tensor]:
    with torch.no_grad():
        return [main_output(model(*zoo.inputs(seed))) for seed in EVAL]


def _called_untouched(model: Callable[..., Any], zoo: ZooModel, form: str, out: Outcome) -> None:
    for seed in EVAL:
        inputs = zoo.inputs(seed)
        before = _fingerprint(inputs)
        with torch.no_grad():
            model(*inputs)
        if _changed(before, inputs):
            out.fail("untouched", f"{form}: calling it modified the call's inputs")


def _lowered_agrees(run: _Run, zoo: ZooModel, out: Outcome) -> None:
    """Per lowered node, at most one step from the reference model (the node alone)."""
    from fxquant.numerics import compare

    batches = [zoo.inputs(seed) for seed in EVAL]
    reasons = {e.node: e.reason for e in run.report.entries()}
    for row in compare(run.reference, run.lowered, batches, gains=False):
        if row.node == "output" or row.local_steps is None or row.local_steps <= STEP_SLACK:
            continue
        if reasons.get(row.node) is None:
            out.fail(
                "agrees",
                f"convert_fx: {row.node} ({row.pattern}, {row.status}) is "
                f"{row.local_steps:.1f} steps from the reference model, no reason given",
            )


def _explain_is_what_ran(run: _Run, out: Outcome) -> None:
    """A node explain calls lowered runs in no float op of the lowered graph; a node it calls
    reference (quantize, float op, dequantize) is computed by no kernel."""
    from fxquant.flow.epilogues import OUTPUT_OF_KEY

    graph = run.lowered.graph
    kernels = {n.meta[OUTPUT_OF_KEY] for n in graph.nodes if OUTPUT_OF_KEY in n.meta}
    left = {n.name for n in graph.nodes if OUTPUT_OF_KEY not in n.meta and _computes(run, n)}
    entries = run.report.entries()
    lowered = {e.node for e in entries if e.status == "lowered"}
    if as_float := sorted(lowered & left):
        out.fail("explain", f"reported lowered, still a float op in the graph: {as_float[:5]}")
    reference = {e.node for e in entries if e.status == "reference"}
    if as_kernel := sorted(reference & kernels):
        out.fail("explain", f"reported reference, computed by a kernel: {as_kernel[:5]}")


def _computes(run: _Run, node: fx.Node) -> bool:
    """The node computes something (not an Identity module, a placeholder or a constant)."""
    if node.op == "call_module":
        return not isinstance(run.lowered.get_submodule(str(node.target)), nn.Identity)
    return node.op in ("call_function", "call_method")


def _deployed(cell: Cell, run: _Run, zoo: ZooModel, out: Outcome) -> None:
    """The backend's deployment: inputs untouched, output within the reference's steps."""
    from fxquant.registry import get_deployment

    deployment = get_deployment(cell.backend)
    if deployment is None or (cell.backend == "x86" and not cell.compiled):
        return
    example = zoo.inputs(EXAMPLE)
    before = _fingerprint(example)
    # x86's compiled deployment compiles the reference model (it refuses convert_fx's, whose
    # oneDNN kernels inductor cannot see into); the others take convert_fx's
    given = run.reference if cell.backend == "x86" else run.lowered
    deployed = deployment.deploy(given, example)
    out.forms.append(f"deployed ({deployment.name})")
    if _changed(before, example):
        out.fail("untouched", f"{deployment.name}: deploy() modified the example inputs")
    _called_untouched(deployed, zoo, deployment.name, out)
    _output_steps(run, deployed, zoo, deployment.name, out)


def _output_steps(
    run: _Run, deployed: Callable[..., Any], zoo: ZooModel, form: str, out: Outcome
) -> None:
    """Output-level agreement: the largest difference in steps as the output sees them (see
    :func:`output_step`), at most one per quantized node (a deployment's nodes are not
    visible one by one)."""
    quantized = sum(1 for e in run.report.entries() if e.status in ("lowered", "reference"))
    expected_outputs = _outputs(run.reference, zoo)
    steps_off = _outputs(one_step_off(run.reference), zoo)
    for expected, off, got in zip(
        expected_outputs, steps_off, _outputs(deployed, zoo), strict=True
    ):
        step = output_step(expected, off)
        steps = float((expected - got).abs().max()) / step
        if steps > max(quantized, 1) * STEP_SLACK:
            out.fail(
                "agrees",
                f"{form}: output {steps:.1f} steps from the reference model "
                f"(at most {quantized}, one per quantized node)",
            )
            return


def _step_of(value: torch.Tensor) -> float:
    """A uint8 grid's step over ``value``'s range: the output's quantization step."""
    return max(float(value.max() - value.min()) / 255.0, 1e-8)


def output_step(expected: torch.Tensor, one_step: torch.Tensor) -> float:
    """One quantization step as the output sees it: the output's own grid step, or, where
    float ops follow the last quantized values (a head kept float), how far they move the
    output when each of those values is one step off (``one_step``: the reference model's
    output then, :func:`one_step_off`). A float Linear head sums its inputs, each on the
    pool's grid: torchvision's Swin with its head float (executorch refuses per-tensor
    -128..127 weights) moves its output 13.5 of the output's own steps per step of the
    pool, whose range (1.5) is 13 times the output's (0.11)."""
    return max(_step_of(expected), float((one_step - expected).abs().max()))


def one_step_off(reference: nn.Module) -> nn.Module:
    """``reference`` with each integer value read by a last dequantize (one after which only
    float ops reach the output) moved one step up or down, signs drawn with a fixed seed:
    what a deployment whose kernels each round one step apart could give. A quantized output
    gives its own grid's step back; a reference that is not a graph is returned as it is."""
    from fxquant.lowering import DEQUANTIZE_OPS, QUANTIZE_OPS

    if not isinstance(reference, fx.GraphModule):
        return reference
    model = copy.deepcopy(reference)
    graph = model.graph
    seen, last, todo = set(), [], [n for n in graph.nodes if n.op == "output"]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        source = node.args[0] if node.args else None
        if node.target in DEQUANTIZE_OPS and getattr(source, "target", None) in QUANTIZE_OPS:
            last.append(node)
        elif node.target not in QUANTIZE_OPS | DEQUANTIZE_OPS:
            todo.extend(node.all_input_nodes)
    for node in last:
        with graph.inserting_before(node):
            moved = graph.call_function(_one_step_apart, (node.args[0],))
        node.replace_input_with(node.args[0], moved)
    model.recompile()
    return model


def _one_step_apart(values: torch.Tensor) -> torch.Tensor:
    """Integer ``values`` each moved one step, up or down at random (seeded), in range."""
    if values.is_floating_point():  # a cast to a float format (bf16): no integer step
        return values
    generator = torch.Generator().manual_seed(values.numel())
    signs = torch.randint(0, 2, values.shape, generator=generator) * 2 - 1
    info = torch.iinfo(values.dtype)
    return (values.to(torch.int32) + signs).clamp(info.min, info.max).to(values.dtype)


def _sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    noise = float((expected.double() - got.double()).pow(2).sum())
    return (
        math.inf if noise == 0 else 10 * math.log10(float(expected.double().pow(2).sum()) / noise)
    )


def _forms(cell: Cell, run: _Run, zoo: ZooModel, out: Outcome) -> None:
    """Every output form checked; a run that built the default move's models again (strict
    raising nothing, state_dict) gets the default run's findings, checked once per process
    whichever move comes first, not a second deployment."""
    shared = _shared_for(cell)
    if shared.default is not None and _same_models(run, shared.default):
        run = shared.default  # the same code, state and report: the same findings
    start, named = len(out.broken), len(out.forms)
    reuse = shared.forms is not None and shared.compiled == cell.compiled
    if reuse and run is shared.default:
        out.forms.extend(shared.form_names)
        out.broken.extend(shared.forms or [])
        return
    _check_forms(cell, run, zoo, out)
    if run is shared.default:
        shared.forms, shared.form_names = out.broken[start:], out.forms[named:]
        shared.compiled = cell.compiled


def _same_models(one: _Run, other: _Run) -> bool:
    """Both runs built the same lowered and reference models: same code, same state, same report."""
    if one is other:
        return True
    for a, b in ((one.lowered, other.lowered), (one.reference, other.reference)):
        if (
            not isinstance(a, fx.GraphModule)
            or not isinstance(b, fx.GraphModule)
            or a.code != b.code
        ):
            return False
        if _changed(_fingerprint(a), b):
            return False
    rows = [[(e.node, e.status, e.reason) for e in r.report.entries()] for r in (one, other)]
    return rows[0] == rows[1]


def _check_forms(cell: Cell, run: _Run, zoo: ZooModel, out: Outcome) -> None:
    out.forms.extend(["convert_fx", "convert_to_reference_fx"])
    _called_untouched(run.lowered, zoo, "convert_fx", out)
    _called_untouched(run.reference, zoo, "convert_to_reference_fx", out)
    _lowered_agrees(run, zoo, out)
    _explain_is_what_ran(run, out)
    if cell.move != "no_backend_config":
        _deployed(cell, run, zoo, out)


def _untouched_layers(cell: Cell, model: nn.Module, prepared: fx.GraphModule) -> set[str]:
    """The Linear and Conv nodes the customization does not name: their local error comes
    from their own weights and input steps, so a neighbour turned float does not move it,
    while a graph mode dropped because of the customization does (issue 30 break 2)."""
    from fxquant.flow.state import META_KEY

    name = customized_module(model) if cell.move == "module_none" else None
    kind = customized_type(model)
    layers = (nn.Linear, nn.Conv1d, nn.Conv2d)
    found = set()
    for node in prepared.graph.nodes:
        info = node.meta.get(META_KEY)
        path = getattr(info, "module_path", None) or ""
        types = [t for t in (getattr(info, "module_type", None), *getattr(info, "fused_from", ()))]
        types = [t for t in types if isinstance(t, type)]
        if not any(issubclass(t, layers) for t in types):
            continue
        if name is not None and (path == name or path.startswith(name + ".")):
            continue
        if name is None and any(issubclass(t, kind) for t in types):
            continue
        found.add(node.name)
    return found


def _custom_cost(cell: Cell, run: _Run, model: nn.Module, out: Outcome) -> None:
    """Each node the customization does not name keeps its default local SQNR within 1 dB."""
    from fxquant.numerics import compare

    zoo = ZOO[cell.model]
    shared = _shared_for(cell)
    batches = [zoo.inputs(seed) for seed in EVAL]
    if shared.graph is None:
        shared.graph = float_graph(zoo.build(), zoo.inputs(EXAMPLE), run.lowered)
    graph = shared.graph
    ours = {r.node: r.local_sqnr for r in compare(graph, run.lowered, batches, gains=False)}
    if shared.base_sqnr is None:
        default = _default_run(cell).lowered
        rows = compare(graph, default, batches, gains=False)
        shared.base_sqnr = {r.node: r.local_sqnr for r in rows}
    base = shared.base_sqnr
    untouched = _untouched_layers(cell, model, run.prepared)
    worse = []
    for node, before in base.items():
        after = ours.get(node)
        if node not in untouched or before is None or after is None:
            continue
        if min(after, CAP_DB) < min(before, CAP_DB) - COST_DB:
            worse.append(f"{node} {before:.1f} -> {after:.1f} dB")
    if worse:
        out.fail("custom_cost", f"{len(worse)} untouched nodes lost > {COST_DB} dB: {worse[:4]}")


def float_graph(model: nn.Module, example: tuple[Any, ...], quantized: nn.Module) -> fx.GraphModule:
    """``model`` traced from ``example`` and fused as prepare did: ``compare`` given the float
    model traces it without inputs, which transformers' models need (BertModel: "You have to
    specify either input_ids or inputs_embeds")."""
    import dataclasses

    from fxquant.flow import TRACING_LOCK, _capture, _fuse
    from fxquant.flow.context import FlowContext
    from fxquant.flow.state import META_KEY

    backend = quantized.meta[META_KEY].backend_config
    ctx = dataclasses.replace(FlowContext.for_fuse(None, backend), example_inputs=example)
    with TRACING_LOCK:
        return _fuse(_capture(copy.deepcopy(model), ctx), ctx)


def _native(run: _Run, out: Outcome) -> None:
    """torch.ao's script without ``backend_config`` lowers to the host's native backend."""
    if not any(e.status == "lowered" for e in run.report.entries()):
        out.fail(
            "native",
            "no backend_config: nothing lowered (a torch.ao script gets its "
            "native engine's kernels)",
        )


def _standard(cell: Cell, model: nn.Module, example: tuple[Any, ...], out: Outcome) -> None:
    run = quantize(cell, model, example)
    if cell.move == "default":
        _shared_for(cell).default = run
    _forms(cell, run, ZOO[cell.model], out)
    if cell.move in ("module_none", "object_type"):
        _custom_cost(cell, run, model, out)
    if cell.move == "no_backend_config":
        _native(run, out)


def _strict(cell: Cell, model: nn.Module, example: tuple[Any, ...], out: Outcome) -> None:
    """strict=True raises exactly when the default run skips, naming every skipped node."""
    import fxquant
    from fxquant.errors import QuantizationSkipped

    lenient = _default_run(cell)
    # prepare raises first: the nodes its report calls skipped (convert's own, lowering
    # declined, come after it and are reported by explain)
    prepared = fxquant.explain(lenient.prepared, show=False)
    skipped = [e.node for e in prepared.skipped()]
    try:
        run = quantize(cell, model, example, strict=True)
    except QuantizationSkipped as error:
        if not skipped:
            out.fail("strict", f"raised with nothing skipped by default: {error}")
        elif missing := [n for n in skipped if n not in str(error)]:
            out.fail("strict", f"the error does not name skipped nodes {missing[:5]}")
        return
    if skipped:
        out.fail("strict", f"did not raise; the default run skips {skipped[:6]}")
    _forms(cell, run, ZOO[cell.model], out)


def _state_dict(cell: Cell, model: nn.Module, example: tuple[Any, ...], out: Outcome) -> None:
    """docs/guide/save-load.md's way: the prepared state_dict, saved with weights_only and
    loaded into a model prepared and calibrated on other data, converts to the same model."""
    import fxquant

    zoo = ZOO[cell.model]
    run = _default_run(cell)
    _forms(cell, run, zoo, out)
    buffer = io.BytesIO()
    torch.save(run.prepared.state_dict(), buffer)
    buffer.seek(0)
    fresh = quantize(cell, model, example, calibration=(7,))
    fresh.prepared.load_state_dict(torch.load(buffer, weights_only=True))
    loaded = fxquant.convert_fx(fresh.prepared, backend_config=_backend_config(cell))
    for a, b in zip(_outputs(run.lowered, zoo), _outputs(loaded, zoo), strict=True):
        if not torch.equal(a, b):
            out.fail("state_dict", f"loaded model's output differs ({_sqnr(a, b):.1f} dB)")
            return


def _threads(cell: Cell, model: nn.Module, example: tuple[Any, ...], out: Outcome) -> None:
    """Three threads quantizing copies at once give the serial model's outputs exactly."""
    zoo = ZOO[cell.model]
    serial = _outputs(_default_run(cell).lowered, zoo)
    copies = [copy.deepcopy(model) for _ in range(3)]
    results: dict[int, Any] = {}

    def work(index: int) -> None:
        try:
            results[index] = _outputs(quantize(cell, copies[index], example).lowered, zoo)
        except Exception as error:  # recorded: the cell reports it
            results[index] = error

    workers = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    for index, result in sorted(results.items()):
        if isinstance(result, Exception):
            out.fail("threads", f"thread {index}: {type(result).__name__}: {result}")
        elif not all(torch.equal(a, b) for a, b in zip(serial, result, strict=True)):
            out.fail("threads", f"thread {index}: outputs differ from the serial run")


_MOVES: dict[str, Callable[[Cell, nn.Module, tuple[Any, ...], Outcome], None]] = {
    "strict": _strict,
    "state_dict": _state_dict,
    "threads": _threads,
}


def check(cell: Cell) -> Outcome:
    """Run ``cell`` and check every invariant on it; never raises for the model's failures."""
    import time

    out = Outcome(cell)
    start = time.perf_counter()
    zoo = ZOO[cell.model]
    model = zoo.build()
    if cell.move == "qat":
        model.train()  # the caller's model, as QAT users hand it over
    example = zoo.inputs(EXAMPLE)
    before, inputs_before = _fingerprint(model), _fingerprint(example)
    modules_before = [name for name, _ in model.named_modules()]
    with quiet():
        try:
            _MOVES.get(cell.move, _standard)(cell, model, example, out)
        except Exception as error:  # every failure is the cell's finding
            out.fail("refused", f"{type(error).__name__}: {error}")
    if _changed(before, model) or modules_before != [n for n, _ in model.named_modules()]:
        out.fail("untouched", "the caller's model was modified")
    if _changed(inputs_before, example):
        out.fail("untouched", "the caller's example inputs were modified")
    out.seconds = time.perf_counter() - start
    return out
