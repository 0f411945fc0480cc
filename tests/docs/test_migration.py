"""The migration guide's promises: its import table resolves, its worked example changes only
imports and gives torch.ao's numbers, and so do torch.ao's own scripts (the BackendConfig
tutorial, the quantize_fx docstring examples: tests/docs/torch_ao_scripts.py) (#22)."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import fxquant
import fxquant.config.defaults
import pytest
import torch
from fxquant.errors import ConfigTypeError
from fxquant.registry.install import install_command
from fxquant.torch_ao_names import top_level_names

from tests import oracle
from tests.docs import torch_ao_scripts

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
TEXT = PAGE.read_text()
ROW = re.compile(r"^\| `([\w.]+)` \| `([\w.]+)` \|", re.M)
ROWS = ROW.findall(TEXT)
AO_BLOCK, FXQUANT_BLOCK = re.findall(r"^```python\n(.*?)^```", TEXT, re.M | re.S)[:2]


def resolve(dotted: str) -> object:
    """The object a dotted name denotes: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def body(code: str) -> list[str]:
    """The lines of a script that are not imports or comments (import blocks span lines)."""
    lines, in_import = [], False
    for line in code.splitlines():
        if in_import:
            in_import = not line.startswith(")")
            continue
        if line.startswith(("import ", "from ")):
            in_import = line.endswith("(")
            continue
        if not line.startswith("#"):
            lines.append(line)
    return lines


def run(code: str) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "migration_example"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, str(PAGE), "exec"), namespace)
    return namespace


def test_the_table_has_a_row_for_each_name_the_example_imports() -> None:
    assert len(ROWS) >= 40
    imported = set(re.findall(r"^from (torch\.ao[\w.]*) import", AO_BLOCK, re.M))
    table = {ao.rsplit(".", 1)[0] for ao, _ in ROWS}
    assert imported <= table


@pytest.mark.parametrize(("ao", "fxquant"), ROWS, ids=[ao for ao, _ in ROWS])
def test_every_name_of_the_table_exists_in_fxquant_and_in_torch_ao(ao: str, fxquant: str) -> None:
    assert resolve(fxquant) is not None
    if importlib.util.find_spec("torch.ao.quantization") is not None:
        oracle.load()
        with oracle.quiet():
            assert resolve(ao) is not None


def test_the_example_changes_only_the_imports() -> None:
    assert body(AO_BLOCK) == body(FXQUANT_BLOCK)
    assert "torch.ao" not in FXQUANT_BLOCK


def test_the_example_gives_torch_aos_numbers_within_one_step() -> None:
    ours = run(FXQUANT_BLOCK)
    oracle.load()  # skips where torch.ao is gone
    with oracle.quiet():
        theirs = run(AO_BLOCK)
        expected = theirs["converted"](ours["x"])  # type: ignore[operator]
    oracle.release()
    got = ours["converted"](ours["x"])  # type: ignore[operator]
    # the same observers saw the same data: one step of the conv-relu output, after sigmoid
    step = ours["prepared"].activation_post_process_2.calculate_qparams()[0].item()  # type: ignore[attr-defined]
    torch.testing.assert_close(got, expected, rtol=0, atol=step / 4 + 1e-6)


# --- torch.ao scripts with only their imports changed (#22) ------------------------------------


def _run_both(script: str) -> tuple[dict[str, object], dict[str, object]]:
    """Run ``script`` on fxquant (imports rewritten) and on torch.ao (skips where it is gone)."""
    ours_code = torch_ao_scripts.to_fxquant(script)
    assert body(ours_code) == body(script)  # the imports are all that changed
    assert not re.search(r"^(from|import) torch\.ao", ours_code, re.M)
    oracle.load()  # the scripts name torch.ao.nn classes, as the tutorial does
    with oracle.quiet():  # torch.ao.nn's classes warn on use
        ours = run(ours_code)
        theirs = run(script)
    oracle.release()
    return ours, theirs


def _modules(model: object) -> dict[str, str]:
    assert isinstance(model, torch.nn.Module)
    return {name: type(m).__name__ for name, m in model.named_children()}


