"""QAT traces the model in training mode: the converted model must still run as eval() says.

A module's ``self.training`` read while tracing was frozen into the graph: the converted model
of a QAT run kept torchvision's stochastic depth and a functional dropout dropping at random
(the lowered and the reference model of an EfficientNet-b0 were 255 steps apart, neither
deterministic), and ``convert_fx`` returned a module in training mode. A training-only
Python branch (a stochastic depth drawing ``torch.empty(x.shape)``, transformers' SpecAugment)
could not be traced at all. QAT then convert now runs the eval-mode network; the prepared model
still drops in training mode where the flag is passed to a call.
"""

from __future__ import annotations

import importlib.util

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.numerics import compare
from torch import fx, nn

STEP_SLACK = 1.0 + 1e-3


@fx.wrap
def drop_rows(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """torchvision's ``stochastic_depth`` in short: a function the tracer keeps as one call."""
    if not training or p == 0.0:
        return x
    keep = torch.empty(x.shape[0], *([1] * (x.dim() - 1))).bernoulli_(1.0 - p)
    return x * keep / (1.0 - p)


class FlagPassed(nn.Module):
    """Residual blocks whose random parts take ``self.training`` as an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = drop_rows(torch.relu(self.bn(self.conv(x))), 0.5, self.training)
        pooled = F.dropout((x + y).mean((2, 3)), 0.5, self.training)
        return self.head(pooled)


class FlagBranched(nn.Module):
    """A stochastic depth written as an ``if self.training`` branch on the input's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        if self.training:
            keep = torch.empty([x.shape[0], 1, 1, 1]).bernoulli_(0.5)
            y = y * keep / 0.5
        return x + y


def _qat(model: nn.Module, backend: str = "x86") -> fx.GraphModule:
    torch.manual_seed(0)
    x = torch.randn(4, 4, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping(backend, is_qat=True)
    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_qat_fx(model.train(), mapping, (x,), backend_config=config)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-3)
    for _ in range(3):
        optimizer.zero_grad()
        prepared(torch.randn(4, 4, 8, 8)).pow(2).mean().backward()
        optimizer.step()
    return prepared.eval()


@pytest.mark.parametrize("convert", [fxquant.convert_fx, fxquant.convert_to_reference_fx])
def test_a_qat_model_converted_runs_its_flag_taking_calls_in_eval_mode(convert) -> None:
    prepared = _qat(FlagPassed())
    converted = convert(prepared, backend_config=fxquant.get_backend_config("x86"))
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        first, second = converted(x), converted(x)
    assert not converted.training, "convert returns the prepared model's mode (eval)"
    assert torch.equal(first, second), "the converted model still drops at random"


def test_the_prepared_model_still_drops_in_training_mode() -> None:
    prepared = _qat(FlagPassed()).train()
    x = torch.randn(8, 4, 8, 8)
    with torch.no_grad():
        outputs = [prepared(x) for _ in range(4)]
    assert any(not torch.equal(outputs[0], o) for o in outputs[1:])


@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
def test_lowered_qat_model_is_within_a_step_of_its_reference(backend: str) -> None:
    prepared = _qat(FlagPassed(), backend)
    config = fxquant.get_backend_config(backend)
    lowered = fxquant.convert_fx(prepared, backend_config=config)
    reference = fxquant.convert_to_reference_fx(prepared, backend_config=config)
    batches = [(torch.randn(2, 4, 8, 8),) for _ in range(2)]
    far = [
        (row.node, row.local_steps)
        for row in compare(reference, lowered, batches)
        if row.node != "output" and row.local_steps is not None and row.local_steps > STEP_SLACK
    ]
    assert not far


def test_a_training_only_branch_is_traced_on_its_eval_side() -> None:
    model = FlagBranched()
    prepared = _qat(model)
    converted = fxquant.convert_fx(prepared, backend_config=fxquant.get_backend_config("x86"))
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        assert torch.equal(converted(x), converted(x))
    assert not any(n.target is torch.empty for n in prepared.graph.nodes)
    assert model.training, "the caller's model keeps its own mode"
    assert all(type(m.training) is bool for m in model.modules())


def test_a_ptq_trace_of_an_eval_model_is_unchanged() -> None:
    model = FlagPassed().eval()
    x = torch.randn(2, 4, 8, 8)
    prepared = fxquant.prepare_fx(model, fxquant.get_default_qconfig_mapping("x86"), (x,))
    assert not any(n.op == "get_attr" and n.target == "training" for n in prepared.graph.nodes)


_TORCHVISION = importlib.util.find_spec("torchvision") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _TORCHVISION, reason="torchvision is not installed")
@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
def test_torchvision_efficientnet_b0_qat_lowered_agrees_with_its_reference(backend: str) -> None:
    """torchvision's EfficientNet-b0 (``stochastic_depth(x, p, mode, self.training)``) after
    two QAT steps: the converted model is deterministic, every lowered node within one step
    of the reference model (before: 255 steps, both dropping residual branches at random)."""
    from torchvision.models import efficientnet_b0

    torch.manual_seed(0)
    model = efficientnet_b0(num_classes=10).train()
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend, is_qat=True)
    x = torch.randn(4, 3, 64, 64)
    prepared = fxquant.prepare_qat_fx(model, mapping, (x,), backend_config=config)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-5)
    for seed in (1, 2):
        optimizer.zero_grad()
        batch = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
        prepared(batch).pow(2).mean().backward()
        optimizer.step()
    prepared.eval()
    lowered = fxquant.convert_fx(prepared, backend_config=config)
    reference = fxquant.convert_to_reference_fx(prepared, backend_config=config)
    batches = [
        (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(s)),) for s in (9, 10)
    ]
    with torch.no_grad():
        assert torch.equal(lowered(*batches[0]), lowered(*batches[0]))
    reasons = {e.node: e.reason for e in fxquant.explain(lowered, show=False).entries()}
    far = [
        (row.node, round(row.local_steps, 1))
        for row in compare(reference, lowered, batches)
        if row.node != "output"
        and row.local_steps is not None
        and row.local_steps > STEP_SLACK
        and reasons.get(row.node) is None
    ]
    assert not far


