"""The README is what a new user reads first: its commands and example must stay true."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_usage_examples_quantize_a_model_and_print_a_round_trippable_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    quantize, describe, _ = re.findall(r"```python\n(.*?)```", README, re.S)
    namespace: dict[str, object] = {}
    exec(compile(quantize, "README.md", "exec"), namespace)
    table = capsys.readouterr().out
    # the reference backend has no kernels: quantized patterns stay in reference form
    rows = {line.split()[2]: line.split()[4] for line in table.splitlines()[1:] if "call_" in line}
    assert rows == {"ConvReLU2d": "reference", "Flatten": "reference", "Linear": "reference"}
    exec(compile(describe, "README.md", "exec"), {})
    printed = json.loads(capsys.readouterr().out)
    assert printed["name"] == "my_backend"
    assert len(printed["configs"]) == 1


def test_the_deployment_example_makes_and_runs_an_executorch_program(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("fxquant_executorch")
    deploy = re.findall(r"```python\n(.*?)```", README, re.S)[2]
    exec(compile(deploy, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "torch.Size([1, 8, 14, 14])"
    statuses = {line.split()[0]: line.split()[4] for line in lines[1:-1] if "call_" in line}
    assert statuses == {"_0": "lowered"}


def test_the_quickstart_is_two_commands_and_ci_runs_the_test_one_verbatim() -> None:
    quickstart = README.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in quickstart.splitlines() if line.strip()]
    assert commands == ["pip install nox && nox -s demo", "pip install nox && nox -s tests"]
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == commands[1]
