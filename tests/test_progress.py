"""Progress on long runs: tqdm when installed, plain lines otherwise, never on stdout."""

from __future__ import annotations

import io
import json

import fxquant
import pytest
import torch
from fxquant.tools import demo, progress
from fxquant.tools.calibration import calibrate


def test_without_tqdm_progress_prints_about_ten_plain_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "_tqdm", lambda: None)
    out = io.StringIO()
    assert list(
        progress.progress(range(100), description="calibrating", enabled=True, out=out)
    ) == list(range(100))
    lines = out.getvalue().splitlines()
    assert lines[0] == "calibrating: 10/100"
    assert lines[-1] == "calibrating: 100/100"
    assert len(lines) == 10


def test_progress_is_off_off_a_terminal_unless_the_environment_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "_tqdm", lambda: None)
    out = io.StringIO()
    list(progress.progress(range(3), description="x", out=out))
    assert out.getvalue() == ""
    monkeypatch.setenv("FXQUANT_PROGRESS", "1")
    list(progress.progress(range(3), description="x", out=out))
    assert out.getvalue().splitlines()[-1] == "x: 3/3"


def test_calibrate_spreads_tuples_and_dicts_and_records_ranges() -> None:
    class Two(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    mapping = fxquant.get_default_qconfig_mapping("reference")
    example = (torch.randn(2, 3), torch.randn(2, 3))
    prepared = fxquant.prepare_fx(Two().eval(), mapping, example)
    calibrate(prepared, [example, {"x": 10 * torch.ones(2, 3), "y": torch.zeros(2, 3)}])
    observers = [m for n, m in prepared.named_modules() if "activation_post_process" in n]
    assert max(float(o.max_val) for o in observers) == 10.0


def test_demo_json_is_valid_json_with_one_entry_per_backend() -> None:
    out = io.StringIO()
    assert demo.run_demo(out, backends=["reference", "my_backend"], as_json=True) == 0
    data = json.loads(out.getvalue())
    assert [entry["backend"] for entry in data] == ["reference", "my_backend"]
    assert data[0]["status"] in ("ok", "slower than float")
    assert data[0]["counts"]["reference"] > 0
    assert data[0]["sqnr_db"] > 20
