"""The public names of ../shared/CONTRACT.md: present, exported once, and nothing else."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import fxquant
import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFIG_NAMES = {
    "BackendConfig",
    "BackendPatternConfig",
    "ConvertCustomConfig",
    "DTypeConfig",
    "DTypeWithConstraints",
    "FuseCustomConfig",
    "ObservationType",
    "PrepareCustomConfig",
    "QConfig",
    "QConfigMapping",
}
REGISTRY_NAMES = {
    "get_backend_config",
    "get_default_qconfig_mapping",
    "hookimpl",
    "hookspec",
    "list_backends",
    "refresh",
    "register_plugin",
    "unregister_plugin",
}
ERROR_NAMES = {"PluginConflictError", "PluginError", "QuantizationSkipped"}
FLOW_NAMES = {
    "convert_fx",
    "convert_to_reference_fx",
    "explain",
    "fuse_fx",
    "prepare_fx",
    "prepare_qat_fx",
}
CONTRACT_NAMES = CONFIG_NAMES | REGISTRY_NAMES | ERROR_NAMES | FLOW_NAMES
SUBMODULES = [
    "fxquant.observer",
    "fxquant.fake_quantize",
    "fxquant.nn.intrinsic",
    "fxquant.nn.qat",
    "fxquant.nn.reference",
]


def test_all_is_sorted_and_holds_exactly_the_contract_names() -> None:
    # torch.ao.quantization's other top-level names import from fxquant too (#22), but
    # lazily and outside __all__: `from fxquant import *` gives the contract's names only
    assert fxquant.__all__ == sorted(fxquant.__all__)
    assert set(fxquant.__all__) == CONTRACT_NAMES
    for name in fxquant.__all__:
        assert getattr(fxquant, name) is not None


# The seed signatures (seed 002), plus the keyword-only strict= the contract adds, and after it
# prepare's keyword-only concrete_args= (issue 11: tracing models with optional arguments);
# prepare_fx's _equalization_config at the seed's position (issue 23).
FLOW_SIGNATURES = {
    "fuse_fx": "(model, fuse_custom_config=None, backend_config=None)",
    "prepare_fx": (
        "(model, qconfig_mapping, example_inputs, prepare_custom_config=None, "
        "_equalization_config=None, backend_config=None, *, strict=False, concrete_args=None)"
    ),
    "prepare_qat_fx": (
        "(model, qconfig_mapping, example_inputs, prepare_custom_config=None, "
        "backend_config=None, *, strict=False, concrete_args=None)"
    ),
    "convert_fx": (
        "(graph_module, convert_custom_config=None, _remove_qconfig=True, qconfig_mapping=None, "
        "backend_config=None, *, strict=False)"
    ),
    "convert_to_reference_fx": (
        "(graph_module, convert_custom_config=None, _remove_qconfig=True, qconfig_mapping=None, "
        "backend_config=None)"
    ),
}


def _bare_signature(function: object) -> str:
    sig = inspect.signature(function)  # type: ignore[arg-type]
    bare = sig.replace(
        parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
        return_annotation=sig.empty,
    )
    return str(bare)


@pytest.mark.parametrize("name", sorted(FLOW_SIGNATURES))
def test_flow_functions_have_the_seed_signatures(name: str) -> None:
    assert _bare_signature(getattr(fxquant, name)) == FLOW_SIGNATURES[name]


def test_explain_takes_the_model_first() -> None:
    assert next(iter(inspect.signature(fxquant.explain).parameters)) == "model"


@pytest.mark.parametrize("module", SUBMODULES)
def test_contract_submodules_import(module: str) -> None:
    importlib.import_module(module)


def test_qat_submodules_are_attributes_after_importing_their_package() -> None:
    """`import fxquant.nn.intrinsic` then `fxquant.nn.intrinsic.qat`, as with `fxquant.nn.qat`."""
    code = textwrap.dedent(
        """
        import fxquant.nn.intrinsic
        print(fxquant.nn.intrinsic.qat.ConvReLU2d.__module__)
        import fxquant.nn
        print(fxquant.nn.qat.Linear.__module__)
        """
    )
    out = subprocess.run(  # a fresh interpreter: this process imported every submodule already
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fxquant.nn.intrinsic.qat", "fxquant.nn.qat"]


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "fxquant.observer",
            [
                "MinMaxObserver",
                "MovingAverageMinMaxObserver",
                "PerChannelMinMaxObserver",
                "MovingAveragePerChannelMinMaxObserver",
                "HistogramObserver",
                "FixedQParamsObserver",
                "PlaceholderObserver",
                "default_weight_observer",
            ],
        ),
        ("fxquant.fake_quantize", ["FakeQuantize", "FixedQParamsFakeQuantize"]),
        ("fxquant.nn.intrinsic", ["ConvReLU2d", "LinearReLU", "ConvBn2d", "ConvBnReLU2d"]),
        ("fxquant.nn.reference", ["Linear", "Conv2d"]),
        ("fxquant.nn.qat", ["Linear", "Conv2d"]),
    ],
)
def test_contract_submodules_have_the_names_users_know(module: str, names: list[str]) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert missing == []


def test_registry_signatures_match_the_contract() -> None:
    sig = {
        n: str(inspect.signature(getattr(fxquant, n)))
        for n in REGISTRY_NAMES - {"hookimpl", "hookspec"}
    }
    assert sig["get_backend_config"].startswith("(name: 'str')")
    assert sig["get_default_qconfig_mapping"].startswith(
        "(name: 'str' = 'x86', is_qat: 'bool' = False)"
    )
    assert sig["list_backends"].startswith("()")
    assert "backend" in inspect.signature(fxquant.register_plugin).parameters
    assert sig["refresh"].startswith("()")


def _torch_ao_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Attribute) and ast.unparse(node).startswith("torch.ao"):
            names = [ast.unparse(node)]
        found += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {n}"
            for n in names
            if n.startswith("torch.ao")
        ]
    return found


def test_no_code_in_core_or_plugins_reaches_into_torch_ao() -> None:
    files = [*ROOT.glob("core/**/*.py"), *ROOT.glob("plugins/**/src/**/*.py")]
    assert files
    hits = [hit for f in files for hit in _torch_ao_imports(f)]
    assert hits == []


def test_fxquant_imports_and_builds_configs_on_a_torch_without_quantized_dtypes_or_qschemes() -> (
    None
):
    # PyTorch is removing quint8/qint8/qint32: simulate a torch that no longer has them.
    code = textwrap.dedent(
        """
        import torch
        for name in ("quint8", "qint8", "qint32", "quint4x2", "quint2x4",
                     "per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
                     "per_channel_symmetric", "per_channel_affine_float_qparams"):
            delattr(torch, name)
        import fxquant
        from fxquant.observer import MinMaxObserver, default_weight_observer
        cfg = fxquant.DTypeConfig(input_dtype=torch.uint8, output_dtype=torch.uint8,
                                  weight_dtype=torch.int8, bias_dtype=torch.float)
        bc = fxquant.BackendConfig("b").set_backend_pattern_config(
            fxquant.BackendPatternConfig(torch.nn.Linear).add_dtype_config(cfg))
        assert fxquant.BackendConfig.from_json(bc.to_json()).to_dict() == bc.to_dict()
        import fxquant.fake_quantize, fxquant.config.defaults, fxquant.tools.demo
        obs = MinMaxObserver()
        obs(torch.randn(8))
        print(obs.calculate_qparams()[1].item() >= 0)
        """
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
