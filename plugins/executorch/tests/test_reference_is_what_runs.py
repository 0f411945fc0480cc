"""The reference model says what the ``.pte`` runs (#23), on a small BERT and a CNN.

The default mapping's Linear layers are dynamic int8 per token: XNNPACK's dynamic
fully-connected kernels quantize each row of their input with its own asymmetric
qparams at run time and return fp32. The reference model spells the same steps
(``choose_qparams_per_token_asymmetric -> quantize_per_token -> dequantize_per_token``),
so the program's output is within what one step of the last Linear's int8 input moves
it (the two may round a tie apart), where a per-tensor reference (what the dynamic
mapping wrote before) was off by the outlier channels' share of the range. Convs stay
static int8, a transformer's other ops float, and ``explain`` says why.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from types import ModuleType

import fxquant
import pytest
import torch
from fxquant.lowering import PER_TOKEN_OPS
from fxquant_executorch import to_executorch
from fxquant_executorch.delegation import delegation_report
from torch import fx, nn

pytestmark = pytest.mark.slow  # exports two models to ExecuTorch

BACKEND = "executorch"


def quantized(
    model: nn.Module, batches: list[tuple[torch.Tensor, ...]]
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """(reference, converted) from one calibration with the default mapping."""
    config = fxquant.get_backend_config(BACKEND)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, batches[0], backend_config=config)
    with torch.no_grad():
        for batch in batches:
            prepared(*batch)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared), backend_config=config)
    return reference, fxquant.convert_fx(prepared, backend_config=config)


Case = tuple[nn.Module, list[tuple[torch.Tensor, ...]], str]


def bert(zoo: ModuleType) -> Case:
    """A one-layer BERT, three padded batches, and its last Linear."""
    model = zoo.seeded(lambda: zoo.BertLike(hidden=32, heads=4, ffn=64, layers=1, vocab=50))
    batches = [zoo.bert_inputs(50, seed, batch=2, length=12, padding=2) for seed in range(3)]
    return model.eval(), batches, "head"


def cnn(zoo: ModuleType) -> Case:
    """The digits CNN (conv-bn-relu twice, pool, linear), three batches, and its Linear."""
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.rand(8, 1, 8, 8, generator=generator),) for _ in range(3)]
    return zoo.seeded(zoo.SmallCNN).eval(), batches, "fc"


MODELS: dict[str, Callable[[ModuleType], Case]] = {
    "bert": bert,
    "cnn": cnn,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_the_pte_output_is_within_one_input_step_of_the_reference(
    name: str, zoo: ModuleType, linear_input_step: Callable[..., float]
) -> None:
    model, batches, head = MODELS[name](zoo)
    reference, converted = quantized(model, batches)
    held_out = batches[-1]
    program = to_executorch(converted, held_out)
    with torch.no_grad():
        want = reference(*held_out)
    got = program(*held_out)
    # the last Linear returns float: the two agree to what one step of its input moves it
    assert float((got - want).abs().max()) <= linear_input_step(reference, head, held_out) * 1.001
    comparison = fxquant.numerics.compare(reference, program, [held_out])
    assert comparison["output"].sqnr > 40  # dB against the reference model
    # every Linear is dynamic per token in the reference and runs in XNNPACK
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    per_token = [n for n in reference.graph.nodes if n.target in PER_TOKEN_OPS]
    assert len(per_token) >= 2
    statuses = {e.node: str(e.status) for e in program.report.entries()}
    assert {statuses[n.replace(".", "_")] for n in linears} == {"lowered"}


def test_convs_stay_static_int8_and_the_linear_takes_int8_per_token(zoo: ModuleType) -> None:
    model, batches, _ = cnn(zoo)
    reference, _ = quantized(model, batches)
    static = torch.ops.fxquant.quantize_per_tensor.default
    modules = dict(reference.named_modules())
    producers = {
        str(n.args[0].target)
        for n in reference.graph.nodes
        if n.target == static and isinstance(n.args[0], fx.Node) and n.args[0].op == "call_module"
    }
    assert {"conv1", "conv2"} <= producers  # int8 outputs, on a calibrated grid
    fc = next(n for n in reference.graph.nodes if n.op == "call_module" and n.target == "fc")
    assert fc.args[0].target == torch.ops.fxquant.dequantize_per_token.default
    assert modules["fc"].get_weight_qparams()["dtype"] == torch.int8
    assert fc.users
    assert all(u.op == "output" for u in fc.users)


def test_explain_says_why_a_transformers_other_ops_stay_float(zoo: ModuleType) -> None:
    model, batches, _ = bert(zoo)
    _, converted = quantized(model, batches)
    entries = fxquant.explain(converted, show=False).entries()
    reasons = {e.node: e.reason for e in entries if str(e.status) == "float" and e.reason}
    for node in ("layers_0_norm1", "add_6", "matmul", "layers_0_gelu"):
        reason = reasons.get(node) or next(r for n, r in reasons.items() if n.startswith(node))
        assert reason.code == "qconfig_none"
    # the program's report says why the default keeps them float
    program_report = delegation_report(fxquant.explain(converted, show=False), [])
    norm = next(e for e in program_report.entries() if e.node == "layers_0_norm1")
    assert norm.reason is not None
    assert "TRANSFORMER_FLOAT_OPS" in norm.reason.words
    assert "requantize the residual stream" in norm.reason.words
    linears = [e for e in entries if e.pattern == "Linear"]
    assert len(linears) == sum(isinstance(m, nn.Linear) for m in model.modules())
    assert all(e.qconfig and e.qconfig.startswith("PerTokenObserver") for e in linears)


def test_a_cnns_float_relu_and_add_are_explained_without_a_transformers_ops() -> None:
    from fxquant.tools.demo import DemoNet

    model = DemoNet().eval()
    _, converted = quantized(model, [(torch.randn(4, 3, 16, 16),)])
    report = delegation_report(fxquant.explain(converted, show=False), [])
    words = {e.node: e.reason.words for e in report.entries() if e.reason is not None}
    relu = words["relu"]  # the residual block's add + relu, kept float by the default mapping
    assert "keeps residual adds, standalone relus, dropouts and reshapes float" in relu
    for transformer_op in ("LayerNorm", "softmax", "GELU", "transformer", "residual stream"):
        assert transformer_op not in relu


def test_a_cnns_float_sigmoid_gate_says_xnnpack_has_no_int8_kernel_for_it() -> None:
    from fxquant.tools.demo import DemoNet

    model = DemoNet().eval()
    _, converted = quantized(model, [(torch.randn(4, 3, 16, 16),)])
    report = delegation_report(fxquant.explain(converted, show=False), [])
    gate = next(e for e in report.entries() if e.node == "gate")
    assert str(gate.status) == "float"  # not skipped: fxquant demo's 'skipped' column stays 0
    assert gate.reason is not None
    assert "FLOAT_ACTIVATIONS" in gate.reason.words
    assert "XNNPACK runs them in float32" in gate.reason.words