def test_the_backend_config_tutorial_runs_with_only_its_imports_changed() -> None:
    ours, theirs = _run_both(torch_ao_scripts.TUTORIAL)
    x = ours["x"]
    results, expected = ours["results"], theirs["results"]
    assert isinstance(results, dict)
    assert isinstance(expected, dict)
    for experiment, (model, converted) in results.items():
        their_model, their_converted = expected[experiment]
        assert _modules(model) == _modules(their_model)
        with torch.no_grad():
            # the same observers saw the same data: torch.ao's quantized ops, our reference form
            torch.testing.assert_close(converted(x), their_converted(x), rtol=0, atol=2**-8)
    # what the tutorial shows: conv-relu and linear quantized; conv-bn-relu is not in the
    # backend (only linear is); the default mapping fails the backend's constraints (nothing)
    status = {
        name: {e.node: e.status.value for e in fxquant.explain(c, show=False).entries()}
        for name, (_, c) in results.items()
    }
    assert (status["conv_relu"]["linear"], status["conv_relu"]["conv"]) == ("reference",) * 2
    assert status["conv_bn_relu"]["linear"] == "reference"
    assert {status["conv_bn_relu"][n] for n in ("conv", "bn", "relu")} == {"skipped"}
    assert {status["default_mapping"][n] for n in ("linear", "conv")} == {"skipped"}


def test_the_quantize_fx_docstring_examples_run_with_only_their_imports_changed() -> None:
    ours, theirs = _run_both(torch_ao_scripts.DOCSTRING_EXAMPLES)
    x = ours["x"]
    with torch.no_grad():
        torch.testing.assert_close(ours["fused"](x), theirs["fused"](x), rtol=0, atol=1e-6)  # type: ignore[operator]
        # the quantized models: torch.ao's numbers where the default qconfigs agree; on a CPU
        # without VNNI fxquant's defaults keep weights 7-bit (tavx2), so within a few steps
        for name in ("quantized_model", "reference_quantized_model", "quantized_qat"):
            got, expected = ours[name](x), theirs[name](x)  # type: ignore[operator]
            noise = (got - expected).square().mean() / expected.square().mean()
            assert 10 * torch.log10(noise) < -25, name


def _prepared_and_data() -> tuple[torch.fx.GraphModule, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Softsign()).eval()
    model[2].qconfig = fxquant.get_default_qconfig("x86")  # an eager-mode habit
    backend = fxquant.get_backend_config("x86")
    x = torch.randn(4, 8)
    prepared = fxquant.prepare_fx(
        model, fxquant.get_default_qconfig_mapping(), (x,), None, None, backend
    )
    prepared(x)
    return prepared, x


def test_convert_takes_the_seed_arguments_positionally_with_remove_qconfig_third() -> None:
    prepared, x = _prepared_and_data()
    mapping = fxquant.get_default_qconfig_mapping("x86")
    backend = fxquant.get_backend_config("x86")
    removed = fxquant.convert_fx(prepared, None, True, mapping, backend)
    kept = fxquant.convert_fx(prepared, None, False, mapping, backend)
    # torch.ao's meaning: the qconfig attributes set on modules go, unless False
    assert [n for n, m in removed.named_modules() if "qconfig" in vars(m)] == []
    assert [n for n, m in kept.named_modules() if "qconfig" in vars(m)] == ["2"]
    torch.testing.assert_close(removed(x), kept(x), rtol=0, atol=0)
    reference = fxquant.convert_to_reference_fx(prepared, None, False, mapping, backend)
    assert "qconfig" in vars(reference.get_submodule("2"))
    # the report is kept either way: explain() reads the flow state, not module attributes
    assert fxquant.explain(removed, show=False).entries()[1].status.value == "lowered"


def test_convert_names_remove_qconfig_when_a_mapping_comes_third() -> None:
    # fxquant's convert_fx(gm, None, mapping) before #22: now a clear error, not a silent misuse
    prepared, _ = _prepared_and_data()
    with pytest.raises(ConfigTypeError, match=r"^_remove_qconfig must be a bool, got QConfigMap"):
        fxquant.convert_fx(prepared, None, fxquant.get_default_qconfig_mapping())  # type: ignore[arg-type]


