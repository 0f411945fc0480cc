"""The invariant matrix's fast slice (issue 30): cells drawn by a seeded sampler.

Each cell (model, backend, user move) is quantized and checked on every output form the
backend has (``convert_fx``, ``convert_to_reference_fx``, its deployment but x86's compiled
one) against every invariant of :mod:`tests.invariants.checks`. ``nox -s matrix`` runs the
whole matrix and writes docs/guide/matrix.md; ``FXQUANT_MATRIX_SEED`` draws another slice.
A cell the matrix found failing and left open is ``xfail(strict=True)`` with the finding
(``known_break``), so the marker goes when the fix lands.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import fxquant
import pytest
import torch

from tests.invariants import matrix
from tests.invariants.cells import FAST_MODELS, MOVES, Cell, known_break, sample
from tests.invariants.checks import check
from tests.zoo import torchvision_models
from tests.zoo.runner import ZOO

SEED = int(os.environ.get("FXQUANT_MATRIX_SEED", "30"))
COUNT = 20
PINNED = (
    Cell("tv_efficientnet_b0", "x86", "default"),
    Cell("bert", "tensorrt", "module_none"),
    Cell("nn_transformer_encoder", "x86", "strict"),
    Cell("resnet", "x86", "no_backend_config"),
)
"""The issue's own rows, always in the slice: each break's first case."""
BACKENDS = [b for b in ("x86", "onednn", "fbgemm", "qnnpack", "executorch", "tensorrt")]


def _installed() -> list[str]:
    return [b for b in BACKENDS if b in fxquant.list_backends()]


def _param(cell: Cell) -> object:
    reason = known_break(cell)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(cell, id=cell.id, marks=marks)


def _cells() -> list[object]:
    drawn = sample(list(FAST_MODELS), _installed(), COUNT, SEED)
    pinned = [c for c in PINNED if c.backend in _installed() and c not in drawn]
    return [_param(c) for c in [*pinned, *drawn]]


@pytest.mark.parametrize("cell", _cells())
def test_every_invariant_holds_on_the_cell(cell: Cell) -> None:
    if cell.model.startswith("tv_"):
        torchvision_models.require()
    if cell.model in _TRANSFORMERS_MODELS:
        pytest.importorskip("transformers")
    outcome = check(cell)
    assert outcome.ok, "\n".join(f"[{name}] {words}" for name, words in outcome.broken)


_TRANSFORMERS_MODELS = ("bert", "gpt2", "distilbert", "wav2vec2")


def test_the_sampler_draws_every_move_and_is_seeded() -> None:
    cells = sample(list(FAST_MODELS), ["x86", "executorch"], COUNT, seed=SEED)
    assert {c.move for c in cells} == set(MOVES)
    assert cells == sample(list(FAST_MODELS), ["x86", "executorch"], COUNT, seed=SEED)
    assert cells != sample(list(FAST_MODELS), ["x86", "executorch"], COUNT, seed=SEED + 1)


def test_a_killed_run_goes_on_with_the_cells_not_in_the_results_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(matrix, "RESULTS", tmp_path / "matrix.jsonl")
    first, second = Cell("resnet", "x86", "threads"), Cell("resnet", "x86", "no_backend_config")
    matrix._run([first], set())
    done = {row["cell"] for row in matrix.load()}
    fresh = matrix._run([first, second], done)
    assert [row["cell"] for row in fresh] == [second.id]
    assert [row["cell"] for row in matrix.load()] == [first.id, second.id]
    # a rerun of a cell replaces its row on the page
    matrix._run([first], set())
    assert sorted(row["cell"] for row in matrix.load()) == sorted([first.id, second.id])


def test_a_move_sharing_the_default_run_finds_what_it_finds_alone() -> None:
    from tests.invariants import checks

    strict = Cell("resnet", "x86", "strict")
    checks._shared.clear()
    alone = check(strict)
    check(Cell("resnet", "x86", "default"))
    shared = check(strict)
    assert (alone.broken, alone.forms) == (shared.broken, shared.forms)
    default = checks._shared[0].default
    assert default is not None
    other = checks.quantize(
        Cell("resnet", "x86", "module_none"), ZOO["resnet"].build(), ZOO["resnet"].inputs(0)
    )
    assert not checks._same_models(other, default)


def test_strict_then_state_dict_check_the_default_models_forms_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """strict (raising nothing) and state_dict both build the default move's models: the
    second reuses the first's findings, so an executorch model costs one XNNPACK lowering
    for the two, and each finds what it finds alone."""
    from tests.invariants import checks

    cells = [Cell("resnet", "executorch", move) for move in ("strict", "state_dict")]
    alone = []
    for cell in cells:
        checks._shared.clear()
        outcome = check(cell)
        alone.append((outcome.ok, outcome.broken, outcome.forms))
    checked = []
    real = checks._check_forms
    monkeypatch.setattr(
        checks, "_check_forms", lambda *args: checked.append(args[0]) or real(*args)
    )
    checks._shared.clear()
    together = [check(cell) for cell in cells]
    assert [(o.ok, o.broken, o.forms) for o in together] == alone
    assert [c.move for c in checked] == ["strict"]
    assert "deployed (ExecuTorch XNNPACK)" in together[1].forms


def test_a_cell_measures_local_errors_without_the_output_gains_it_never_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compare's output gains rerun the model once per quantized node (87% of compare's time
    on a ResNet-18): agrees and custom_cost read only the local errors."""
    import importlib

    from tests.invariants import checks

    # the module, not the function fxquant.tools.debug re-exports under the same name
    compare = importlib.import_module("fxquant.tools.debug.compare")

    def no_gains(*args: object) -> None:
        msg = "the matrix measured output gains"
        raise AssertionError(msg)

    monkeypatch.setattr(compare, "output_gains", no_gains)
    checks._shared.clear()  # the default run custom_cost compares against is built here
    outcome = check(Cell("resnet", "x86", "module_none"))
    assert outcome.ok, outcome.broken


