"""convert_fx lowers reference patterns with a backend's LoweringRules.

``testint8`` is a backend defined here, registered like any plugin: the shared
pattern builders for its patterns, and kernels that compute linear, conv and
add in integer arithmetic on plain int tensors.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.config.backend import BackendPatternConfig
from fxquant.errors import ConfigTypeError, QuantizationSkipped
from fxquant.flow.context import FlowContext
from fxquant.flow.convert import convert_fx, convert_to_reference_fx
from fxquant.flow.state import META_KEY
from fxquant.lowering import Declined
from fxquant.lowering.kernels import boundary
from fxquant.nn import reference
from fxquant.numerics.observer import MinMaxObserver
from fxquant.patterns import conv_configs, linear_configs
from fxquant.registry import Deployment, LoweringRule, hookimpl
from fxquant.registry.hookspecs import LoweringMatch, QParams
from fxquant.registry.resolution import ResolvedBackend
from torch import fx, nn

from tests.flow.test_convert import ADD, INT8, PER_CHANNEL, STATIC, calibrate, hand_prepare

OPS = torch.ops.fxquant
BACKEND = "testint8"


def context(backend: str, *rules: LoweringRule) -> FlowContext:
    """The convert context of a backend lowering with ``rules`` (whatever the registry holds)."""
    return FlowContext.for_convert(
        ResolvedBackend(fxquant.BackendConfig(backend), lowering_rules=rules), strict=False
    )


def requantize(acc: torch.Tensor, scale: torch.Tensor | float, out: QParams) -> torch.Tensor:
    """int accumulator * scale -> the output's integers (round half to even, clamp)."""
    assert out.scale is not None
    assert out.zero_point is not None
    y = torch.round(acc.to(torch.float64) * scale / out.scale) + out.zero_point
    return y.clamp(out.quant_min, out.quant_max).to(out.dtype)


def centered(q: torch.Tensor, zero_point: Any) -> torch.Tensor:
    return q.to(torch.int32) - torch.as_tensor(zero_point).to(torch.int32)