def test_every_config_argument_takes_its_dict_form() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    backend = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepare_custom = fxquant.PrepareCustomConfig().set_preserved_attributes(["tag"])
    convert_custom = fxquant.ConvertCustomConfig().set_preserved_attributes(["tag"])
    fuse_custom = fxquant.FuseCustomConfig().set_preserved_attributes(["tag"])
    model.tag = "kept"  # type: ignore[assignment]
    as_dicts = (backend.to_dict(), mapping.to_dict(), prepare_custom.to_dict())

    fused = fxquant.fuse_fx(model, fuse_custom.to_dict(), backend.to_dict())
    assert type(fused.get_submodule("0")).__name__ == "ConvReLU2d"
    assert fused.tag == "kept"
    outputs = []
    for config, qconfigs, custom in ((backend, mapping, prepare_custom), as_dicts):
        prepared = fxquant.prepare_fx(model, qconfigs, (x,), custom, None, config)
        prepared(x)
        lowered = fxquant.convert_fx(prepared, convert_custom.to_dict(), True, None, config)
        reference = fxquant.convert_to_reference_fx(prepared, convert_custom.to_dict())
        assert lowered.tag == reference.tag == "kept"
        statuses = [e.status.value for e in fxquant.explain(lowered, show=False).entries()]
        outputs.append((lowered(x), reference(x), statuses))
    for ours, theirs in zip(outputs[0], outputs[1], strict=True):
        assert ours == theirs if isinstance(ours, list) else torch.equal(ours, theirs)
    assert "lowered" in outputs[1][2]  # the dict named x86: its kernels were used
    qat = fxquant.prepare_qat_fx(
        model.train(),
        fxquant.get_default_qconfig_mapping("x86", is_qat=True).to_dict(),
        (x,),
        prepare_custom.to_dict(),
        backend.to_dict(),
    )
    assert type(qat.get_submodule("0")).__module__.startswith("fxquant.nn.intrinsic.qat")


def test_a_backend_config_of_the_wrong_type_names_the_dict_form_too() -> None:
    with pytest.raises(ConfigTypeError, match=r"BackendConfig, its dict form .* got 'x86'"):
        fxquant.fuse_fx(torch.nn.Linear(2, 2), None, "x86")  # type: ignore[arg-type]


def test_get_default_qconfig_mapping_defaults_to_x86_as_torch_ao_does() -> None:
    assert fxquant.get_default_qconfig_mapping() == fxquant.get_default_qconfig_mapping("x86")
    assert fxquant.get_default_qconfig() == fxquant.get_default_qconfig_mapping().global_qconfig
    qat = fxquant.get_default_qat_qconfig_mapping()
    assert qat == fxquant.get_default_qconfig_mapping("x86", is_qat=True)
    assert fxquant.get_default_qat_qconfig("fbgemm") == (
        fxquant.get_default_qconfig_mapping("fbgemm", is_qat=True).global_qconfig
    )


def test_without_x86_the_no_name_default_says_how_to_install_it_or_to_name_reference() -> None:
    code = (
        "import fxquant\n"
        "try:\n"
        "    fxquant.get_default_qconfig_mapping()\n"
        "except KeyError as error:\n"
        "    print(error)\n"
    )
    env = {**os.environ, "FXQUANT_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("get_default_qconfig_mapping() uses backend 'x86' when no name is given")
    assert "get_default_qconfig_mapping('reference')" in out
    assert install_command("x86") in out


def test_torch_ao_quantization_top_level_names_import_from_fxquant_outside_all() -> None:
    missing = [n for n in top_level_names() if getattr(fxquant, n, None) is None]
    assert missing == []
    assert set(top_level_names()).isdisjoint(fxquant.__all__)
    namespace: dict[str, object] = {}
    exec("from fxquant import default_dynamic_qconfig, MinMaxObserver", namespace)
    assert namespace["default_dynamic_qconfig"] is fxquant.config.defaults.default_dynamic_qconfig
    with pytest.raises(ImportError):
        exec("from fxquant import prepare_jit", {})  # eager/JIT names: no counterpart


def test_the_top_level_names_are_torch_aos_and_all_of_those_fxquant_has() -> None:
    ao = oracle.load()
    public = {n for n in dir(ao) if not n.startswith("_")}
    assert set(top_level_names()) <= public
    ours: set[str] = set()
    for module in set(top_level_names().values()):
        ours |= set(importlib.import_module(module).__all__)
    assert (public & ours) - set(fxquant.__all__) == set(top_level_names())


def test_the_deliberate_differences_behave_as_the_page_says() -> None:
    assert "## Deliberate differences, and the one-line change each needs" in TEXT
    # QConfigs compare by value (torch.ao: by identity)
    assert fxquant.get_default_qconfig() == fxquant.get_default_qconfig()
    # QConfig fields must be observer classes or factories, checked at once
    with pytest.raises(ConfigTypeError, match=r"^QConfig activation must be an observer"):
        fxquant.QConfig(activation=None, weight=None)
    # custom-config setters take nn.Module subclasses, not names
    with pytest.raises(ConfigTypeError, match=r"must be a torch.nn.Module subclass"):
        fxquant.PrepareCustomConfig().set_non_traceable_module_classes(["MyBlock"])  # type: ignore[list-item]
