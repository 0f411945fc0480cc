"""Nothing is silently skipped (issue 30): every float op row of ``explain`` says why, and
strict mode passes on transformers' BertModel with a backend's own default mapping.

The rows that stayed float without a reason were nodes that hold nothing to quantize
(a shape read's ``getitem``, ``finfo``, a comparison, a cast to ``bool``) or a constant
(``torch.ones(input_shape)``, a slice of a buffer): each now says which. Strict mode counts
quantizable patterns left float against the mapping; a shape read, a constant, the
attention mask transformers builds from the input's shape and the ops a default mapping
keeps float on purpose are none of those.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator

import fxquant
import pytest
import torch
from fxquant import explain
from fxquant.flow.report import Report
from torch import nn

from tests.zoo import torchvision_models
from tests.zoo.hf import BUILDERS
from tests.zoo.runner import quiet

X86_BF16 = "FXQUANT_X86_BF16"


def _eager(name: str) -> Callable[[], nn.Module]:
    return lambda: BUILDERS[name](attn_implementation="eager")


def _tokens(masked: bool) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    if not masked:
        return (ids,)
    keep = torch.ones(2, 16, dtype=torch.long)
    keep[0, -5:] = 0  # padding: the mask transformers builds holds finfo.min there
    return ids, keep


def _images() -> tuple[torch.Tensor, ...]:
    return (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)),)


# the new-user trial's DistilBERT (eager attention, 17 float rows with a qconfig and no
# reason), BERT with sdpa and a padding mask, ALBERT's shared layers and written-out GELU,
# ELECTRA's eager attention, and two torchvision models (ShuffleNet's chunk pieces, Swin's
# windows and shifted-window mask)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "distilbert_eager": (_eager("distilbert"), lambda: _tokens(False)),
    "bert_sdpa_masked": (BUILDERS["bert"], lambda: _tokens(True)),
    "albert": (BUILDERS["albert"], lambda: _tokens(False)),
    "electra_eager_masked": (_eager("electra"), lambda: _tokens(True)),
    "tv_shufflenet_v2": (lambda: torchvision_models.BUILDERS["tv_shufflenet_v2"](), _images),
    "tv_swin": (lambda: torchvision_models.BUILDERS["tv_swin"](), _images),
}  # fmt: skip

BACKENDS = ("x86", "x86_bf16", "qnnpack", "executorch", "tensorrt")
"""``x86`` with ``FXQUANT_X86_BF16`` pinned off and on (its attention_bf16 mode), so every
host runs both."""


@pytest.fixture
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name: str = request.param
    if name.removesuffix("_bf16") not in fxquant.list_backends():
        pytest.skip(f"backend {name!r} is not installed")
    monkeypatch.setenv(X86_BF16, "1" if name.endswith("_bf16") else "0")
    fxquant.refresh()  # x86's patterns follow the pinned flag
    yield name.removesuffix("_bf16")
    monkeypatch.delenv(X86_BF16)
    fxquant.refresh()


def _unexplained(report: Report) -> list[str]:
    """Float op rows without a reason, a qconfig on them or not: the summary line counts each
    float op by its reason, so one without a reason reads as a gap."""
    return [
        f"{e.node} ({e.op}, {e.pattern or '-'}, qconfig {e.qconfig or '-'})"
        for e in report.entries()
        if e.op.startswith("call") and e.status == "float" and e.reason is None
    ]


def _summary_floats(report: Report) -> tuple[int, int]:
    """(float ops, float ops the summary's reason counts add up to)."""
    found = re.search(r"(\d+) float(?: \(([^)]*)\))?", report.summary())
    if found is None:
        return 0, 0
    counts = [int(part.rsplit(" ", 1)[1]) for part in (found[2] or "").split(", ") if part]
    return int(found[1]), sum(counts)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_every_float_op_row_says_why_and_the_summary_adds_up(model_name: str, backend: str) -> None:
    build, inputs = MODELS[model_name]
    if model_name.startswith("tv_"):
        torchvision_models.require()
    torch.manual_seed(0)
    model, example = build(), inputs()
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    with quiet():
        prepared = fxquant.prepare_fx(model, mapping, example, backend_config=config)
        prepared(*example)
        converted = fxquant.convert_fx(prepared)
    for stage, graph in (("prepared", prepared), ("converted", converted)):
        report = explain(graph, show=False)
        assert _unexplained(report) == [], f"{stage}: float rows with no reason"
        total, explained = _summary_floats(report)
        assert total == explained, f"{stage}: {report.summary()}"


def _bert(attention: str) -> nn.Module:
    torch.manual_seed(0)
    return BUILDERS["bert"](attn_implementation=attention)


def _sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    return float(10 * torch.log10(expected.pow(2).mean() / (expected - got).pow(2).mean()))


@pytest.mark.parametrize("backend", ["x86", "x86_bf16", "fbgemm"], indirect=True)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("masked", [False, True], ids=["ids", "ids_and_mask"])
def test_strict_mode_passes_on_bert_with_the_backends_default_mapping(
    backend: str, attention: str, masked: bool
) -> None:
    # what strict mode raised on: the three embeddings (the default's global uint8 on a
    # lookup), the pooler's hidden_states[:, 0], the padding mask transformers builds from
    # the input's shape (torch.ones, expand, to, 1 - mask, masked_fill with finfo.min) and
    # the sdpa calls reading it, eager attention's scores / sqrt(d)
    model, example = _bert(attention), _tokens(masked)
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    with quiet():
        prepared = fxquant.prepare_fx(model, mapping, example, backend_config=config, strict=True)
        prepared(*example)
        lowered = fxquant.convert_fx(prepared, strict=True)
    report = explain(lowered, show=False)
    assert report.skipped() == []
    rows = {e.node: e for e in report.entries()}
    assert rows["pooler_dense"].status == "lowered"  # the slice before it cost no kernel
    with torch.no_grad():
        expected = model(*example).last_hidden_state
        got = lowered(*example)["last_hidden_state"]
    valid = example[1].bool() if masked else torch.ones(2, 16, dtype=torch.bool)
    assert _sqnr(expected[valid], got[valid]) > 30.0


def test_strict_mode_still_raises_on_a_users_own_entry_the_backend_cannot_run() -> None:
    # what the default keeps float on purpose is not a skip; the same op asked for in int8
    # by the user's own entry, with no pattern for it, is
    model, example = _bert("sdpa"), _tokens(False)
    mapping = fxquant.get_default_qconfig_mapping("qnnpack")
    mapping.set_object_type(operator.getitem, mapping.global_qconfig)
    config = fxquant.get_backend_config("qnnpack")
    with quiet(), pytest.raises(fxquant.QuantizationSkipped, match=r"getitem_\d+: \[no_pattern\]"):
        fxquant.prepare_fx(model, mapping, example, backend_config=config, strict=True)


class _GatedCNN(nn.Module):
    """The float activations of a mobile CNN: F.hardswish, an SE-style sigmoid gate, a tanh
    and x.sigmoid() as a method call."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.gate = nn.Hardsigmoid()
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.hardswish(self.stem(x))
        x = torch.sigmoid(self.conv(x)) * x
        x = torch.tanh(x) + self.gate(x) * x.sigmoid()
        return self.head(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


# on the deploying backends (their convert_fx returns the reference model): a CNN's float
# activations, RegNet's SE sigmoid, BERT's pooler slice and tanh and eager attention's
# scores / sqrt(d), each a skip in strict mode on the default mapping
STRICT_MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "gated_cnn": (_GatedCNN, lambda: (torch.randn(2, 3, 16, 16),)),
    "tv_regnet_y_400mf": (torchvision_models.BUILDERS["tv_regnet_y_400mf"], _images),
    "bert_sdpa_masked": (BUILDERS["bert"], lambda: _tokens(True)),
    "bert_eager": (_eager("bert"), lambda: _tokens(False)),
    "roberta_sdpa": (BUILDERS["roberta"], lambda: _tokens(False)),
    "roberta_eager_masked": (_eager("roberta"), lambda: _tokens(True)),
}  # fmt: skip


def _output(result: object) -> torch.Tensor:
    if isinstance(result, torch.Tensor):
        return result
    return result["last_hidden_state"]  # type: ignore[index]  # transformers' dict output


@pytest.mark.parametrize("backend", ["executorch", "tensorrt"], indirect=True)
@pytest.mark.parametrize("model_name", sorted(STRICT_MODELS))
def test_strict_mode_passes_on_the_deploying_backends_default_mapping(
    model_name: str, backend: str
) -> None:
    build, inputs = STRICT_MODELS[model_name]
    if model_name.startswith("tv_"):
        torchvision_models.require()
    torch.manual_seed(0)
    model, example = build().eval(), inputs()
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    with quiet():
        prepared = fxquant.prepare_fx(model, mapping, example, backend_config=config, strict=True)
        prepared(*example)
        converted = fxquant.convert_fx(prepared, strict=True)
    report = explain(converted, show=False)
    assert report.skipped() == []
    # the ops strict mode refused are float on purpose, and said so; every conv and Linear
    # is still quantized
    floats = [e for e in report.entries() if e.status == "float" and e.op.startswith("call")]
    assert [e.node for e in floats if e.reason is None] == []
    layers = [e for e in report.entries() if "Conv" in str(e.pattern) or "Linear" in str(e.pattern)]
    assert layers
    assert [e.node for e in layers if e.status != "reference"] == []
    with torch.no_grad():
        expected, got = _output(model(*example)), _output(converted(*example))
    assert _sqnr(expected, got) > 25.0