def test_the_qat_move_trains_efficientnet_without_leaving_its_float_model() -> None:
    """EfficientNet-b0 runs its last stages at 1 x 1 on the zoo's 32 x 32 images: two steps
    of the qat move's training at lr 1e-4 keep the model near its float self (training
    BatchNorms over 2 values per channel blew the weights up to 1e6)."""
    torchvision_models.require()
    from tests.invariants import checks
    from tests.zoo.runner import HELD_OUT, main_output, pooled_sqnr

    cell = Cell("tv_efficientnet_b0", "x86", "qat")
    zoo = ZOO[cell.model]
    run = checks.quantize(cell, zoo.build().train(), zoo.inputs(0))
    teacher = zoo.build()
    with torch.no_grad():
        batches = [zoo.inputs(seed) for seed in HELD_OUT[:2]]
        expected = [main_output(teacher(*x)) for x in batches]
        got = [main_output(run.lowered(*x)) for x in batches]
    pooled, _ = pooled_sqnr(expected, got)
    assert pooled >= 20, f"{pooled:.1f} dB from the float model after the qat move"


def _pooled_head_model() -> torch.nn.Module:
    """conv -> pool -> flatten -> Linear head, the head float: the conv's biases spread the
    pool's values over 4 (its step 4 / 255) while the head's rows are orthogonal to that
    spread, so the output's range is a hundredth of the pool's (Swin's head, float under the
    object_type move on executorch, moves its output 13 of its own steps per pool step)."""
    generator = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(3, 64, 3)
    head = torch.nn.Linear(64, 10)
    with torch.no_grad():
        conv.weight.copy_(0.05 * torch.randn(conv.weight.shape, generator=generator))
        conv.bias.copy_(torch.linspace(-2.0, 2.0, 64))
        spread = conv.bias / conv.bias.norm()
        rows = 0.1 * torch.randn(head.weight.shape, generator=generator)
        head.weight.copy_(rows - (rows @ spread)[:, None] * spread)
        head.bias.zero_()
    pool = torch.nn.AdaptiveAvgPool2d(1)
    return torch.nn.Sequential(conv, pool, torch.nn.Flatten(), head).eval()


def _nudged(model: torch.nn.Module, shift: object) -> object:
    """``model`` with ``shift(values)`` added to what its head reads: a deployment whose
    pool kernel rounds differently from the reference's."""
    head = model.get_submodule("3")

    def nudge(module: object, args: tuple[torch.Tensor]) -> tuple[torch.Tensor]:
        return (args[0] + shift(args[0]),)  # type: ignore[operator]  # a callable

    head.register_forward_pre_hook(nudge)
    return model


def test_a_deployment_one_step_apart_before_a_float_head_agrees_and_three_apart_does_not() -> None:
    """The output-level check counts steps as the output sees them: a float head after the
    last quantized values turns each of their steps into many of the output's own (the
    agrees invariant failed tv_swin-executorch-object_type, every quantized node within one
    step of the reference, on the output's range / 255)."""
    import copy

    from tests.invariants import checks
    from tests.zoo.runner import ZooModel, images

    zoo = ZooModel("pooled_head", "test", _pooled_head_model, images)
    mapping = fxquant.get_default_qconfig_mapping("reference").set_module_name("3", None)
    prepared = fxquant.prepare_fx(zoo.build(), mapping, zoo.inputs(0), backend_config=None)
    with torch.no_grad():
        for seed in (1, 2, 3):
            prepared(*zoo.inputs(seed))
    lowered = fxquant.convert_fx(prepared)
    reference = fxquant.convert_to_reference_fx(prepared)
    run = checks._Run(prepared, lowered, reference, fxquant.explain(lowered, show=False))
    scale = next(
        float(n.args[1])
        for n in reference.graph.nodes
        if "dequantize" in str(n.target)
        and n.args[0].name.startswith("quantize_per_tensor")
        and any(u.target == "3" for u in n.users)
    )
    one = torch.zeros(64)
    one[7] = scale  # one pooled value one step up
    apart = _nudged(copy.deepcopy(reference), lambda values: one)
    # every pooled value three steps off, the way the head's first row reads them
    towards = 3 * scale * reference.get_submodule("3").weight[0].sign()
    far = _nudged(copy.deepcopy(reference), lambda values: towards)
    for model, broken in ((apart, False), (far, True)):
        out = checks.Outcome(Cell("resnet", "reference", "default"))
        checks._output_steps(run, model, zoo, "stand-in", out)
        assert bool(out.broken) == broken, out.broken


