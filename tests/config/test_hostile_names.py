"""Hostile names in JSON configs: refused from their text, never imported or called (#18 item 6).

Each name is put in every field that resolves a name (pattern op, module classes,
fuser, getters, observer constructors, QConfigMapping object types, dtypes); loading
must raise an fxquant error naming the JSON path, import no module (``sys.modules``
before/after) and call nothing (spies on process creation and on fxquant's own
side-effecting functions).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import fxquant.tools.cli
import fxquant.tools.testing
import pytest
from fxquant.config import BackendConfig, QConfigMapping
from fxquant.errors import FxquantError

# a module name -> names inside it; crossed below into (module, name) pairs
_TARGETS: dict[str, tuple[str, ...]] = {
    "os": ("system", "popen", "remove", "execv", "fork", "kill", "environ", "path.join"),
    "subprocess": ("run", "Popen", "call", "check_output", "getoutput"),
    "builtins": ("eval", "exec", "open", "__import__", "compile", "input", "breakpoint"),
    "importlib": ("import_module", "reload", "util.find_spec"),
    "shutil": ("rmtree", "move", "copy"),
    "pickle": ("loads", "load"),
    "ctypes": ("CDLL", "cdll", "pythonapi"),
    "sys": ("exit", "modules", "settrace", "setprofile"),
    "antigravity": ("geohash", "webbrowser"),
    "this": ("s",),
    "webbrowser": ("open",),
    "socket": ("socket", "create_connection"),
    "runpy": ("run_path", "run_module"),
    "code": ("interact",),
    "pdb": ("set_trace",),
    "torch.testing._internal.common_utils": ("TestCase", "run_tests"),
    "torch.testing._internal": ("common_utils",),
    "torch.testing": ("assert_close", "_internal.common_utils.TestCase"),
    "torch._dynamo": ("optimize", "reset"),
    "torch._inductor": ("compile",),
    "torch.hub": ("load", "download_url_to_file", "_get_torch_home"),
    "torch.utils.cpp_extension": ("load", "load_inline"),
    "torch.distributed": ("init_process_group",),
    "torch.multiprocessing": ("spawn",),
    "torch.onnx": ("export",),
    "torch.jit": ("load", "script"),
    "torch.backends.cudnn": ("enabled",),
    "torch._C": ("_set_qengine", "_jit_set_profiling_mode"),
    "torch.serialization": ("load",),
    "torch.package": ("PackageImporter",),
    "fxquant.tools.testing": (
        "check_no_warning_in_fresh_process",
        "check_engine_restored",
        "check_state_dict_round_trip",
    ),
    "fxquant.tools.cli": ("main",),
    "fxquant.tools.demo": ("run_demo", "fuse_conv2d_relu", "quantize_with"),
    "fxquant.tools.scaffold": ("new_backend",),
    "fxquant.tools.export": ("export_quantized",),
    "fxquant.tools.calibration": ("calibrate",),
    "fxquant.registry": ("refresh", "register_plugin", "unregister_plugin", "default_registry"),
    "fxquant.config.serialize": ("resolve", "importlib.import_module", "json.loads"),
    "fxquant.nn.fusers": ("torch.load", "os.system", "_private"),
    "fxquant.patterns.getters": ("torch.hub.load",),
    "fxquant.observer": ("torch.load",),
    "fxquant": ("__builtins__", "__loader__", "registry.refresh", "testing"),
}
# names that are malformed: relative, dunder paths, odd characters, lookalikes
_MALFORMED: tuple[tuple[Any, Any], ...] = (
    (".os", "system"),
    ("..fxquant", "testing"),
    ("fxquant..nn", "fusers"),
    ("torch.", "load"),
    ("", "system"),
    ("os", ""),
    ("fxquant", "__class__.__subclasses__"),
    ("fxquant.__builtins__", "eval"),
    ("torch.__dict__", "load"),
    ("operator", "attrgetter.__call__"),
    ("torch nn", "Linear"),
    ("torch/nn", "Linear"),
    ("torch\x00", "load"),
    ("torch\nimport os", "load"),
    ("torch;os", "system"),
    ("tor\u0441h", "load"),  # a Cyrillic es
    ("fxquant.nn.fuser\u0455", "fuse_conv_bn"),  # a Cyrillic dze
    ("\u0442orch", "nn"),
    ("torch", "load;os.system('x')"),
    ("torch", "nn.Linear\x00"),
    ("os", "system\u200b"),  # a zero-width space
    ("fxquant", "nn/fusers"),
    (None, "system"),
    (["os"], "system"),
    ({"module": "os"}, "system"),
    ("os", 3),
    ("torch", "1load"),
    ("fxquant.nn.fusers", "fuse_conv_bn()"),
    ("C:\\Windows", "system"),
    ("/usr/lib/python3", "os"),
)


def hostile_names() -> list[tuple[Any, Any]]:
    """Every (module, name) pair of the suite."""
    pairs = [(module, name) for module, names in _TARGETS.items() for name in names]
    # the same targets reached through a trusted module's globals, and as relative names
    through = [("fxquant.nn.fusers", f"{module}.{name}") for module, name in pairs]
    relative = [(f".{module}", name) for module, name in pairs]
    return pairs + through + relative + list(_MALFORMED)


def _backend_json(field: str, ref: Any) -> str:
    pattern: dict[str, Any] = {"pattern": {"module": "torch.nn.modules.linear", "name": "Linear"}}
    if field == "pattern":
        pattern = {"pattern": ref}
    else:
        pattern[field] = ref
    return json.dumps({"name": "b", "configs": [pattern]})


def _mapping_json(field: str, ref: Any) -> str:
    observer = {"module": "fxquant.observer", "name": "MinMaxObserver"}
    if field == "object_type":
        return json.dumps({"": None, "object_type": [[ref, None]]})
    qconfig = {"activation": observer, "weight": observer, field: ref}
    return json.dumps({"": qconfig})


_BACKEND_FIELDS = (
    "pattern",
    "root_module",
    "qat_module",
    "reference_quantized_module_for_root",
    "fused_module",
    "fuser_method",
    "root_node_getter",
    "extra_inputs_getter",
)
_MAPPING_FIELDS = ("activation", "weight", "object_type")


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record any process start and any call of fxquant's side-effecting functions."""
    called: list[str] = []

    def spy(name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> None:
            called.append(name)

        return record

    monkeypatch.setattr(subprocess.Popen, "__init__", spy("subprocess.Popen"))
    monkeypatch.setattr(os, "system", spy("os.system"))
    # the spy lives in this test module, so if a name reached it, resolve would refuse it as
    # "not defined in fxquant"; the message check below tells that from a text refusal
    for module, name in (
        (fxquant.tools.testing, "check_no_warning_in_fresh_process"),
        (fxquant.tools.cli, "main"),
    ):
        monkeypatch.setattr(module, name, spy(f"{module.__name__}.{name}"))
    return called


def _warm_up() -> None:
    """Import what a valid load imports, so the check sees only what a hostile name adds."""
    fine = {"module": "fxquant.patterns.getters", "name": "conv_add_root_left"}
    BackendConfig.from_json(_backend_json("root_node_getter", fine))
    QConfigMapping.from_json(_mapping_json("object_type", {"method": "relu"}))
    # a valid observer reference imports fxquant.observer (the public path JSON keeps): run
    # alone, the "weight" case otherwise saw that import, made by its valid activation
    QConfigMapping.from_json(
        _mapping_json("weight", {"module": "fxquant.observer", "name": "MinMaxObserver"})
    )
    for bad in ('{"name": "b", "configs": [{"pattern": {"module": "os", "name": "x"}}]}', "{"):
        with pytest.raises(FxquantError):
            BackendConfig.from_json(bad)


def _load(kind: str, field: str, ref: Any) -> None:
    if kind == "backend":
        BackendConfig.from_json(_backend_json(field, ref))
    else:
        QConfigMapping.from_json(_mapping_json(field, ref))


def test_the_suite_has_at_least_197_names() -> None:
    assert len(set(map(repr, hostile_names()))) >= 197


@pytest.mark.parametrize(
    ("kind", "field"),
    [("backend", f) for f in _BACKEND_FIELDS] + [("mapping", f) for f in _MAPPING_FIELDS],
)
def test_hostile_names_are_refused_and_nothing_is_imported_or_called(
    spies: list[str], kind: str, field: str
) -> None:
    called = spies
    _warm_up()
    accepted, imported, wrong = [], [], []
    path = (
        "configs[0]"
        if kind == "backend"
        else ("object_type[0][0]" if field == "object_type" else '[""]')
    )
    for module, name in hostile_names():
        ref = {"module": module, "name": name}
        before = set(sys.modules)
        try:
            _load(kind, field, ref)
        except FxquantError as error:
            if not str(error).startswith(path):
                wrong.append(f"{ref!r}: {error}")
        except Exception as error:  # collected: every failure must be an fxquant error
            wrong.append(f"{ref!r}: {type(error).__name__}: {error}")
        else:
            accepted.append(ref)
        new = set(sys.modules) - before
        if new:
            imported.append(f"{ref!r} imported {sorted(new)}")
    assert accepted == []
    assert imported == []
    assert wrong == []
    assert called == []


@pytest.mark.parametrize(
    "name", ["_dynamo", "onnx", "_inductor", "testing._internal.common_utils", "os", "load"]
)
def test_a_hostile_dtype_name_imports_nothing(name: str) -> None:
    text = json.dumps(
        {
            "name": "b",
            "configs": [
                {"pattern": {"method": "relu"}, "dtype_configs": [{"input_dtype": f"torch.{name}"}]}
            ],
        }
    )
    before = set(sys.modules)
    with pytest.raises(FxquantError, match=r"configs\[0\]\.dtype_configs\[0\]\.input_dtype"):
        BackendConfig.from_json(text)
    assert set(sys.modules) - before == set()


def test_a_refused_torch_testing_name_is_not_imported_in_a_fresh_process() -> None:
    # in a fresh process: pytest's own process may hold torch.testing already
    code = (
        "import json, sys, torch\n"
        "from fxquant.config import BackendConfig\n"
        "from fxquant.errors import UnsafeNameError\n"
        "ref = {'module': 'torch.testing._internal.common_utils', 'name': 'TestCase'}\n"
        "text = json.dumps({'name': 'b', 'configs': [{'pattern': {'method': 'relu'}, "
        "'root_module': ref}]})\n"
        "try:\n"
        "    BackendConfig.from_json(text)\n"
        "except UnsafeNameError as e:\n"
        "    print(e)\n"
        "print('torch.testing._internal.common_utils' in sys.modules)\n"
        "torch.backends.cudnn.enabled = True\n"
        "print(torch.backends.cudnn.enabled)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "configs[0].root_module.module: 'torch.testing._internal.common_utils' is not a plain "
        "dotted name (no dunder or _private parts allowed)",
        "False",
        "True",
    ]


def test_a_getter_from_fxquant_testing_cannot_make_prepare_spawn_a_process() -> None:
    ref = {"module": "fxquant.tools.testing", "name": "check_no_warning_in_fresh_process"}
    with pytest.raises(FxquantError) as info:
        BackendConfig.from_json(_backend_json("root_node_getter", ref))
    assert str(info.value) == (
        "configs[0].root_node_getter: 'fxquant.tools.testing.check_no_warning_in_fresh_process' is "
        "not in a module fxquant reads a getter function from (fxquant.patterns.getters)"
    )