def weight_parts(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The integer weight minus its zero points, and the scales shaped per output channel."""
    qparams = module.get_weight_qparams()
    weight = module.get_quantized_weight()
    scale = qparams["scale"].to(torch.float64).reshape(-1)
    zero_point = qparams["zero_point"].to(torch.int32).reshape(-1)
    shape = [-1] + [1] * (weight.dim() - 1)
    if zero_point.numel() > 1:
        zero_point = zero_point.reshape(shape)
    return weight.to(torch.int32) - zero_point, scale, zero_point


class QLinear(nn.Module):
    """uint8 x int8 -> int32 accumulation (torch.mm on int32) -> uint8."""

    def __init__(self, match: LoweringMatch) -> None:
        super().__init__()
        module = match.module
        assert module is not None
        weight, scale, _ = weight_parts(module)
        self.register_buffer("weight_t", weight.t().contiguous())
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if module.bias is None else module.bias.detach().double())
        self.x, self.out = match.inputs[0], match.output

    def forward(self, qx: torch.Tensor) -> torch.Tensor:
        assert self.x is not None
        assert self.out is not None
        acc = torch.mm(centered(qx, self.x.zero_point).reshape(-1, qx.shape[-1]), self.weight_t)
        y = acc.to(torch.float64) * (self.x.scale * self.scale)
        if self.bias is not None:
            y = y + self.bias
        q = requantize(y, 1.0, self.out)
        return q.reshape(*qx.shape[:-1], -1)


class QConv2d(nn.Module):
    """Integer conv: int32 values convolved in float64, which is exact for 8-bit inputs."""

    def __init__(self, match: LoweringMatch) -> None:
        super().__init__()
        module = match.module
        assert module is not None
        weight, scale, _ = weight_parts(module)
        self.register_buffer("weight", weight.to(torch.float64))
        self.register_buffer("scale", scale.reshape(1, -1, 1, 1))
        bias = None if module.bias is None else module.bias.detach().double().reshape(1, -1, 1, 1)
        self.register_buffer("bias", bias)
        self.args = (module.stride, module.padding, module.dilation, module.groups)
        self.x, self.out = match.inputs[0], match.output

    def forward(self, qx: torch.Tensor) -> torch.Tensor:
        assert self.x is not None
        assert self.out is not None
        x = centered(qx, self.x.zero_point).to(torch.float64)
        acc = F.conv2d(x, self.weight, None, *self.args)
        y = acc * (self.x.scale * self.scale)
        if self.bias is not None:
            y = y + self.bias
        return requantize(y, 1.0, self.out)


class QAdd(nn.Module):
    """Add of two quantized tensors, requantized to the output's qparams."""

    def __init__(self, match: LoweringMatch) -> None:
        super().__init__()
        self.a, self.b, self.out = match.inputs[0], match.inputs[1], match.output

    def forward(self, qa: torch.Tensor, qb: torch.Tensor) -> torch.Tensor:
        assert self.a is not None
        assert self.b is not None
        assert self.out is not None
        a = centered(qa, self.a.zero_point).to(torch.float64) * self.a.scale
        b = centered(qb, self.b.zero_point).to(torch.float64) * self.b.scale
        return requantize(a + b, 1.0, self.out)


def build_static(kernel: type[nn.Module]) -> Any:
    def build(match: LoweringMatch) -> nn.Module | None:
        static = match.output is not None and all(
            q is not None and not q.is_dynamic for q in match.inputs
        )
        return kernel(match) if static else None

    return build


class TestInt8Plugin:
    """The backend's plugin: shared pattern builders plus three lowering rules."""

    @hookimpl
    def fxquant_pattern_configs(self, backend: str) -> list[BackendPatternConfig] | None:
        if backend != BACKEND:
            return None
        configs = linear_configs([INT8]) + conv_configs([INT8], dims=(2,), transpose=False)
        return [*configs, BackendPatternConfig(operator.add).add_dtype_config(INT8)]

    @hookimpl
    def fxquant_lowering_kernels(self, backend: str) -> list[LoweringRule] | None:
        if backend != BACKEND:
            return None
        return [
            LoweringRule(reference.Linear, build=build_static(QLinear), name="qlinear"),
            LoweringRule(reference.Conv2d, build=build_static(QConv2d), name="qconv2d"),
            LoweringRule(operator.add, build=build_static(QAdd), name="qadd"),
        ]


@pytest.fixture
def testint8() -> Iterator[fxquant.BackendConfig]:
    plugin = TestInt8Plugin()
    fxquant.register_plugin(plugin, backend=BACKEND)
    try:
        yield fxquant.get_backend_config(BACKEND)
    finally:
        fxquant.unregister_plugin(plugin)


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(3, 4, 1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x) + self.conv2(x)
        return self.fc(y.mean((2, 3)))


def prepared_residual(backend: fxquant.BackendConfig) -> tuple[fx.GraphModule, torch.Tensor]:
    torch.manual_seed(0)
    configs = {
        c.pattern: c for c in backend.configs if c.pattern in (nn.Conv2d, nn.Linear, operator.add)
    }
    gm = hand_prepare(Residual().eval(), configs, PER_CHANNEL)
    gm.meta[META_KEY] = _renamed(gm.meta[META_KEY], backend)
    x = torch.randn(4, 3, 8, 8)
    calibrate(gm, x)
    return gm, x


def _renamed(state: Any, backend: fxquant.BackendConfig) -> Any:
    import dataclasses

    return dataclasses.replace(state, backend_config=backend)


def kernels(gm: fx.GraphModule) -> list[str]:
    modules = dict(gm.named_modules())
    return [type(modules[n.target]).__name__ for n in gm.graph.nodes if n.op == "call_module"]


def test_lowered_model_runs_integer_kernels_between_float_boundaries(testint8: Any) -> None:
    prepared, _ = prepared_residual(testint8)
    gm = convert_fx(prepared)
    assert kernels(gm) == ["QConv2d", "QConv2d", "QAdd", "QLinear"]
    found = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    # the float32 boundary quantize at the float input and after the float mean
    assert found.count(boundary.quantize_per_tensor) == 2
    assert OPS.quantize_per_tensor.default not in found
    assert found.count(OPS.dequantize_per_tensor.default) == 2
    assert isinstance(gm.conv1, QConv2d)


def test_lowered_model_matches_reference_model_within_one_step(testint8: Any) -> None:
    prepared, x = prepared_residual(testint8)
    lowered, ref = convert_fx(prepared), convert_to_reference_fx(prepared)
    scale, _ = prepared.activation_post_process_5.calculate_qparams()
    with torch.no_grad():
        difference = (lowered(x) - ref(x)).abs().max()
    assert difference <= float(scale) * 1.001


def test_kernel_receives_integer_tensors(testint8: Any) -> None:
    prepared, x = prepared_residual(testint8)
    gm = convert_fx(prepared)
    seen: list[torch.dtype] = []
    gm.fc.register_forward_hook(lambda m, args, out: seen.extend([args[0].dtype, out.dtype]))
    gm(x)
    assert seen == [torch.uint8, torch.uint8]


def test_lowering_match_carries_input_and_output_qparams(testint8: Any) -> None:
    prepared, _ = prepared_residual(testint8)
    received: list[LoweringMatch] = []
    rule = LoweringRule(operator.add, build=lambda m: received.append(m), name="spy")
    from fxquant.flow.lower import lower
    from fxquant.flow.report import Report

    ref = convert_to_reference_fx(prepared)
    lower(ref, context(BACKEND, rule), Report())
    (match,) = received
    scale, zero_point = prepared.activation_post_process_3.calculate_qparams()
    assert match.output == QParams(torch.uint8, 0, 255, float(scale), int(zero_point))
    assert [q.scale for q in match.inputs] == [
        float(prepared.get_submodule(f"activation_post_process_{i}").calculate_qparams()[0])
        for i in (1, 2)
    ]
    assert [n.name for n in match.nodes] == ["add"]
    assert match.modules == (None,)


def test_pattern_without_a_rule_stays_reference_and_is_reported(testint8: Any) -> None:
    prepared, x = prepared_residual(testint8)
    gm = convert_fx(prepared, backend_config=fxquant.BackendConfig("no_kernels"))
    assert "QAdd" not in kernels(gm)
    entry = gm.meta[META_KEY].report.entry("add")
    assert entry.status == "reference"
    assert entry.reason.code == "no_lowering_kernel"
    assert entry.reason.words == (
        "no lowering rule in backend 'no_kernels' for operator.add; it stays in reference form"
    )
    assert torch.equal(gm(x), convert_to_reference_fx(prepared)(x))


def test_report_marks_lowered_nodes(testint8: Any) -> None:
    prepared, _ = prepared_residual(testint8)
    report = convert_fx(prepared).meta[META_KEY].report
    statuses = {e.node: e.status for e in report.entries()}
    assert [statuses[n] for n in ("conv1", "conv2", "add", "fc")] == ["lowered"] * 4
    assert report.skipped() == []


def test_strict_convert_raises_for_unlowered_patterns(testint8: Any) -> None:
    prepared, _ = prepared_residual(testint8)
    with pytest.raises(QuantizationSkipped, match=r"add: \[no_lowering_kernel\]") as info:
        convert_fx(prepared, backend_config=fxquant.BackendConfig("no_kernels"), strict=True)
    assert {e.node for e in info.value.skipped} == {"conv1", "conv2", "add", "fc"}
    convert_fx(prepared, strict=True)


def test_a_declining_rule_leaves_the_pattern_in_reference_form() -> None:
    prepared = hand_prepare(
        nn.Sequential(nn.ReLU()), {nn.ReLU: ADD}, STATIC, activation=MinMaxObserver
    )
    calibrate(prepared, torch.randn(8))
    from fxquant.flow.lower import lower

    ref = convert_to_reference_fx(prepared)
    before = ref.code
    rule = LoweringRule(nn.ReLU, build=lambda m: None, name="no")
    report = lower(ref, context("x", rule), ref.meta[META_KEY].report)
    ref.recompile()
    assert ref.code == before
    assert report.entry("_0").reason.code == "no_lowering_kernel"
    # not "no rule": the rule exists and declined, without saying why (#22)
    assert report.entry("_0").reason.words == (
        "lowering rule no declined: its build returned None, without a reason; "
        "it stays in reference form"
    )


def test_a_rule_declining_with_a_reason_leaves_reference_form_and_the_report_says_why() -> None:
    prepared = hand_prepare(
        nn.Sequential(nn.ReLU()), {nn.ReLU: ADD}, STATIC, activation=MinMaxObserver
    )
    calibrate(prepared, torch.randn(8))
    from fxquant.flow.lower import lower

    ref = convert_to_reference_fx(prepared)
    before = ref.code
    why = "the kernel saturates on this CPU; quantize the weights to -63..63"
    rule = LoweringRule(nn.ReLU, build=lambda m: Declined(why), name="no")
    report = lower(ref, context("x", rule), ref.meta[META_KEY].report)
    ref.recompile()
    assert ref.code == before
    entry = report.entry("_0")
    assert (entry.status, entry.reason.code) == ("reference", "no_lowering_kernel")
    # the rule's name and its words, not "no lowering rule" (#22)
    assert entry.reason.words == f"lowering rule no declined: {why}; it stays in reference form"


def test_functional_linear_weight_is_quantized_once_into_an_integer_buffer() -> None:
    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 8))
            self.bias = nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.weight, self.bias)

    seen: list[LoweringMatch] = []

    def build(match: LoweringMatch) -> Any:
        seen.append(match)
        return lambda qx, qw, bias: F.linear(qx.float(), qw.float(), bias)

    prepared = hand_prepare(Functional(), {F.linear: ADD}, PER_CHANNEL)
    calibrate(prepared, torch.randn(3, 8))
    from fxquant.flow.lower import lower

    ref = convert_to_reference_fx(prepared)
    rule = LoweringRule(F.linear, build=build, name="flinear")
    lower(ref, context("x", rule), ref.meta[META_KEY].report)
    ref.recompile()
    (match,) = seen
    assert [q is None for q in match.inputs] == [False, False, True]
    assert match.inputs[1].is_per_channel
    buffers = {name: b.dtype for name, b in ref.named_buffers()}
    assert torch.int8 in buffers.values()
    assert OPS.quantize_per_channel.default not in [n.target for n in ref.graph.nodes]


