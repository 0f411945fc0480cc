"""Strict mode on PyTorch's stock transformer modules, every installed backend (issue 30).

fxquant traces ``nn.MultiheadAttention`` and the ``nn.Transformer*`` modules through
plain ops of its own (``fxquant.flow.transformer``): the tracer's ``_assert_is_none``
checks of a ``None`` argument, the head split (``narrow``, ``unflatten``, ``movedim``),
dropouts. None of them may be what makes ``strict=True`` refuse the model: a node that
holds no float value is not a pattern to quantize, and a view op carries its input's
grid (or stays float where the backend's mapping says so). What a backend really
cannot quantize is refused with the op and the backend named.
"""

from __future__ import annotations

import warnings
from typing import Any

import fxquant
import pytest
import torch
from fxquant import QuantizationSkipped, convert_fx, explain, prepare_fx
from fxquant.flow.report import Reason, Report
from torch import nn

D, HEADS, FF, SEQ, MEM, BATCH = 32, 4, 48, 6, 5, 2

KINDS = ("mha", "encoder_layer", "decoder_layer", "encoder", "transformer")
REQUIRED = {"mha": 3, "encoder_layer": 1, "decoder_layer": 2, "encoder": 1, "transformer": 2}
"""Positional inputs without a default: the rest left out, the tracer checks they stay None."""

# what a backend really has no pattern for, among the ops the rewrite writes: the generic
# patterns of ``reference`` have no softmax (neither has torch.ao's)
CANNOT = {"reference": {"F.softmax"}}


def _seq(batch_first: bool, length: int = SEQ) -> torch.Tensor:
    return torch.randn(BATCH, length, D) if batch_first else torch.randn(length, BATCH, D)


def _padding(length: int) -> torch.Tensor:
    mask = torch.zeros(BATCH, length, dtype=torch.bool)
    mask[0, -2:] = True
    return mask


def _case(kind: str, batch_first: bool, masked: bool) -> tuple[nn.Module, tuple[Any, ...]]:
    """The stock module as the root model, its positional inputs (masks or None)."""
    torch.manual_seed(0)
    x, memory = _seq(batch_first), _seq(batch_first, MEM)
    causal = nn.Transformer.generate_square_subsequent_mask(SEQ) if masked else None
    padding = _padding(SEQ) if masked else None
    options = {"dim_feedforward": FF, "batch_first": batch_first}
    if kind == "mha":
        mha = nn.MultiheadAttention(D, HEADS, batch_first=batch_first)
        return mha.eval(), (x, x, x, padding)
    if kind == "encoder_layer":
        return nn.TransformerEncoderLayer(D, HEADS, **options).eval(), (x, causal, padding)
    if kind == "encoder":
        layer = nn.TransformerEncoderLayer(D, HEADS, **options)
        encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        return encoder.eval(), (x, causal, padding)
    if kind == "decoder_layer":
        layer = nn.TransformerDecoderLayer(D, HEADS, **options)
        return layer.eval(), (x, memory, causal, None, padding)
    with warnings.catch_warnings():  # torch's note that seq-first has no nested-tensor path
        warnings.simplefilter("ignore", UserWarning)
        model = nn.Transformer(D, HEADS, 1, 1, FF, batch_first=batch_first)
    model.encoder.use_nested_tensor = False
    return model.eval(), (memory, x, None, causal)


def _lacks(backend: str, reason: Reason | None) -> bool:
    if reason is None or reason.code != "no_pattern":
        return False
    return any(reason.words.endswith(f"matches {op}") for op in CANNOT.get(backend, ()))


def _refused(report: Report, backend: str) -> set[str]:
    """The skipped nodes, but for what the backend is known to lack (``CANNOT``)."""
    return {
        f"{e.node}: {e.reason.words if e.reason else e.status}"
        for e in report.skipped()
        if not _lacks(backend, e.reason)
    }


def _strict(kind: str, backend: str, batch_first: bool, masked: bool | None) -> set[str]:
    model, inputs = _case(kind, batch_first, bool(masked))
    if masked is None:
        inputs = inputs[: REQUIRED[kind]]
    backend_config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    try:
        prepared = prepare_fx(model, mapping, inputs, backend_config=backend_config, strict=True)
    except QuantizationSkipped:
        prepared = prepare_fx(model, mapping, inputs, backend_config=backend_config)
        return _refused(explain(prepared, show=False), backend)
    with torch.no_grad():
        prepared(*inputs)
    if backend == "reference":  # no kernels: convert_fx leaves every pattern as it is
        return set()
    try:
        convert_fx(prepared, strict=True)
    except QuantizationSkipped:
        return _refused(explain(convert_fx(prepared), show=False), backend)
    return set()


@pytest.mark.parametrize("backend", fxquant.list_backends())
@pytest.mark.parametrize("kind", KINDS)
def test_stock_transformer_modules_pass_strict_mode_on_every_backend(
    kind: str, backend: str
) -> None:
    for batch_first, masked in ((True, True), (False, False), (False, True), (False, None)):
        refused = _strict(kind, backend, batch_first, masked)
        assert not refused, (kind, backend, batch_first, masked, sorted(refused))


def test_what_reference_lacks_is_refused_with_the_op_and_the_backend() -> None:
    model, inputs = _case("encoder", True, False)
    with pytest.raises(QuantizationSkipped) as raised:
        prepare_fx(
            model,
            fxquant.get_default_qconfig_mapping("reference"),
            inputs[:1],  # no mask argument at all: the softmax reads plain scores
            backend_config=fxquant.get_backend_config("reference"),
            strict=True,
        )
    lines = [line for line in str(raised.value).splitlines() if line.startswith("  ")]
    assert lines, str(raised.value)
    assert all("no pattern in backend 'reference' matches F.softmax" in li for li in lines)


def test_the_tracers_none_checks_and_the_head_split_are_not_skipped() -> None:
    model, inputs = _case("encoder", False, False)
    prepared = prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping("x86"),
        inputs,
        backend_config=fxquant.get_backend_config("x86"),
    )
    entries = {e.node: e for e in explain(prepared, show=False).entries()}
    written = [n for n in entries if n.startswith(("_assert_is_none", "narrow", "unflatten"))]
    assert written, sorted(entries)  # the rewrite wrote them: the test looks at them
    assert all(entries[n].status == "float" for n in written), [
        (n, entries[n].status) for n in written
    ]
    movedims = [n for n in entries if n.startswith("movedim")]
    assert movedims
    assert all(entries[n].status == "float" for n in movedims)
