"""The registry and the flow under threads and hostile plugins (#18 item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from fxquant import registry as registry_module
from fxquant.registry.loading import PluginStatus
from fxquant.registry.manager import Registry

from tests.registry.conftest import Installed, config

RACE_SCRIPT = Path(__file__).with_name("race_register.py")
# the long run (nox -s fuzz) sets 100; a test run starts 6 fresh processes
RACE_PROCESSES = int(os.environ.get("FXQUANT_RACE_PROCESSES", "6"))


def _in_threads(count: int, target: Any) -> list[Any]:
    start = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = target()
        except Exception as error:  # collected: the test asserts there is none
            results[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_racing_first_calls_make_one_default_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    class SlowRegistry(Registry):
        def __init__(self) -> None:
            time.sleep(0.02)  # widens the window a lock-free check-then-set loses in
            super().__init__()

    monkeypatch.setattr(registry_module, "_registry", None)
    monkeypatch.setattr("fxquant.registry.manager.Registry", SlowRegistry)
    made = _in_threads(8, registry_module.default_registry)
    assert len({id(r) for r in made}) == 1
    assert isinstance(made[0], SlowRegistry)


def test_a_registration_racing_list_backends_is_kept_in_fresh_processes() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [
        subprocess.Popen(
            [sys.executable, str(RACE_SCRIPT)], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(RACE_PROCESSES)
    ]
    outputs = [p.communicate(timeout=300)[0].strip() for p in processes]
    assert [p.returncode for p in processes] == [0] * RACE_PROCESSES
    assert outputs.count("True") == RACE_PROCESSES, outputs


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        return torch.relu(self.fc(x.mean((2, 3))))


def test_prepare_fx_of_one_model_from_four_threads_gives_the_same_graph() -> None:
    import fxquant

    model, inputs = _Conv().eval(), (torch.randn(1, 3, 6, 6),)
    mapping = fxquant.get_default_qconfig_mapping("reference")
    expected = fxquant.prepare_fx(model, mapping, inputs).code

    def prepare_three_times() -> list[str]:
        return [fxquant.prepare_fx(model, mapping, inputs).code for _ in range(3)]

    results = _in_threads(4, prepare_three_times)
    assert results == [[expected] * 3] * 4


def test_a_plugin_changing_its_earlier_answer_does_not_change_the_backend(
    installed: Installed, registry: Registry
) -> None:
    answers: list[Any] = []

    def fxquant_pattern_configs(backend: str) -> list[Any]:
        answers.append(config(torch.nn.Linear))
        return answers[-1:]

    installed.module("mutating", fxquant_pattern_configs=fxquant_pattern_configs)
    installed.add("mine", "mutating")
    before = registry.get_backend_config("mine").configs[0].to_dict()
    answers[0].dtype_configs.clear()  # the plugin edits the object it answered with
    answers[0].set_pattern(torch.nn.Conv2d)
    assert registry.get_backend_config("mine").configs[0].to_dict() == before


@pytest.mark.parametrize("code", ["sys.exit(3)", "raise SystemExit('bye')", "sys.exit()"])
def test_a_plugin_calling_sys_exit_at_import_is_a_load_failure(
    installed: Installed, registry: Registry, tmp_path: Path, code: str
) -> None:
    module = f"exiting_{abs(hash(code))}"
    (tmp_path / f"{module}.py").write_text(f"import sys\n{code}\n")
    installed.monkeypatch.syspath_prepend(str(tmp_path))
    installed.add("exits", module, dist="fxquant-exits")
    installed.patterns("reference", "fxquant-fine")
    reports = {r.name: r for r in registry.reports()}  # `fxquant backends` survives
    assert reports["exits"].status == PluginStatus.FAILED
    assert "failed to import: SystemExit" in reports["exits"].reason
    assert reports["reference"].status == PluginStatus.OK


def test_a_hook_calling_sys_exit_is_a_plugin_error(
    installed: Installed, registry: Registry
) -> None:
    def fxquant_pattern_configs(backend: str) -> None:
        sys.exit(2)

    installed.module("exit_in_hook", fxquant_pattern_configs=fxquant_pattern_configs)
    installed.add("exits", "exit_in_hook", dist="fxquant-exits")
    report = registry.report("exits")
    assert report.status == PluginStatus.FAILED
    assert "raised in hook fxquant_pattern_configs for backend 'exits': SystemExit: 2" in (
        report.reason
    )