def test_lowering_keeps_no_model_alive(testint8: Any) -> None:
    import gc
    import weakref

    prepared, x = prepared_residual(testint8)
    lowered = convert_fx(prepared)
    lowered(x)
    refs = [weakref.ref(prepared), weakref.ref(lowered)]
    del prepared, lowered
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_a_module_called_twice_gets_one_kernel_per_call(testint8: Any) -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.fc(x) * 3)

    config = next(c for c in testint8.configs if c.pattern is nn.Linear)
    torch.manual_seed(0)
    prepared = hand_prepare(Twice().eval(), {nn.Linear: config}, PER_CHANNEL)
    prepared.meta[META_KEY] = _renamed(prepared.meta[META_KEY], testint8)
    x = torch.randn(8, 4)
    calibrate(prepared, x)
    lowered, ref = convert_fx(prepared), convert_to_reference_fx(prepared)
    assert kernels(lowered) == ["QLinear", "QLinear"]
    targets = [n.target for n in lowered.graph.nodes if n.op == "call_module"]
    assert len(set(targets)) == 2
    scale = float(prepared.activation_post_process_3.calculate_qparams()[0])
    with torch.no_grad():
        assert (lowered(x) - ref(x)).abs().max() <= scale * 1.001


class DeployedPlugin:
    """A backend with the test patterns, no lowering rules, and a deployment."""

    @hookimpl
    def fxquant_pattern_configs(self, backend: str) -> list[BackendPatternConfig] | None:
        return TestInt8Plugin().fxquant_pattern_configs(BACKEND) if backend == "deployed" else None

    @hookimpl
    def fxquant_deployment(self, backend: str) -> Deployment | None:
        if backend != "deployed":
            return None
        return Deployment("toy runtime", deploy=lambda model, inputs: model)


