"""The reference model says what the lowered model runs (#23), on a transformer and a CNN.

x86 and onednn's linear kernels take int8 and return fp32, and so do fbgemm's and
qnnpack's (fbgemm's fused fp32-output linear, QNNPACK's dynamic one given the static
range: fxquant_quantized_engine.float_output): their Linear DTypeConfig says so (int8 in,
float out), so the reference model leaves the output float too and ``explain`` labels
the pattern. Every weighted node of the lowered model is then within
one quantization step of the reference model's same node: float outputs equal (up to
float accumulation order), integer outputs within one step of the reference's quantize.

x86/onednn run with 7-bit activations here: oneDNN's u8 x s8 kernels saturate int16 on
CPUs without VNNI when activations use the full 0..255 range (issue of its own).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import fxquant
import pytest
import torch
from fxquant.lowering import QUANTIZE_OPS
from torch import fx, nn

from tests.flow.zoo import BertLike, SmallCNN, bert_inputs, seeded

SEVEN_BIT = ("x86", "onednn")


def mapping_for(backend: str) -> Any:
    mapping = fxquant.get_default_qconfig_mapping(backend)
    if backend in SEVEN_BIT:
        from fxquant_onednn.qconfig import activation_qconfig

        mapping.set_global(activation_qconfig(is_qat=False, reduce_range=True))
    return mapping


def quantized(
    model: nn.Module, backend: str, inputs: list[tuple[torch.Tensor, ...]]
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """(reference, lowered) from one calibration."""
    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_fx(model, mapping_for(backend), inputs[0], backend_config=config)
    with torch.no_grad():
        for x in inputs:
            prepared(*x)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared), backend_config=config)
    return reference, fxquant.convert_fx(prepared, backend_config=config)


def _outputs(gm: fx.GraphModule, names: list[str], x: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    handles = [
        gm.get_submodule(name).register_forward_hook(
            lambda _m, _i, out, name=name: seen.__setitem__(name, out)
        )
        for name in names
    ]
    with torch.no_grad():
        gm(*x)
    for handle in handles:
        handle.remove()
    return seen


def weighted_nodes(reference: fx.GraphModule) -> dict[str, fx.Node]:
    """The reference's weighted modules (linear, conv; fused or not) by target."""
    found = {}
    for node in reference.graph.nodes:
        if node.op != "call_module":
            continue
        module = reference.get_submodule(str(node.target))
        inner = module[0] if isinstance(module, nn.Sequential) else module
        if hasattr(inner, "get_weight_qparams"):
            found[str(node.target)] = node
    return found


def _quantize_after(node: fx.Node) -> fx.Node | None:
    """The quantize step after ``node`` (or after the one float op a kernel takes in)."""
    for candidate in (node, *node.users):
        found = [u for u in candidate.users if u.op == "call_function" and u.target in QUANTIZE_OPS]
        if len(found) == 1:
            return found[0]
    return None


def _input_step(reference: fx.GraphModule, node: fx.Node) -> float:
    """How far one step of the node's int8 input moves its output, at most."""
    module = reference.get_submodule(str(node.target))
    inner = module[0] if isinstance(module, nn.Sequential) else module
    scale = float(node.args[0].args[1])  # the dequantize step before it: its scale
    weight = inner.get_weight().detach()
    return scale * float(weight.abs().flatten(1).sum(1).max())


def check_each_node(
    reference: fx.GraphModule, lowered: fx.GraphModule, x: tuple[torch.Tensor, ...]
) -> int:
    """Every weighted node of ``lowered`` against the reference's; returns how many.

    A float output (int8 in, float out) is within what one step of its int8 input moves
    it (the lowered and reference inputs may round apart by one step upstream); an
    integer output within one step of the reference's quantize step, plus that.
    """
    nodes = weighted_nodes(reference)
    modules = dict(lowered.named_modules())
    # a kernel that took in a following float add (a residual) returns the sum: the add's
    # output, checked by the model's output
    names = [n for n in nodes if n in modules and not getattr(modules[n], "adds_input", False)]
    expected = _outputs(reference, names, x)
    got = _outputs(lowered, names, x)
    for name in names:
        value, ref = got[name], expected[name]
        if getattr(modules[name], "post_op", None) == "gelu":  # the float GELU, taken in
            ref = nn.functional.gelu(ref, approximate=modules[name].post_op_algorithm or "none")
        if value.dtype.is_floating_point:
            step = _input_step(reference, nodes[name])
            assert float((value - ref).abs().max()) <= step * 1.001 + 1e-5, name
            continue
        quantize = _quantize_after(nodes[name])
        assert quantize is not None, f"{name}: integer output without a quantize step"
        _, scale, zero_point, low, high, _ = quantize.args
        q = torch.clamp(torch.round(ref / scale) + zero_point, low, high)
        # one output step of its own, plus what one step of its input, upstream, moves it
        slack = 1 + _input_step(reference, nodes[name]) / float(scale)
        assert float((value.float() - q).abs().max()) <= slack, name
    return len(names)


