"""The lowering vocabulary: one home, a leaf, the one definition of the q/dq op sets."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import fxquant.registry
import fxquant.tools.export
import pytest
import torch
from fxquant import lowering
from fxquant.registry import answers, hookspecs

ROOT = Path(__file__).resolve().parents[1]
QDQ_NAMES = (
    "quantize_per_tensor",
    "dequantize_per_tensor",
    "quantize_per_channel",
    "dequantize_per_channel",
)


def test_the_vocabulary_imports_nothing_of_fxquant_above_the_config_layer() -> None:
    # a bare fxquant package: its __init__ (which imports everything) does not run
    code = textwrap.dedent(
        f"""
        import sys, types
        package = types.ModuleType("fxquant")
        package.__path__ = [{str(ROOT / "core" / "fxquant")!r}]
        sys.modules["fxquant"] = package
        import fxquant.lowering
        print(sorted(name for name in sys.modules if name.startswith("fxquant")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    loaded = ast.literal_eval(out.stdout.strip())
    # the exception tree and config.pattern (a rule's pattern is normalized on the way in,
    # #21); nothing of the flow, the registry, numerics, nn, patterns or the tools
    assert {"fxquant.errors", "fxquant.config.pattern", "fxquant.lowering"} <= set(loaded)
    above = ("flow", "registry", "numerics", "nn", "patterns", "tools", "export", "lowering.")
    assert [name for name in loaded if name.startswith(tuple(f"fxquant.{p}" for p in above))] == []


def test_the_exception_tree_imports_nothing_itself() -> None:
    tree = ast.parse((ROOT / "core" / "fxquant" / "errors.py").read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    assert imported == ["__future__"]


@pytest.mark.parametrize("name", QDQ_NAMES)
def test_the_op_sets_hold_every_overload_of_each_quantize_and_dequantize_op(name: str) -> None:
    packet = getattr(torch.ops.fxquant, name)
    overloads = {getattr(packet, overload) for overload in packet.overloads()}
    expected = lowering.QUANTIZE_OPS if name.startswith("quantize") else lowering.DEQUANTIZE_OPS
    assert overloads <= expected
    assert overloads <= lowering.QDQ_OPS
    assert (packet.default in lowering.PER_CHANNEL_OPS) == name.endswith("per_channel")


def test_static_ops_are_the_default_overloads_and_dynamic_ones_the_tensor_overloads() -> None:
    static = lowering.STATIC_QUANTIZE_OPS | lowering.STATIC_DEQUANTIZE_OPS
    assert {op._overloadname for op in static} == {"default"}
    # dynamic: the .tensor overloads (per tensor) and the per-token ops (qparams per row, #23)
    dynamic = lowering.QDQ_OPS - static - lowering.PER_TOKEN_OPS
    assert {op._overloadname for op in dynamic} == {"tensor"}
    assert lowering.PER_TOKEN_OPS <= lowering.QDQ_OPS
    assert lowering.STATIC_QUANTIZE_OPS <= lowering.QUANTIZE_OPS
    assert lowering.STATIC_DEQUANTIZE_OPS <= lowering.DEQUANTIZE_OPS


def test_each_quantize_op_pairs_with_the_dequantize_op_of_the_same_qparams() -> None:
    assert set(lowering.DEQUANTIZE_OF) == lowering.QUANTIZE_OPS
    assert set(lowering.DEQUANTIZE_OF.values()) == lowering.DEQUANTIZE_OPS
    for quantize, dequantize in lowering.DEQUANTIZE_OF.items():
        ours = [a.name for a in quantize._schema.arguments]
        theirs = [a.name for a in dequantize._schema.arguments if not a.kwarg_only]
        # per token: quantized_decomposed's schema, whose dequantize names its output dtype
        assert ours == (theirs[:-1] if quantize in lowering.PER_TOKEN_OPS else theirs)
        x = torch.rand(3, 4)  # inside every range below: the round trip is half a step off
        qparams = (
            (torch.tensor([0.1, 0.2, 0.1]), torch.tensor([1, 0, 2]), 0)
            if quantize in lowering.PER_CHANNEL_OPS
            else (torch.full((3, 1), 0.1), torch.full((3, 1), 3))
            if quantize in lowering.PER_TOKEN_OPS
            else (torch.tensor(0.1), torch.tensor(3))
            if quantize._overloadname == "tensor"
            else (0.1, 3)
        )
        q = quantize(x, *qparams, 0, 255, torch.uint8)
        assert q.dtype == torch.uint8
        out = (torch.float32,) if quantize in lowering.PER_TOKEN_OPS else ()
        error = dequantize(q, *qparams, 0, 255, torch.uint8, *out) - x
        assert float(error.abs().max()) <= 0.1 + 1e-6


def _qdq_op(node: ast.AST) -> bool:
    """``<anything>.<q/dq op>.<overload>``: one of fxquant's quantize/dequantize overloads."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr in QDQ_NAMES
    )


def _op_collections(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        collection = isinstance(node, (ast.Set, ast.Tuple, ast.List))
        if collection and sum(_qdq_op(item) for item in node.elts) >= 2:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_but_the_vocabulary_spells_out_a_set_of_qdq_ops() -> None:
    files = [*ROOT.glob("core/fxquant/**/*.py"), *ROOT.glob("plugins/*/src/**/*.py")]
    found = [hit for path in files for hit in _op_collections(path)]
    assert found == [f"core/fxquant/lowering/__init__.py:{line}" for line in _vocabulary_lines()]


def _vocabulary_lines() -> list[int]:
    return [
        int(hit.rsplit(":", 1)[1])
        for hit in _op_collections(ROOT / "core/fxquant/lowering/__init__.py")
    ]


def test_hookspecs_defines_the_hook_specifications_and_nothing_else() -> None:
    own = [
        name
        for name, value in vars(hookspecs).items()
        if getattr(value, "__module__", None) == hookspecs.__name__
    ]
    assert own
    assert all(getattr(getattr(hookspecs, name), "fxquant_spec", None) is not None for name in own)


@pytest.mark.parametrize(
    ("module", "name", "home"),
    [
        (hookspecs, "LoweringRule", lowering),
        (hookspecs, "LoweringMatch", lowering),
        (hookspecs, "QParams", lowering),
        (hookspecs, "Quantize", lowering),
        (hookspecs, "Dequantize", lowering),
        (hookspecs, "Override", answers),
        (hookspecs, "Deployment", answers),
        (hookspecs, "Deployed", answers),
        (fxquant.registry, "LoweringRule", lowering),
        (fxquant.registry, "Override", answers),
        (fxquant.registry, "Deployment", answers),
        (fxquant.tools.export, "QUANTIZE_OPS", lowering),
        (fxquant.tools.export, "DEQUANTIZE_OPS", lowering),
    ],
)
def test_the_records_stay_importable_where_plugins_import_them(
    module: object, name: str, home: object
) -> None:
    assert getattr(module, name) is getattr(home, name)