def test_a_deployed_backend_keeps_the_reference_form_without_a_no_kernel_reason() -> None:
    plugin = DeployedPlugin()
    fxquant.register_plugin(plugin, backend="deployed")
    try:
        gm, x = prepared_residual(fxquant.get_backend_config("deployed"))
        converted = convert_fx(gm, strict=True)  # nothing is skipped: the runtime takes it all
    finally:
        fxquant.unregister_plugin(plugin)
    entries = fxquant.explain(converted, show=False).entries()
    quantized = [e for e in entries if e.status == "reference"]
    assert {e.node for e in quantized} == {"conv1", "conv2", "add", "fc"}
    assert all(e.reason is None for e in quantized)
    assert torch.equal(converted(x), convert_to_reference_fx(gm)(x))


def test_lower_reads_its_rules_from_the_flow_context_never_from_the_registry(
    testint8: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared, x = prepared_residual(testint8)
    reference_model = convert_to_reference_fx(prepared)
    ctx = FlowContext.for_convert(resolve(testint8), strict=False)
    expected = convert_fx(prepared)(x)
    from fxquant.flow.lower import lower

    def no_registry() -> None:
        msg = "lower() asked the registry"
        raise AssertionError(msg)

    monkeypatch.setattr(fxquant.registry, "default_registry", no_registry)
    report = lower(reference_model, ctx, reference_model.meta[META_KEY].report)
    assert {e.node for e in report.entries() if e.status == "lowered"} == {
        "conv1",
        "conv2",
        "add",
        "fc",
    }
    reference_model.recompile()
    assert torch.equal(reference_model(x), expected)


def resolve(config: fxquant.BackendConfig) -> ResolvedBackend:
    return fxquant.registry.default_registry().resolve(config, "convert_fx")


def test_the_entry_point_resolves_the_kernels_the_backends_plugins_lower_with(
    testint8: Any,
) -> None:
    kernels = resolve(testint8)
    assert [r.name for r in kernels.lowering_rules] == [
        r.name for r in TestInt8Plugin().fxquant_lowering_kernels(BACKEND) or []
    ]
    assert not kernels.deployed
    assert len(kernels.sources) == 1
    assert "register_plugin" not in kernels.sources[0]
    nobody = resolve(fxquant.BackendConfig("nobody"))
    assert (nobody.lowering_rules, nobody.deployed, nobody.sources) == ((), False, ())


def test_the_convert_context_holds_only_what_it_is_given(testint8: Any) -> None:
    # a bare config named after a backend with kernels: the context looks nothing up
    ctx = FlowContext.for_convert(testint8, strict=True)
    assert (ctx.lowering_rules, ctx.deployed, ctx.strict) == ((), False, True)


def test_convert_fx_says_whose_kernels_the_backend_name_resolved_to(testint8: Any) -> None:
    prepared, _ = prepared_residual(testint8)
    report = fxquant.explain(convert_fx(prepared), show=False)
    (note,) = [n for n in report.notes() if n.startswith("kernels:")]
    source = resolve(testint8).sources[0]
    assert (
        note
        == f"kernels: backend {BACKEND!r} (by the config's name) -> 3 lowering rules from {source}"
    )
    assert note in report.table()


def test_a_config_read_from_json_lowers_with_the_kernels_of_the_backend_it_names(
    testint8: Any,
) -> None:
    # CONTRACT: kernels by backend_config.name, so a JSON round trip keeps them
    prepared, x = prepared_residual(testint8)
    from_json = fxquant.BackendConfig.from_json(testint8.to_json())
    lowered = convert_fx(prepared, backend_config=from_json)
    assert kernels(lowered) == ["QConv2d", "QConv2d", "QAdd", "QLinear"]
    assert torch.equal(lowered(x), convert_fx(prepared)(x))


def test_a_config_named_after_no_backend_lowers_nothing_and_says_why(testint8: Any) -> None:
    prepared, _ = prepared_residual(testint8)
    renamed = fxquant.BackendConfig.from_dict({**testint8.to_dict(), "name": "mine"})
    report = fxquant.explain(convert_fx(prepared, backend_config=renamed), show=False)
    assert {e.reason.code for e in report.entries() if e.status == "reference" and e.reason} == {
        "no_lowering_kernel"
    }
    assert [n for n in report.notes() if n.startswith("kernels:")] == [
        "kernels: no installed plugin provides backend 'mine': no lowering rules (a config "
        "lowers with the kernels of the backend it is named after)"
    ]


def test_convert_fx_names_a_backend_config_of_the_wrong_type(testint8: Any) -> None:
    prepared, _ = prepared_residual(testint8)
    with pytest.raises(ConfigTypeError, match=r"^backend_config must be a fxquant.BackendConfig"):
        convert_fx(prepared, backend_config=BACKEND)  # type: ignore[arg-type]
