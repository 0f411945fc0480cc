"""``fxquant check``'s deployment_protocol group: a deployment that keeps the protocol passes
each step, one that returns a bare callable fails at ``protocol`` naming what it lacks."""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import fxquant
import fxquant.registry
import pytest
import torch
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow.deployed import DeployedModel, report_path
from fxquant.flow.report import Report
from fxquant.flow.state import flow_state
from fxquant.registry import Deployed, Deployment
from fxquant.tools.conformance import check_backend

BACKENDS = ("keeps_protocol", "bare_callable")


class PickledModel(DeployedModel):
    """A 'runtime' that runs the converted model and saves it with torch.save."""

    suffix = ".pt"

    def __init__(self, model: torch.nn.Module, report: Report) -> None:
        self.model = model
        self.report = report

    def __call__(self, *inputs: Any) -> Any:
        return self.model(*inputs)

    def save_artifact(self, path: Path, **options: Any) -> Mapping[str, Any]:
        torch.save(self.model, path)
        return {"saved_by": "torch.save"}

    @classmethod
    def load_artifact(cls, path: Path, report: Report, extras: Mapping[str, Any]) -> PickledModel:
        assert extras == {"saved_by": "torch.save"}
        return cls(torch.load(path, weights_only=False), report)


class BareCallable:
    def __init__(self, model: torch.nn.Module, report: Report) -> None:
        self.model, self.report = model, report

    def __call__(self, *inputs: Any) -> Any:
        return self.model(*inputs)


def deploy(kind: type) -> Any:
    def run(model: Any, example_inputs: tuple[Any, ...]) -> Any:
        state = flow_state(model)
        assert state is not None
        return kind(model, state.report)

    return run


plugin = types.SimpleNamespace()


@fxquant.registry.hookimpl
def _patterns(backend: str) -> list[BackendPatternConfig] | None:
    return fxquant.get_backend_config("reference").configs if backend in BACKENDS else None


@fxquant.registry.hookimpl
def _mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    return fxquant.get_default_qconfig_mapping("reference", is_qat) if backend in BACKENDS else None


@fxquant.registry.hookimpl
def _deployment(backend: str) -> Deployment | None:
    kinds = {"keeps_protocol": PickledModel, "bare_callable": BareCallable}
    return Deployment(backend, deploy=deploy(kinds[backend])) if backend in kinds else None


plugin.fxquant_pattern_configs = _patterns
plugin.fxquant_default_qconfig_mapping = _mapping
plugin.fxquant_deployment = _deployment


@pytest.fixture(scope="module", autouse=True)
def registered() -> Iterator[None]:
    for backend in BACKENDS:
        fxquant.register_plugin(plugin, backend=backend)
    yield
    fxquant.unregister_plugin(plugin)


def protocol(backend: str) -> dict[str, tuple[str, str]]:
    rows = check_backend(backend, cases=[], fresh_process=False)
    return {r.check: (r.result.value, r.reason) for r in rows if r.check.startswith("deployment[")}


def test_a_deployment_keeping_the_protocol_passes_every_step() -> None:
    rows = protocol("keeps_protocol")
    assert list(rows) == [
        "deployment[deploy]",
        "deployment[protocol]",
        "deployment[call]",
        "deployment[explain]",
        "deployment[save_load]",
    ]
    assert {result for result, _ in rows.values()} == {"pass"}
    assert rows["deployment[save_load]"][1] == "PickledModel, within 0"


def test_a_bare_callable_fails_at_protocol_naming_what_it_lacks() -> None:
    rows = protocol("bare_callable")
    assert rows["deployment[protocol]"] == (
        "fail",
        "BareCallable lacks explain, save, load: subclass DeployedModel",
    )
    assert rows["deployment[save_load]"] == ("skip", "after protocol failed")


def test_save_writes_the_report_next_to_the_artifact_and_load_reads_it(tmp_path: Path) -> None:
    report = Report(notes=["runs in a pickle"])
    saved = PickledModel(torch.nn.ReLU(), report).save(tmp_path / "relu.pt")
    assert report_path(saved).name == "relu.pt.fxquant.json"
    loaded = PickledModel.load(saved)
    assert isinstance(loaded, Deployed)
    assert loaded.report.notes() == ["runs in a pickle"]
    assert fxquant.explain(loaded, show=False).notes() == ["runs in a pickle"]
    with pytest.raises(FileNotFoundError, match=r"PickledModel.load: no file at .*save\(path\)"):
        PickledModel.load(tmp_path / "missing.pt")


def test_save_to_a_folder_is_refused_and_load_without_the_report_says_so(tmp_path: Path) -> None:
    class Echo(DeployedModel):
        def __init__(self, report: Report) -> None:
            self.report = report

        def __call__(self, *inputs: Any) -> Any:
            return inputs[0]

        def save_artifact(self, path: Path, **options: Any) -> Mapping[str, Any]:
            path.write_text("echo")
            return {}

        @classmethod
        def load_artifact(cls, path: Path, report: Report, extras: Mapping[str, Any]) -> Echo:
            return cls(report)

    model = Echo(Report(notes=["kept"]))
    with pytest.raises(fxquant.errors.ConfigError, match="writes a file, got the folder"):
        model.save(tmp_path)
    saved = model.save(tmp_path / "echo.bin")
    report_path(saved).unlink()
    assert Echo.load(saved).report.notes() == [
        "no report: echo.bin.fxquant.json is not next to echo.bin"
    ]