def transformer() -> tuple[nn.Module, list[tuple[torch.Tensor, ...]]]:
    model = seeded(lambda: BertLike(hidden=32, heads=4, ffn=64, layers=2, vocab=50)).eval()
    return model, [bert_inputs(50, seed, batch=4, length=16, padding=3) for seed in range(4)]


def cnn() -> tuple[nn.Module, list[tuple[torch.Tensor, ...]]]:
    model = seeded(SmallCNN).eval()
    generator = torch.Generator().manual_seed(0)
    return model, [(torch.rand(8, 1, 8, 8, generator=generator),) for _ in range(4)]


MODELS: dict[str, Callable[[], tuple[nn.Module, list[tuple[torch.Tensor, ...]]]]] = {
    "transformer": transformer,
    "cnn": cnn,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_each_lowered_node_is_within_one_step_of_the_reference(backend: str, name: str) -> None:
    model, inputs = MODELS[name]()
    reference, lowered = quantized(model, backend, inputs)
    held_out = inputs[-1]
    assert check_each_node(reference, lowered, held_out) >= (4 if name == "transformer" else 3)
    with torch.no_grad():
        want, out = reference(*held_out), lowered(*held_out)
    assert nn.functional.cosine_similarity(out.flatten(), want.flatten(), dim=0) > 0.9999


@pytest.mark.parametrize("backend", ["x86", "onednn", "fbgemm", "qnnpack"])
def test_an_int8_in_float_out_linear_leaves_its_output_float_and_says_so(backend: str) -> None:
    if backend not in fxquant.list_backends():
        pytest.skip(f"backend {backend!r} is not installed")
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)).eval()
    x = torch.randn(4, 8)
    reference, lowered = quantized(model, backend, [(x,)])
    after_linear = next(iter(reference.graph.find_nodes(op="call_module", target="0"))).users
    assert [u.target for u in after_linear] == ["1"]  # straight into the float LayerNorm
    entry = next(e for e in fxquant.explain(lowered, show=False).entries() if e.node == "_0")
    assert entry.pattern == "Linear (int8 in, float out)"
    assert str(entry.status) == "lowered"
    assert torch.allclose(lowered(x), reference(x), atol=1e-5)


@pytest.mark.parametrize("backend", ["x86", "onednn", "fbgemm", "qnnpack"])
def test_a_linear_feeding_an_int8_op_returns_int8_from_its_kernel(backend: str) -> None:
    """CNN speed: the consumer's quantize step is absorbed, so the chain stays integer."""
    if backend not in fxquant.list_backends():
        pytest.skip(f"backend {backend!r} is not installed")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(4, 8)
    reference, lowered = quantized(model, backend, [(x,)])
    outputs = _outputs(lowered, ["0"], (x,))
    assert outputs["0"].dtype == torch.uint8
    assert check_each_node(reference, lowered, (x,)) == 2


def _sqnr(signal: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = float((signal - approximation).pow(2).sum())
    return 10 * math.log10(float(signal.pow(2).sum()) / max(noise, 1e-30))


@pytest.mark.parametrize("backend", ["fbgemm", "qnnpack"])
def test_the_quint8_defaults_keep_a_transformers_residual_stream_float(backend: str) -> None:
    """fbgemm/qnnpack (#23): every Linear int8 in, float out; adds and LayerNorm float, and
    the explain report says why; closer to float than with those ops int8."""
    if backend not in fxquant.list_backends():
        pytest.skip(f"backend {backend!r} is not installed")
    from fxquant_quantized_engine import transformer_ops_int8

    model, inputs = transformer()
    config = fxquant.get_backend_config(backend)
    lowered = {}
    for name, mapping in (
        ("default", fxquant.get_default_qconfig_mapping(backend)),
        ("int8", transformer_ops_int8(fxquant.get_default_qconfig_mapping(backend))),
    ):
        prepared = fxquant.prepare_fx(
            copy.deepcopy(model), mapping, inputs[0], backend_config=config
        )
        with torch.no_grad():
            for x in inputs:
                prepared(*x)
        lowered[name] = fxquant.convert_fx(prepared, backend_config=config)
    entries = fxquant.explain(lowered["default"], show=False).entries()
    linears = [e for e in entries if e.pattern and e.pattern.startswith("Linear")]
    assert len(linears) == sum(isinstance(m, nn.Linear) for m in model.modules())
    assert {(e.pattern, str(e.status)) for e in linears} == {
        ("Linear (int8 in, float out)", "lowered")
    }
    kept_float = [e for e in entries if e.op != "placeholder" and str(e.status) == "float"]
    reasons = " ".join(str(e.reason) for e in kept_float)
    assert "LayerNorm" in reasons
    assert "add" in reasons
    with torch.no_grad():
        want = model(*inputs[-1])
        default, int8 = (_sqnr(want, lowered[k](*inputs[-1])) for k in ("default", "int8"))
    assert default > int8 + 3  # dB