@pytest.mark.slow
@pytest.mark.parametrize("name", ["efficientnet", "wav2vec2"])
def test_zoo_models_with_training_only_branches_run_under_qat(name: str) -> None:
    """The zoo's EfficientNet (stochastic depth as ``if self.training``: a mask drawn with
    ``torch.empty(x.shape)``) and transformers' Wav2Vec2 (SpecAugment and layer drop under
    ``self.training``: "'HFProxy' object cannot be interpreted as an integer") were refused by
    the training-mode trace. Both train, and convert to the eval-mode network."""
    from tests.zoo.runner import ZOO, main_output

    zoo = ZOO[name]
    if zoo.family == "transformers":
        pytest.importorskip("transformers")
    model = zoo.build().train()
    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86", is_qat=True)
    prepared = fxquant.prepare_qat_fx(model, mapping, zoo.inputs(0), backend_config=config)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=1e-5)
    for seed in (1, 2):
        optimizer.zero_grad()
        main_output(prepared(*zoo.inputs(seed))).pow(2).mean().backward()
        optimizer.step()
    converted = fxquant.convert_fx(prepared.eval(), backend_config=config)
    with torch.no_grad():
        first, second = (main_output(converted(*zoo.inputs(9))) for _ in range(2))
    assert torch.equal(first, second)
    assert torch.isfinite(first).all()


@pytest.mark.slow
def test_a_transformers_bert_converted_after_qat_stops_its_attention_dropout() -> None:
    """transformers' eager attention calls ``F.dropout(w, p, training=self.training)``: traced
    in training mode it kept dropping attention weights in the converted model (two calls on
    one batch differed). Embeddings stay float here: their QAT defaults are another matter."""
    pytest.importorskip("transformers")
    from tests.zoo.runner import ZOO, main_output

    zoo = ZOO["bert"]
    mapping = fxquant.get_default_qconfig_mapping("x86", is_qat=True)
    mapping.set_object_type(nn.Embedding, None)
    config = fxquant.get_backend_config("x86")
    prepared = fxquant.prepare_qat_fx(
        zoo.build().train(), mapping, zoo.inputs(0), backend_config=config
    )
    prepared(*zoo.inputs(1))
    converted = fxquant.convert_fx(prepared.eval(), backend_config=config)
    with torch.no_grad():
        first, second = (main_output(converted(*zoo.inputs(9))) for _ in range(2))
    assert torch.equal(first, second)


@pytest.mark.parametrize("backend", ["x86", "reference"])
@pytest.mark.parametrize("convert", [fxquant.convert_fx, fxquant.convert_to_reference_fx])
def test_every_module_of_the_converted_model_takes_the_prepared_models_mode(
    backend: str, convert
) -> None:
    # the kernels, reference modules and containers convert builds are fresh modules, which
    # start in training mode: a float BatchNorm or dropout among them would train at inference
    converted = convert(_qat(FlagPassed(), backend))
    assert [name for name, m in converted.named_modules() if m.training] == []
    ptq = fxquant.prepare_fx(
        nn.Sequential(nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten()).eval(),
        fxquant.get_default_qconfig_mapping(backend),
        (torch.randn(2, 4, 8, 8),),
        backend_config=fxquant.get_backend_config(backend),
    )
    ptq(torch.randn(2, 4, 8, 8))
    assert [name for name, m in convert(ptq).named_modules() if m.training] == []