def test_the_page_counts_the_cells_that_ran_the_compiled_deployment(tmp_path: Path) -> None:
    """A compiled row replaces the default row of its cell in the table: the page says how
    many x86 default cells ran the compiled deployment, so a run with ``--no-compiled``
    does not read as the whole column."""
    rows = [
        {
            "cell": cell.id,
            "model": cell.model,
            "backend": "x86",
            "move": "default",
            "ok": ok,
            "broken": [] if ok else [["untouched", "x86 compiled: calling it modified inputs"]],
            "forms": [],
            "seconds": seconds,
        }
        for cell, ok, seconds in (
            (Cell("resnet", "x86", "default", compiled=True), True, 30.0),
            (Cell("bert", "x86", "default", compiled=True), False, 90.0),
            (Cell("gpt2", "x86", "default"), True, 1.0),
        )
    ]
    path = tmp_path / "matrix.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = matrix.render(matrix.load(path))
    assert (
        f"on the default move: 2 of {len(ZOO)} cells run with it, 1 pass, 60 s a cell (median)."
        in page
    )
    none = matrix.render([rows[2]])
    assert f"0 of {len(ZOO)} cells run with it, 0 pass (every run passed `--no-compiled`)" in none


def _row(cell: Cell, ok: bool, when: str) -> dict[str, object]:
    broken = [] if ok else [["untouched", f"{cell.backend}: calling it modified inputs"]]
    return {
        "cell": cell.id,
        "model": cell.model,
        "backend": cell.backend,
        "move": cell.move,
        "ok": ok,
        "broken": broken,
        "forms": [],
        "seconds": 10.0,
        "when": when,
    }


@pytest.mark.parametrize("compiled_ok", [True, False])
def test_a_plain_run_after_a_compiled_one_keeps_the_compiled_row_on_the_page(
    tmp_path: Path, compiled_ok: bool
) -> None:
    """``--fresh --no-compiled`` after a full run: the plain x86 default row comes later in
    the file; the page still counts the compiled deployment's cell (and its failure), and
    the model's default cell once."""
    compiled = Cell("resnet", "x86", "default", compiled=True)
    plain = Cell("resnet", "x86", "default")
    path = tmp_path / "matrix.jsonl"
    rows = [_row(compiled, compiled_ok, "2026-12-06 18:00"), _row(plain, True, "2026-12-06 19:00")]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = matrix.render(matrix.load(path))
    passed = 1 if compiled_ok else 0
    assert f"on the default move: 1 of {len(ZOO)} cells run with it, {passed} pass" in page
    assert f"; 1 were run, {passed} pass." in page
    mark = "ok" if compiled_ok else "untouched"
    assert f"| resnet | x86 | {mark} |" in page
    if not compiled_ok:
        assert f"`{compiled.id}`" in page, "the compiled cell's failure is listed"


@pytest.mark.parametrize("backend", ["qnnpack", "executorch"])
def test_the_object_type_move_on_127_weight_backends_is_a_float_row_the_page_explains(
    backend: str,
) -> None:
    """The move's weight observer is torch.ao's ``default_weight_observer`` (-128..127, eps
    2**-23), as a user writes it from torch.ao's docs: the backends whose kernels take
    -127..127 weights keep the type float, saying which arguments fit, and the page says so."""
    from tests.invariants.checks import _qconfig_mapping, customized_type

    if backend not in fxquant.list_backends():
        pytest.skip(f"{backend} is not installed")
    cell = Cell("resnet", backend, "object_type")
    zoo = ZOO[cell.model]
    model = zoo.build()
    mapping = _qconfig_mapping(cell, model)
    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_fx(model, mapping, zoo.inputs(0), backend_config=config)
    kind = customized_type(model)
    paths = {n for n, m in model.named_modules() if isinstance(m, kind)}
    changed = {n.name for n in prepared.graph.nodes if n.op == "call_module" and n.target in paths}
    entries = [e for e in fxquant.explain(prepared, show=False).entries() if e.node in changed]
    assert entries
    assert all(e.reason is not None and e.reason.code == "quant_range" for e in entries)
    assert all("quant_min=-127, quant_max=127" in e.reason.words for e in entries)
    assert "qnnpack and executorch, whose kernels take weights in\n-127..127" in matrix.render([])
