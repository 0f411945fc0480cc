"""The backend is resolved once, at the entry point, into the FlowContext and the model.

``fxquant.registry.resolve_backend`` is the flow's one question to the registry: the
entry points (``fuse_fx``, ``prepare_fx``, ``prepare_qat_fx``, ``convert_fx``) ask it,
the steps read the answer from the ``FlowContext``, and ``convert_fx`` lowers with what
prepare recorded on the model. No module under ``fxquant/flow/`` touches pluggy, calls
a hook or looks a backend up by name.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fxquant
import pytest
import torch
from fxquant.errors import ConfigError, NativeBackendWarning
from fxquant.flow.state import flow_state
from fxquant.lowering import LoweringRule
from fxquant.nn import reference
from fxquant.registry import hookimpl
from fxquant.registry.manager import Registry
from torch import nn

CORE = Path(fxquant.__file__).parent
FLOW = CORE / "flow"
# what a flow module may import from the registry: the records it carries, and the one call
REGISTRY_IMPORTS = {
    "fxquant.registry": {"resolve_backend"},
    "fxquant.registry.answers": None,  # records (GraphMode): any name
    "fxquant.registry.resolution": {"ResolvedBackend"},
}
ENTRY_POINTS = {"__init__.py", "convert.py"}  # the modules of the public flow functions
LOOKUPS = {
    "assembled",
    "default_registry",
    "get_backend_config",
    "get_default_qconfig_mapping",
    "get_deployment",
    "get_hookimpls",
    "hook",
    "list_backends",
}


def _imports(tree: ast.Module) -> Iterator[tuple[int, str, str | None]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            yield from ((node.lineno, node.module, alias.name) for alias in node.names)


def _registry_problems(path: Path, tree: ast.Module) -> list[str]:
    problems = []
    for line, module, name in _imports(tree):
        where = f"{path.name}:{line}"
        if module.split(".")[0] == "pluggy":
            problems.append(f"{where} imports pluggy")
        elif module == "fxquant.registry" and name is None:
            problems.append(f"{where} imports the registry module whole")
        elif module.startswith("fxquant.registry"):
            allowed = REGISTRY_IMPORTS.get(module, set())
            if allowed is not None and name not in allowed:
                problems.append(f"{where} imports {module}.{name}")
            if name == "resolve_backend" and path.name not in ENTRY_POINTS:
                problems.append(f"{where}: only the entry points resolve the backend")
    return problems


def _lookup_problems(path: Path, tree: ast.Module) -> list[str]:
    problems = []
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if name in LOOKUPS:
            problems.append(f"{path.name}:{node.lineno} reads {name!r}")  # type: ignore[attr-defined]  # Attribute and Name have lineno
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if called.startswith("fxquant_"):
                problems.append(f"{path.name}:{node.lineno} calls the hook {called}")
    return problems


def test_no_flow_module_touches_pluggy_calls_a_hook_or_looks_a_backend_up() -> None:
    files = sorted(FLOW.rglob("*.py"))
    assert len(files) > 20  # the flow package is where we think it is
    problems = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        problems += _registry_problems(path, tree) + _lookup_problems(path, tree)
    assert problems == []


def test_the_checks_above_catch_a_lookup_by_name_and_a_hook_call() -> None:
    source = (
        "import pluggy\n"
        "from fxquant.registry import get_backend_config, resolve_backend\n"
        "from fxquant.registry.assembly import graph_mode\n"
        "def step(ctx):\n"
        "    registry.default_registry().assembled(ctx.backend_config.name)\n"
        "    return manager.hook.fxquant_graph_mode(backend='x86')\n"
    )
    tree = ast.parse(source)
    path = Path("step.py")
    found = _registry_problems(path, tree) + _lookup_problems(path, tree)
    assert sorted(found) == [
        "step.py:1 imports pluggy",
        "step.py:2 imports fxquant.registry.get_backend_config",
        "step.py:2: only the entry points resolve the backend",
        "step.py:3 imports fxquant.registry.assembly.graph_mode",
        "step.py:5 reads 'assembled'",
        "step.py:5 reads 'default_registry'",
        "step.py:6 calls the hook fxquant_graph_mode",
        "step.py:6 reads 'hook'",
    ]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The registry methods called from now on, in order."""
    registry = fxquant.registry.default_registry()
    calls: list[str] = []

    def counted(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return method(*args, **kwargs)

        return call

    for name in ("resolve", "assembled", "get_backend_config", "get_default_qconfig_mapping"):
        if hasattr(registry, name):
            monkeypatch.setattr(registry, name, counted(name, getattr(registry, name)))
    return calls


@pytest.mark.parametrize("given", [True, False], ids=["backend_config", "None"])
def test_a_prepare_and_a_convert_resolve_the_backend_once(
    monkeypatch: pytest.MonkeyPatch, given: bool
) -> None:
    backend = fxquant.get_backend_config("reference") if given else None
    mapping = fxquant.get_default_qconfig_mapping("reference")
    x = torch.randn(2, 3, 8, 8)
    calls = _counting(monkeypatch)
    prepared = fxquant.prepare_fx(Net().eval(), mapping, (x,), backend_config=backend)
    prepared(x)
    converted = fxquant.convert_fx(prepared)
    fxquant.convert_fx(prepared, backend_config=flow_state(prepared).backend_config)  # type: ignore[union-attr]  # a prepared model
    assert calls == ["resolve", "assembled"]
    state = flow_state(converted)
    assert state is not None
    assert state.backend is flow_state(prepared).backend  # type: ignore[union-attr]  # prepared


class LatePlugin:
    """Kernels for a backend registered only after the model was prepared."""

    @hookimpl
    def fxquant_lowering_kernels(self, backend: str) -> list[LoweringRule] | None:
        return [LoweringRule(reference.Linear, build=lambda m: None, name="late_linear")]


def test_convert_lowers_with_what_prepare_recorded_not_with_a_later_registry() -> None:
    late = fxquant.get_backend_config("reference").set_name("late")
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = fxquant.prepare_fx(Net().eval(), mapping, (x,), backend_config=late)
    prepared(x)
    plugin = LatePlugin()
    fxquant.register_plugin(plugin, backend="late")
    try:
        now = fxquant.registry.default_registry().assembled("late").lowering_rules
        converted = fxquant.convert_fx(copy.deepcopy(prepared))
    finally:
        fxquant.unregister_plugin(plugin)
    assert [rule.name for rule in now] == ["late_linear"]  # what a lookup now would find
    notes = fxquant.explain(converted, show=False).notes()
    assert [n for n in notes if n.startswith("kernels:")] == [
        "kernels: no installed plugin provides backend 'late': no lowering rules (a config "
        "lowers with the kernels of the backend it is named after)"
    ]
    torch.testing.assert_close(
        converted(x), fxquant.convert_to_reference_fx(prepared)(x), rtol=0, atol=0
    )


def test_convert_with_a_config_named_after_another_backend_resolves_that_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping("reference")
    reference_config = fxquant.get_backend_config("reference")
    prepared = fxquant.prepare_fx(Net().eval(), mapping, (x,), backend_config=reference_config)
    prepared(x)
    calls = _counting(monkeypatch)
    renamed = copy.deepcopy(reference_config).set_name("nobody")
    notes = fxquant.explain(fxquant.convert_fx(prepared, backend_config=renamed), show=False)
    assert calls == ["resolve", "assembled"]  # the unknown name, asked once
    assert any("backend 'nobody'" in n for n in notes.notes())


def test_resolution_of_none_is_the_registrys_one_method(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry()
    monkeypatch.setattr(registry, "list_backends", lambda: ["reference"])
    monkeypatch.setattr("platform.machine", lambda: "riscv64")
    with pytest.warns(NativeBackendWarning, match="^prepare_fx: no fxquant"):
        resolved = registry.resolve(None, "prepare_fx")
    assert resolved.name == "reference"
    assert resolved.notes() == (
        "backend: reference (backend_config=None: no native backend for a riscv64 CPU)",
    )
    assert resolved.config is not registry.assembled("reference").config  # the caller's copy


@pytest.mark.parametrize("convert", [fxquant.convert_fx, fxquant.convert_to_reference_fx])
def test_convert_with_another_backends_config_than_prepares_names_both_and_the_fix(
    convert: Callable[..., torch.fx.GraphModule],
) -> None:
    x = torch.randn(2, 3, 8, 8)
    prepared = fxquant.prepare_fx(
        Net().eval(),
        fxquant.get_default_qconfig_mapping("x86"),
        (x,),
        backend_config=fxquant.get_backend_config("x86"),
    )
    prepared(x)
    expected = (
        f"{convert.__name__}: backend_config names backend 'qnnpack', but the model was "
        "prepared for backend 'x86'; .* Drop backend_config= to keep backend 'x86' \\(and its "
        r"kernels\), or prepare the float model again with "
        r"backend_config=fxquant.get_backend_config\('qnnpack'\)"
    )
    with pytest.raises(ConfigError, match=expected):
        convert(prepared, backend_config=fxquant.get_backend_config("qnnpack"))
    converted = convert(prepared)  # the model is untouched: prepare's backend converts
    convert(prepared, backend_config=fxquant.get_backend_config("x86"))  # its own: accepted
    assert flow_state(converted).backend.name == "x86"  # type: ignore[union-attr]  # converted
    # the generic patterns go with any backend, either side
    reference = convert(prepared, backend_config=fxquant.get_backend_config("reference"))
    assert flow_state(reference).backend is not None


def test_an_unnamed_backend_config_quantizes_with_its_own_patterns_and_no_kernels() -> None:
    unnamed = fxquant.BackendConfig().set_backend_pattern_configs(
        fxquant.get_backend_config("reference").configs
    )
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = fxquant.prepare_fx(Net().eval(), mapping, (x,), backend_config=unnamed)
    prepared(x)
    converted = fxquant.convert_fx(prepared)
    notes = fxquant.explain(converted, show=False).notes()
    assert [n for n in notes if n.startswith("kernels:")] == [
        "kernels: no installed plugin provides backend '': no lowering rules (a config "
        "lowers with the kernels of the backend it is named after)"
    ]
    torch.testing.assert_close(
        converted(x), fxquant.convert_to_reference_fx(prepared)(x), rtol=0, atol=0
    )
