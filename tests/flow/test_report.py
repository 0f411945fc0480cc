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
