"""The `fxquant` command: backends, show, demo, --version, --help, python -m fxquant."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import fxquant.registry
import pytest
import torch
from fxquant import __version__
from fxquant.flow.report import Report
from fxquant.registry import Deployment, Override
from fxquant.registry.install import install_hint
from fxquant.registry.manager import Registry
from fxquant.tools.cli import build_parser, main, markdown_table, render_backends
from hypothesis import given
from hypothesis import strategies as st

from tests.registry.conftest import Installed, config


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Installed]:
    """Fake metadata behind a fresh process-wide registry, so `main` sees only these plugins."""
    for variable in (
        "FXQUANT_DISABLE_PLUGIN_AUTOLOAD",
        "FXQUANT_PLUGINS",
        "FXQUANT_DISABLE_PLUGINS",
    ):
        monkeypatch.delenv(variable, raising=False)
    state = Installed(monkeypatch)
    state.install()
    monkeypatch.setattr(fxquant.registry, "_registry", Registry())
    return state


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_markdown_table_pads_columns_and_escapes_pipes() -> None:
    assert markdown_table(["a", "b"], [["x|y", "1"]]) == (
        "| a    | b |\n| ---- | - |\n| x\\|y | 1 |"
    )


@given(
    st.lists(
        st.lists(st.text("ab .,", min_size=0, max_size=120), min_size=3, max_size=3),
        min_size=1,
        max_size=6,
    ),
    st.integers(20, 200),
)
def test_markdown_table_wraps_long_cells_to_the_width_keeping_every_word(
    rows: list[list[str]], width: int
) -> None:
    header = ["pattern", "dtypes", "kernel"]
    lines = markdown_table(header, rows, width).splitlines()
    assert len({len(line) for line in lines}) == 1  # one width for every line: a table
    # a line wider than asked only where no column can shrink further: its longest word
    # and up to 48 characters of a typical cell stay on a line
    floors = [max([48, *(len(w) for row in rows for w in row[i].split())]) for i in range(3)]
    assert len(lines[0]) <= max(width, sum(floors) + 3 * 3 + 1)
    cells = [line[2:-2].split(" | ") for line in lines[2:]]  # with the continuation rows
    for i in range(3):  # every word kept, in order, none broken
        assert [w for c in cells for w in c[i].split()] == [
            w for row in rows for w in row[i].split()
        ]


def test_render_backends_shows_counts_plugins_import_time_and_reasons() -> None:
    plugin = {
        "distribution": "fxquant-x86",
        "version": "1.0",
        "status": "ok",
        "reason": "",
        "import_ms": 1.25,
    }
    broken = {**plugin, "distribution": "fxquant-bad", "status": "failed", "reason": "boom"}
    data = [
        {
            "name": "x86",
            "status": "ok",
            "reason": "",
            "pattern_count": 3,
            "kernel_count": 1,
            "plugins": [plugin],
        },
        {
            "name": "bad",
            "status": "failed",
            "reason": "fxquant-bad 1.0 failed",
            "pattern_count": 0,
            "kernel_count": 0,
            "plugins": [broken],
        },
    ]
    assert render_backends(data) == (
        "| backend | status | patterns | kernels | plugins         | import |\n"
        "| ------- | ------ | -------- | ------- | --------------- | ------ |\n"
        "| x86     | ok     | 3        | 1       | fxquant-x86 1.0 | 1.2 ms |\n"
        "| bad     | failed | -        | -       | fxquant-bad 1.0 | 1.2 ms |\n"
        "bad: failed: fxquant-bad 1.0 failed"
    )


def test_backends_keeps_working_with_a_broken_plugin(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    installed.patterns("mine", "fxquant-mine", torch.nn.Linear)
    installed.add("broken", "fxquant_missing_module", dist="fxquant-broken", version="0.2")
    code, out, _ = run(capsys, "backends")
    assert code == 0
    assert "| mine      | ok     | 1        | 0       | fxquant-mine 1.0   |" in out
    assert (
        "broken: failed: fxquant-broken 0.2 (entry point 'broken = fxquant_missing_module') for "
        "backend 'broken' failed to import: ModuleNotFoundError: No module named "
        "'fxquant_missing_module'"
    ) in out


def test_backends_json_lists_every_backend_with_its_plugins(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    installed.patterns("mine", "fxquant-mine", torch.nn.Linear, torch.nn.Conv2d)
    installed.add("old", "never_imported", dist="fxquant-old", requires=["fxquant<0.0.1"])
    installed.monkeypatch.setenv("FXQUANT_DISABLE_PLUGINS", "fxquant-off")
    installed.add("off", "never_imported_either", dist="fxquant-off")
    code, out, _ = run(capsys, "backends", "--json")
    data = {b["name"]: b for b in json.loads(out)}
    assert code == 0
    assert sorted(data) == ["mine", "off", "old", "reference"]
    assert (data["mine"]["status"], data["mine"]["pattern_count"]) == ("ok", 2)
    assert data["mine"]["plugins"][0]["distribution"] == "fxquant-mine"
    assert (data["old"]["status"], data["old"]["reason"]) == (
        "incompatible",
        f"requires fxquant<0.0.1, installed fxquant is {__version__}",
    )
    assert (data["off"]["status"], data["off"]["reason"]) == (
        "disabled",
        "listed in FXQUANT_DISABLE_PLUGINS",
    )
    assert data["reference"]["plugins"][0]["builtin"] is True


def test_show_prints_the_summary_then_every_pattern_with_its_origin(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    installed.patterns("mine", "fxquant-mine", torch.nn.Linear, (torch.nn.Conv2d, torch.nn.ReLU))
    better = config(torch.nn.Linear).set_root_module(torch.nn.Linear)
    installed.module("better", fxquant_pattern_configs=lambda backend: [Override(better)])
    installed.add("mine", "better", dist="fxquant-mine-better", version="2.0")
    code, out, _ = run(capsys, "show", "mine", "--width", "0")  # one line per row
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "backend 'mine' (2 patterns, 0 lowering kernels; plugins: fxquant-mine 1.0, "
        "fxquant-mine-better 2.0)"
    )
    assert "| Data Type                                 | activation: quint8; weight: qint8" in out
    assert (
        "| Quantization Scheme                       | not declared (no default qconfig mapping)"
        in out
    )
    rows = [line for line in lines if line.startswith("| Linear") or line.startswith("| (Conv2d")]
    assert [r.split("|")[1].strip() for r in rows] == ["Linear", "(Conv2d, ReLU)"]
    assert rows[0].split("|")[8:10] == [" fxquant-mine-better ", " overrides fxquant-mine "]
    assert "in quint8, out quint8, w qint8, b float32" in rows[1]


def test_show_json_has_summary_patterns_and_overrides(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    installed.patterns("mine", "fxquant-mine", torch.nn.Linear)
    code, out, _ = run(capsys, "show", "mine", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["name"] == "mine"
    assert data["patterns"][0] == {
        "pattern": "Linear",
        "observation_type": "OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT",
        "dtype_configs": ["in quint8, out quint8, w qint8, b float32"],
        "root_module": "",
        "fused_module": "",
        "qat_module": "",
        "reference_quantized_module": "",
        "lowering_kernel": "",
        "source": "fxquant-mine",
        "overrides": [],
        "override_reason": "",
    }


def test_show_unknown_backend_exits_nonzero_with_the_closest_match(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "show", "refrence")
    assert (code, out) == (1, "")
    assert err == (
        "fxquant: error: unknown backend 'refrence'; did you mean 'reference'? installed: "
        f"reference; {install_hint()}; see `fxquant backends`\n"
    )


def test_show_failed_backend_exits_nonzero_with_the_plugin_error(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    installed.add("broken", "fxquant_missing_module", dist="fxquant-broken", version="0.2")
    code, _, err = run(capsys, "show", "broken")
    assert code == 1
    assert err.startswith("fxquant: error: fxquant-broken 0.2 (entry point 'broken = ")


def test_version_and_help_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as version:
        main(["--version"])
    assert (version.value.code, capsys.readouterr().out) == (0, f"fxquant {__version__}\n")
    with pytest.raises(SystemExit) as help_:
        main(["--help"])
    out = capsys.readouterr().out
    assert help_.value.code == 0
    assert "fxquant show reference" in out
    assert "FXQUANT_DISABLE_PLUGINS" in out


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys)
    assert code == 2
    assert out.startswith("usage: fxquant")


def _demo_rows(out: str) -> dict[str, dict[str, str]]:
    """The demo table as {backend: {column: cell}}."""
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].split("|")[1:-1]]
    rows = ([cell.strip() for cell in line.split("|")[1:-1]] for line in lines[2:])
    return {cells[0]: dict(zip(header, cells, strict=True)) for cells in rows}


def test_demo_quantizes_with_every_backend_and_says_what_stayed_float_and_why(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    installed.add("broken", "fxquant_missing_module", dist="fxquant-broken", version="0.2")
    code, out, _ = run(capsys, "demo")
    assert code == 0
    rows = _demo_rows(out)
    assert set(rows) == {"broken", "reference"}  # installed only: no tutorial backend
    assert out.startswith("Quantizing DemoNet (residual CNN, sigmoid gate) with 2 installed ")
    assert "my_backend" not in out
    assert rows["broken"]["status"].startswith("failed: PluginError: fxquant-broken 0.2")
    # the reference backend quantizes everything in reference form, close to float
    reference = rows["reference"]
    counts = [reference[c] for c in ("lowered", "reference", "skipped", "float")]
    assert counts == ["0", "11", "0", "0"]
    assert float(reference["SQNR dB"]) > 25
    # absolute latency next to the ratio: speed is float ms / int8 ms (medians of rounds)
    ratio = float(reference["float ms"]) / float(reference["int8 ms"])
    assert float(reference["speed"].removesuffix("x")) == pytest.approx(ratio, rel=0.5)
    # the status agrees with the speed column, and a slower row says why
    slower = float(reference["speed"].removesuffix("x")) < 1
    assert reference["status"] == (
        "slower than float: reference kernels replay float ops between quantize/dequantize "
        "(nothing lowered)"
        if slower
        else "ok"
    )


def test_demo_runs_the_tutorial_backend_when_named_and_labels_it_the_tutorials(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "demo", "--backends", "reference,my_backend")
    assert code == 0
    rows = _demo_rows(out)
    assert set(rows) == {"reference", "my_backend (tutorial)"}
    assert out.startswith(
        "Quantizing DemoNet (residual CNN, sigmoid gate) with 1 installed backend and the "
        "seed tutorial's my_backend (built by the demo, not installed): "
    )
    # the tutorial backend quantizes only Linear, and says why the rest stayed float
    assert (
        "stem_0 -> stem_1 -> stem_2: no pattern in backend 'my_backend' matches "
        "(Conv2d, BatchNorm2d, ReLU)" in out
    )
    assert "gate (Sigmoid): qconfig is None" in out
    assert rows["my_backend (tutorial)"]["float"] == "5"  # add, pool, flatten, gate, mul
    # its Linear has no lowering rule: said so, not "the rule declined it" (#22)
    assert (
        "  fc, fc_1 (reference form): no lowering rule in backend 'my_backend' for Linear\n" in out
    )
    assert "\nmy_backend (tutorial): not lowered to a kernel, and why\n" in out
    assert fxquant.registry.list_backends() == ["reference"]  # my_backend stays private


def test_demo_explains_every_column_and_the_run_to_run_variance(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "demo", "--backends", "reference")
    header = out.split("\n| ")[1].split("|")
    legend = out.split("Columns (", 1)[1]
    for column in (c.strip() for c in header if c.strip()):
        if column not in ("backend", "runs on", "status"):
            assert f"\n  {column} " in legend, column
    assert "Latency varies from run to run" in legend


def test_demo_with_named_backends_leaves_the_tutorial_backend_out(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "demo", "--backends", "reference")
    assert code == 0
    assert set(_demo_rows(out)) == {"reference"}
    assert "my_backend" not in out
    _, out, _ = run(capsys, "demo", "--backends", "reference,my_backend")
    assert set(_demo_rows(out)) == {"reference", "my_backend (tutorial)"}  # asked for by name


def _toy_backend(installed: Installed, name: str) -> None:
    from fxquant.patterns.generic import reference_pattern_configs

    installed.module(
        name,
        fxquant_pattern_configs=lambda backend: reference_pattern_configs(),
        fxquant_default_qconfig_mapping=lambda backend, is_qat: fxquant.get_default_qconfig_mapping(
            "reference", is_qat
        ),
        fxquant_lowering_kernels=lambda backend: None,
    )
    installed.add(name, name, dist=f"fxquant-{name}")


@pytest.mark.parametrize(
    ("machine", "speed", "status"),
    [
        ("x86_64", 0.5, "slower than float: qnnpack targets ARM; on x86_64 its kernels are slow"),
        ("aarch64", 0.5, "slower than float: reference kernels replay float ops between "
         "quantize/dequantize (nothing lowered)"),
        ("x86_64", 1.5, "ok"),
    ],
)  # fmt: skip
def test_demo_status_says_when_a_row_is_slower_than_float_and_why(
    installed: Installed,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    machine: str,
    speed: float,
    status: str,
) -> None:
    from fxquant.tools import demo

    # a backend named qnnpack on this host, its latency ratio fixed so the status is known
    _toy_backend(installed, "qnnpack")
    monkeypatch.setattr(demo.platform, "machine", lambda: machine)
    monkeypatch.setattr(demo, "_speed", lambda float_run, int8_run: (2e-3, 2e-3 / speed, speed))
    code, out, _ = run(capsys, "demo", "--backends", "qnnpack")
    assert code == 0
    assert _demo_rows(out)["qnnpack"]["status"] == status
    assert "\n  status     ok; slower than float, and why; or failed" in out  # the legend
    (data,) = json.loads(run(capsys, "demo", "--backends", "qnnpack", "--json")[1])
    assert (data["status"], data["status_words"]) == (status.split(":")[0], status)


def test_demo_json_has_the_latencies(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "demo", "--backends", "reference", "--json")
    (result,) = json.loads(out)
    assert result["float_ms"] > 0
    assert result["int8_ms"] > 0


def test_third_party_start_up_lines_are_kept_out_and_everything_else_kept(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from fxquant.tools.quiet import third_party_noise_filtered

    noise = (
        "[cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version\n"
        "Failed to load /venv/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-"
        "x86_64-linux-gnu.so: Could not load this library: /venv/torchao/_C_mxfp8.so\n"
    )
    with third_party_noise_filtered():
        os.write(2, noise.encode())  # as C++ writes it: straight to descriptor 2
        os.write(2, b"fxquant: error: a real problem\n")
        print("a warning of ours", file=sys.stderr)
    _, err = capfd.readouterr()
    assert sorted(err.splitlines()) == ["a warning of ours", "fxquant: error: a real problem"]


def test_help_documents_fxquant_progress() -> None:
    text = build_parser().format_help()
    assert "FXQUANT_PROGRESS=0|1" in text
    assert "only when stderr is a terminal" in text


class ToyRuntime:
    """A deployed model: runs the converted model and reports every quantized node as taken."""

    def __init__(self, model: torch.fx.GraphModule, example_inputs: tuple[object, ...]) -> None:
        self.model = model
        self.calls = 0
        entries = fxquant.explain(model, show=False).entries()
        self.report = Report(
            [
                dataclasses.replace(e, status="lowered", reason=None)
                if e.status == "reference"
                else e
                for e in entries
            ]
        )

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.model(*inputs)


def test_demo_measures_a_deployed_backend_in_its_runtime(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    from fxquant.patterns.generic import reference_pattern_configs

    deployed: list[ToyRuntime] = []

    def deploy(model: torch.fx.GraphModule, example_inputs: tuple[object, ...]) -> ToyRuntime:
        deployed.append(ToyRuntime(model, example_inputs))
        return deployed[-1]

    installed.module(
        "toy",
        fxquant_pattern_configs=lambda backend: reference_pattern_configs(),
        fxquant_default_qconfig_mapping=lambda backend, is_qat: fxquant.get_default_qconfig_mapping(
            "reference", is_qat
        ),
        fxquant_deployment=lambda backend: Deployment("toy runtime", deploy=deploy),
    )
    installed.add("toy", "toy", dist="fxquant-toy")
    code, out, _ = run(capsys, "demo", "--backends", "toy")
    assert code == 0
    cells = _demo_rows(out)["toy"]
    counts = [cells[c] for c in ("lowered", "reference", "skipped")]
    assert counts == ["11", "0", "0"]  # the runtime took every quantized node
    assert cells["runs on"] == "toy runtime"
    assert cells["status"] == "ok" or cells["status"].startswith("slower than float: ")
    assert len(deployed) == 1
    assert deployed[0].calls > 2  # accuracy and speed were measured on the deployed model


def test_show_names_what_runs_a_deployed_backend(
    installed: Installed, capsys: pytest.CaptureFixture[str]
) -> None:
    installed.module(
        "toy",
        fxquant_pattern_configs=lambda backend: [config(torch.nn.Linear)],
        fxquant_deployment=lambda backend: Deployment("toy runtime", deploy=ToyRuntime),
    )
    installed.add("toy", "toy", dist="fxquant-toy")
    _, out, _ = run(capsys, "show", "toy")
    runs_on = next(line for line in out.splitlines() if line.startswith("| Runs On"))
    assert [cell.strip() for cell in runs_on.split("|")[1:-1]] == ["Runs On", "toy runtime"]
    _, out, _ = run(capsys, "show", "reference")
    assert "PyTorch (the model convert_fx returns)" in out


def test_python_m_fxquant_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fxquant", "--version"], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout) == (0, f"fxquant {__version__}\n")


def test_check_failures_shows_the_failed_rows_and_counts_every_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "check", "reference", "--failures", "--shapes", "1")
    assert code == 0
    count = int(re.search(r"reference: (\d+) checks: (\d+) pass, 0 fail", out).group(1))
    assert count > 0  # "0 checks" told a user nothing ran
    assert "| pass " not in out


def test_show_piped_wraps_its_tables_to_the_width_not_to_the_longest_cell() -> None:
    # `fxquant show x86 | head`: every row of the summary was padded to its longest cell
    # (the operator mapping, 3,509 characters); no terminal anywhere here: 120 columns
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    shown = subprocess.run(
        [sys.executable, "-m", "fxquant", "show", "reference"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.splitlines()  # fmt: skip
    summary = shown[2 : shown.index("", 2)]
    assert {len(line) for line in summary} == {120}
    assert summary[0].startswith("|                                           | reference ")
    patterns = shown[shown.index("", 2) + 1 :]
    assert max(len(line) for line in patterns) < 300  # nine columns: wider than 120
    assert len({len(line) for line in patterns}) == 1


def test_show_width_option_wraps_to_it_and_zero_keeps_one_line_per_row(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    _, narrow, _ = run(capsys, "show", "reference")
    _, wide, _ = run(capsys, "show", "reference", "--width", "0")
    assert max(len(line) for line in narrow.splitlines()[2:9]) == 100
    count = int(re.search(r"\((\d+) patterns", wide).group(1))
    assert len(wide.splitlines()) == 1 + 1 + 8 + 1 + 2 + count  # title, summary, patterns
    mapping = next(x for x in wide.splitlines() if x.startswith("| Quantized and Fused"))
    assert "Linear -> reference.Linear" in mapping


def test_show_width_wraps_the_pattern_table_too_down_to_its_longest_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # nine columns do not fit in 60: each narrows to its longest word (never broken), where
    # it stayed at its typical cell (30-48 characters) and the table 254 wide
    _, narrow, _ = run(capsys, "show", "fbgemm", "--width", "60")
    _, wide, _ = run(capsys, "show", "fbgemm", "--width", "0")

    def pattern_table(text: str) -> list[str]:
        lines = text.splitlines()
        return lines[lines.index("", 2) + 1 :]

    def columns(table: list[str]) -> list[list[str]]:
        rows = [line[2:-2].split(" | ") for line in table if not line.startswith("| ---")]
        return [list(column) for column in zip(*rows, strict=True)]

    table, whole = pattern_table(narrow), pattern_table(wide)
    assert len({len(line) for line in table}) == 1  # one width: still a table
    longest = [max(len(w) for cell in column for w in cell.split()) for column in columns(whole)]
    assert len(table[0]) == sum(longest) + 3 * len(longest) + 1 < len(whole[0])
    for narrow_column, whole_column in zip(columns(table), columns(whole), strict=True):
        assert " ".join(narrow_column).split() == " ".join(whole_column).split()  # every word
