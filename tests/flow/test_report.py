from __future__ import annotations

import fxquant
import pytest
import torch
from fxquant.errors import ConfigTypeError, QuantizationSkipped
from fxquant.flow import explain, prepare_fx
from fxquant.flow.report import NodeReport, Reason, Report, raise_if_skipped
from torch import nn


def test_explain_prints_a_table_and_returns_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    gm = prepare_fx(
        nn.Sequential(nn.Linear(2, 2)).eval(),
        fxquant.get_default_qconfig_mapping("reference"),
        (torch.randn(1, 2),),
    )
    report = explain(gm)
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["node", "op", "pattern", "qconfig", "status", "reason"]
    assert [e.status for e in report.entries()] == ["float", "quantized", "float"]


def test_explain_rejects_a_model_without_a_report() -> None:
    with pytest.raises(ConfigTypeError, match="needs a model returned by prepare_fx"):
        explain(nn.Linear(2, 2))


def test_with_entry_replaces_and_keeps_order() -> None:
    a = NodeReport("a", "call_module", None, None, "float")
    b = NodeReport("b", "call_module", None, None, "float")
    reason = Reason("no_pattern", "b: none")
    report = Report([a, b]).with_entry(
        NodeReport("b", "call_module", None, None, "skipped", reason)
    )
    assert [e.node for e in report.entries()] == ["a", "b"]
    assert [e.node for e in report.skipped()] == ["b"]
    assert report.to_dict()["nodes"][1]["reason"]["code"] == "no_pattern"


def test_unknown_reason_code_is_refused() -> None:
    with pytest.raises(ValueError, match="not one of"):
        Reason("oops", "words")


def test_strict_error_lists_each_node_with_code_and_words() -> None:
    reason = Reason(
        "dtype_mismatch", "fc: qconfig activation dtype float16 is not the backend's uint8"
    )
    report = Report([NodeReport("fc", "call_module", "Linear", "x", "skipped", reason)])
    with pytest.raises(QuantizationSkipped, match=r"fc: \[dtype_mismatch\] fc: qconfig"):
        raise_if_skipped(report, "prepare_fx")


def test_codes_and_statuses_are_enum_members_that_read_as_their_strings() -> None:
    import json
    import pickle

    from fxquant.flow.report import NodeStatus, ReasonCode

    reason = Reason("quant_range", "fc: quant_max 255 exceeds 127", field="quant_max_upper_bound")
    entry = NodeReport("fc", "call_module", "Linear", None, "skipped", reason)
    assert reason.code is ReasonCode.QUANT_RANGE
    assert entry.status is NodeStatus.SKIPPED
    assert (reason.code, entry.status) == ("quant_range", "skipped")  # comparisons unchanged
    assert f"[{reason.code}] {entry.status}" == "[quant_range] skipped"
    assert {"quant_range": 1}[reason.code] == 1  # hashes like its string
    report = Report([entry])
    assert json.loads(json.dumps(report.to_dict()))["nodes"][0]["status"] == "skipped"
    assert "quant_range: fc: quant_max" in report.table()
    assert pickle.loads(pickle.dumps(entry)) == entry


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Reason("no_such_code", "x"), r"^Reason code 'no_such_code' is not one of "),
        (
            lambda: NodeReport("a", "placeholder", None, None, "done"),
            r"^NodeReport status 'done' is not one of quantized, skipped, lowered, reference, "
            r"float$",
        ),
    ],
)
def test_an_unknown_code_or_status_names_every_valid_choice(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        build()  # type: ignore[operator]
    if "Reason" in message:
        from fxquant.flow.report import CODES

        assert str(caught.value).endswith(", ".join(CODES))


def test_the_table_ends_with_each_statuss_count_and_its_reasons(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2)).eval()
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping("x86").set_module_name("3", None)
    prepared = prepare_fx(model, mapping, (x,), backend_config=fxquant.get_backend_config("x86"))
    prepared(x)
    explain(fxquant.convert_fx(prepared))
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "summary: 2 lowered, 1 float (qconfig_none 1)"
