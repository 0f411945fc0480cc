"""convert_to_reference_fx: observers -> fxquant quantize/dequantize, weights -> reference modules.

The prepared models here are built by hand (trace, observers, node metadata as
docs/design.md fixes them), so these tests pin convert alone.
"""

from __future__ import annotations

import copy
import gc
import io
import operator
import weakref
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from fxquant.config.backend import BackendConfig, BackendPatternConfig, DTypeConfig
from fxquant.config.custom import PrepareCustomConfig
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import ConfigTypeError
from fxquant.flow.convert import convert_to_reference_fx
from fxquant.flow.report import NodeReport, Report
from fxquant.flow.state import META_KEY, FlowState, NodeInfo
from fxquant.nn import intrinsic, reference
from fxquant.nn import qat as nnqat
from fxquant.numerics import qdq
from fxquant.numerics.fake_quantize import FakeQuantize, default_weight_fake_quant
from fxquant.numerics.observer import (
    FixedQParamsObserver,
    MinMaxObserver,
    PerChannelMinMaxObserver,
    PerTokenObserver,
    PlaceholderObserver,
    default_per_channel_weight_observer,
    default_weight_observer,
)
from torch import fx, nn

OPS = torch.ops.fxquant
INT8 = DTypeConfig(
    input_dtype=torch.quint8,
    output_dtype=torch.quint8,
    weight_dtype=torch.qint8,
    bias_dtype=torch.float,
)
DYNAMIC = DTypeConfig(
    input_dtype=torch.quint8,
    output_dtype=torch.float,
    weight_dtype=torch.qint8,
    bias_dtype=torch.float,
    is_dynamic=True,
)
STATIC = QConfig(activation=MinMaxObserver, weight=default_weight_observer)
PER_CHANNEL = QConfig(activation=MinMaxObserver, weight=default_per_channel_weight_observer)

Observe = Callable[[], nn.Module]


def weighted_config(pattern: type, reference_cls: type | None, root: type) -> BackendPatternConfig:
    config = BackendPatternConfig(pattern).add_dtype_config(INT8).set_root_module(root)
    return config.set_reference_quantized_module(reference_cls) if reference_cls else config


LINEAR = weighted_config(nn.Linear, reference.Linear, nn.Linear)
CONV = weighted_config(nn.Conv2d, reference.Conv2d, nn.Conv2d)
ADD = BackendPatternConfig(operator.add).add_dtype_config(INT8)


class LeafTracer(fx.Tracer):
    """Keeps fxquant's fused and QAT modules as calls, as the quantization tracer does."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        leaf = type(m).__module__.startswith("fxquant.") or getattr(m, "leaf", False)
        return leaf or super().is_leaf_module(m, module_qualified_name)


def hand_prepare(  # a test helper that stands in for prepare_fx
    model: nn.Module,
    configs: dict[object, BackendPatternConfig],
    qconfig: QConfig | None = STATIC,
    *,
    observe_inputs: bool = True,
    activation: Observe | None = None,
    is_qat: bool = False,
) -> fx.GraphModule:
    """Trace ``model``; every node whose op is in ``configs`` is quantized with ``qconfig``.

    Observers go on the model inputs and on each quantized node's output, one per
    producer, named ``activation_post_process_N`` as prepare names them.
    """
    gm = fx.GraphModule(model, LeafTracer().trace(model))
    modules = dict(gm.named_modules())
    make = activation or (qconfig.activation if qconfig else MinMaxObserver)
    entries: list[NodeReport] = []
    count = 0

    def observe(node: fx.Node) -> None:
        nonlocal count
        name = f"activation_post_process_{count}"
        count += 1
        gm.add_submodule(name, make())
        with gm.graph.inserting_after(node):
            obs = gm.graph.call_module(name, (node,))
        node.replace_all_uses_with(obs, delete_user_cb=lambda user: user is not obs)

    def observe_edge(arg: fx.Node, user: fx.Node, build: Observe) -> None:
        nonlocal count
        name = f"activation_post_process_{count}"
        count += 1
        gm.add_submodule(name, build())
        with gm.graph.inserting_before(user):
            obs = gm.graph.call_module(name, (arg,))
        user.replace_input_with(arg, obs)

    for node in list(gm.graph.nodes):
        op = type(modules[node.target]) if node.op == "call_module" else node.target
        config = configs.get(op)
        info = NodeInfo(module_path="", module_type=None, source=None)
        if config is not None and qconfig is not None:
            info = NodeInfo(
                "", None, None, qconfig, config, config.dtype_configs[0], node.name, True
            )
            status = "quantized"
        else:
            status = "float"
        node.meta[META_KEY] = info
        entries.append(NodeReport(node.name, node.op, None, None, status))
        if status == "quantized":
            for arg in node.all_input_nodes:
                if str(arg.target).startswith("activation_post_process"):
                    continue
                if arg.op != "get_attr":
                    observe_edge(arg, node, make)
                elif "weight" in str(arg.target):  # functional weights: the weight observer
                    observe_edge(arg, node, qconfig.weight)  # type: ignore[union-attr]
        if (node.op == "placeholder" and observe_inputs) or status == "quantized":
            observe(node)
    gm.recompile()
    backend = BackendConfig("handmade").set_backend_pattern_configs(configs.values())
    report = Report(entries)
    gm.meta[META_KEY] = FlowState(backend, QConfigMapping(), is_qat, report, PrepareCustomConfig())
    return gm


def calibrate(gm: nn.Module, *inputs: torch.Tensor) -> None:
    with torch.no_grad():
        gm(*inputs)


def targets(gm: fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def quantized_mlp(qconfig: QConfig = STATIC) -> tuple[fx.GraphModule, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    gm = hand_prepare(Mlp().eval(), {nn.Linear: LINEAR}, qconfig)
    calibrate(gm, x)
    return gm, x


def test_observers_become_quantize_dequantize_pairs_with_literal_qparams() -> None:
    prepared, _ = quantized_mlp()
    scale, zero_point = prepared.activation_post_process_0.calculate_qparams()
    gm = convert_to_reference_fx(prepared)
    quantize = next(n for n in gm.graph.nodes if n.target == OPS.quantize_per_tensor.default)
    assert quantize.args[1:] == (float(scale), int(zero_point), 0, 255, torch.uint8)
    assert targets(gm).count(OPS.quantize_per_tensor.default) == 4
    assert targets(gm).count(OPS.dequantize_per_tensor.default) == 4
    assert not any("activation_post_process" in name for name, _ in gm.named_modules())


def test_weighted_modules_become_reference_modules_with_observed_weight_qparams() -> None:
    prepared, _ = quantized_mlp(PER_CHANNEL)
    gm = convert_to_reference_fx(prepared)
    assert type(gm.fc1) is reference.Linear
    observer = default_per_channel_weight_observer()
    observer(prepared.fc1.weight)
    scale, zero_point = observer.calculate_qparams()
    qparams = gm.fc1.get_weight_qparams()
    assert qparams["axis"] == 0
    assert torch.equal(qparams["scale"], scale.float())
    assert torch.equal(qparams["zero_point"].long(), zero_point.long())


def test_reference_model_agrees_with_simulated_quantization_within_one_step() -> None:
    prepared, x = quantized_mlp()
    gm = convert_to_reference_fx(prepared)
    out_scale, out_zp = prepared.activation_post_process_3.calculate_qparams()
    with torch.no_grad():
        expected = prepared(x)  # observers pass values through: the float model
        got = gm(x)
    # output quantized with its observer's qparams: within a few steps of the float result
    assert (got - expected).abs().max() <= 4 * float(out_scale) + 0.05
    q = qdq.quantize_per_tensor(got, float(out_scale), int(out_zp), 0, 255, torch.uint8)
    assert torch.equal(
        qdq.dequantize_per_tensor(q, float(out_scale), int(out_zp), 0, 255, torch.uint8), got
    )


def test_prepared_model_is_left_unchanged() -> None:
    prepared, x = quantized_mlp()
    before = prepared.code
    weight = prepared.fc1.weight.detach().clone()
    convert_to_reference_fx(prepared)
    assert prepared.code == before
    assert type(prepared.fc1) is nn.Linear
    assert torch.equal(prepared.fc1.weight, weight)
    calibrate(prepared, x)


def test_per_channel_observer_on_a_functional_weight_uses_buffers() -> None:
    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.weight)

    gm = fx.symbolic_trace(Functional())
    weight_node = next(n for n in gm.graph.nodes if n.op == "get_attr")
    gm.add_submodule(
        "activation_post_process_0",
        PerChannelMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_channel_symmetric),
    )
    with gm.graph.inserting_after(weight_node):
        obs = gm.graph.call_module("activation_post_process_0", (weight_node,))
    weight_node.replace_all_uses_with(obs, delete_user_cb=lambda user: user is not obs)
    gm.recompile()
    gm.meta[META_KEY] = FlowState(
        BackendConfig("b"), QConfigMapping(), False, Report(), PrepareCustomConfig()
    )
    # never calibrated: convert observes the weight itself, as torch.ao does
    ref = convert_to_reference_fx(gm)
    quantize = next(n for n in ref.graph.nodes if n.target == OPS.quantize_per_channel.default)
    assert [a.op for a in quantize.args[1:3]] == ["get_attr", "get_attr"]
    x = torch.randn(3, 8)
    step = float(ref.get_buffer(quantize.args[1].target).max())
    assert (ref(x) - F.linear(x, gm.weight)).abs().max() <= 8 * 0.5 * step * x.abs().max()


def test_dynamic_observer_chooses_qparams_at_run_time() -> None:
    dynamic = QConfig(
        activation=PlaceholderObserver.with_args(
            dtype=torch.quint8, quant_min=0, quant_max=255, is_dynamic=True
        ),
        weight=default_weight_observer,
    )
    config = weighted_config(nn.Linear, reference.Linear, nn.Linear).set_dtype_configs([DYNAMIC])
    prepared = hand_prepare(nn.Sequential(nn.Linear(8, 4)), {nn.Linear: config}, dynamic)
    gm = convert_to_reference_fx(prepared)
    found = targets(gm)
    assert OPS.choose_qparams_per_tensor.default in found
    assert OPS.quantize_per_tensor.tensor in found
    x = torch.randn(5, 8) * 10
    torch.set_grad_enabled(False)  # qdq.choose_qparams_per_tensor warns on grad tensors
    scale, zero_point = qdq.choose_qparams_per_tensor(x, 0, 255, torch.uint8)
    q = qdq.quantize_per_tensor(x, scale, zero_point, 0, 255, torch.uint8)
    xq = qdq.dequantize_per_tensor(q, scale, zero_point, 0, 255, torch.uint8)
    expected = F.linear(xq, gm.get_submodule("0").get_weight(), gm.get_submodule("0").bias)
    # the output observer is dynamic too: quantized again on the fly
    out_scale, out_zp = qdq.choose_qparams_per_tensor(expected, 0, 255, torch.uint8)
    expected = qdq.dequantize_per_tensor(
        qdq.quantize_per_tensor(expected, out_scale, out_zp, 0, 255, torch.uint8),
        out_scale,
        out_zp,
        0,
        255,
        torch.uint8,
    )
    assert torch.equal(gm(x), expected)
    torch.set_grad_enabled(True)


def test_a_per_token_observer_quantizes_each_row_at_run_time() -> None:
    """PerTokenObserver (#23): choose per token -> quantize -> dequantize, as ExecuTorch spells
    XNNPACK's dynamic fully-connected input, and the model computes exactly those steps."""
    per_token = QConfig(
        activation=PerTokenObserver.with_args(dtype=torch.int8),
        weight=default_per_channel_weight_observer,
    )
    dynamic = DTypeConfig(
        input_dtype=torch.int8,
        output_dtype=torch.float,
        weight_dtype=torch.qint8,
        bias_dtype=torch.float,
        is_dynamic=True,
    )
    config = weighted_config(nn.Linear, reference.Linear, nn.Linear).set_dtype_configs([dynamic])
    prepared = hand_prepare(
        nn.Sequential(nn.Linear(8, 4)), {nn.Linear: config}, per_token, observe_inputs=True
    )
    gm = convert_to_reference_fx(prepared)
    found = targets(gm)
    assert OPS.choose_qparams_per_token_asymmetric.default in found
    assert OPS.quantize_per_token.default in found
    assert OPS.dequantize_per_token.default in found
    assert OPS.choose_qparams_per_tensor.default not in found
    x = torch.randn(2, 5, 8) * torch.tensor([1.0, 1, 1, 1, 1, 1, 1, 50])  # an outlier channel
    with torch.no_grad():
        got = gm(x)

        def per_token_qdq(value: torch.Tensor) -> torch.Tensor:
            scales, zero_points = qdq.choose_qparams_per_token_asymmetric(value)
            q = qdq.quantize_per_token(value, scales, zero_points, -128, 127, torch.int8)
            return qdq.dequantize_per_token(q, scales, zero_points, -128, 127, torch.int8)

        linear = gm.get_submodule("0")
        expected = F.linear(per_token_qdq(x), linear.get_weight(), linear.bias)
    # hand_prepare observes the output too: per token again
    assert torch.equal(got, per_token_qdq(expected))


def test_float16_placeholder_becomes_a_cast_pair_and_float32_one_disappears() -> None:
    fp16 = PlaceholderObserver.with_args(dtype=torch.float16)
    prepared = hand_prepare(nn.Sequential(nn.ReLU()), {nn.ReLU: ADD}, STATIC, activation=fp16)
    gm = convert_to_reference_fx(prepared)
    casts = [n.args[1] for n in gm.graph.nodes if n.op == "call_method" and n.target == "to"]
    assert casts == [torch.float16, torch.float32, torch.float16, torch.float32]
    x = torch.tensor([0.1, 1e-4, 3.3333])
    assert torch.equal(gm(x), x.half().float())
    plain = hand_prepare(
        nn.Sequential(nn.ReLU()), {nn.ReLU: ADD}, STATIC, activation=PlaceholderObserver
    )
    assert "to" not in [n.target for n in convert_to_reference_fx(plain).graph.nodes]


def test_fixed_qparams_observer_keeps_its_fixed_qparams() -> None:
    fixed = FixedQParamsObserver.with_args(scale=1.0 / 256.0, zero_point=0)
    prepared = hand_prepare(
        nn.Sequential(nn.Sigmoid()), {nn.Sigmoid: ADD}, STATIC, activation=fixed
    )
    calibrate(prepared, torch.randn(4) * 100)
    gm = convert_to_reference_fx(prepared)
    quantize = [n for n in gm.graph.nodes if n.target == OPS.quantize_per_tensor.default]
    assert {n.args[1:3] for n in quantize} == {(1.0 / 256.0, 0)}


def test_unused_observer_is_removed() -> None:
    prepared, _ = quantized_mlp()
    prepared.add_submodule("activation_post_process_9", MinMaxObserver())
    output = next(n for n in prepared.graph.nodes if n.op == "output")
    with prepared.graph.inserting_before(output):
        prepared.graph.call_module("activation_post_process_9", (output.args[0],))
    prepared.recompile()
    gm = convert_to_reference_fx(prepared)
    assert not hasattr(gm, "activation_post_process_9")
    assert len([n for n in gm.graph.nodes if n.target == OPS.quantize_per_tensor.default]) == 4


def test_qat_modules_convert_with_their_own_weight_fake_quant() -> None:
    qconfig = QConfig(activation=FakeQuantize, weight=default_weight_fake_quant)
    qat_module = nnqat.Linear.from_float(_with_qconfig(nn.Linear(8, 4), qconfig))
    config = weighted_config(nnqat.Linear, reference.Linear, nn.Linear)
    prepared = hand_prepare(nn.Sequential(qat_module), {nnqat.Linear: config}, qconfig, is_qat=True)
    prepared.train()
    calibrate(prepared, torch.randn(16, 8))
    prepared.eval()
    fake_quant = prepared.get_submodule("0").weight_fake_quant
    fake_quant.disable_observer()
    scale, _ = fake_quant.calculate_qparams()
    gm = convert_to_reference_fx(prepared)
    module = gm.get_submodule("0")
    assert type(module) is reference.Linear
    assert torch.equal(
        module.get_weight_qparams()["scale"], scale.float().reshape(module.weight_scale.shape)
    )


def _with_qconfig(module: nn.Module, qconfig: QConfig) -> nn.Module:
    module.qconfig = qconfig  # type: ignore[assignment]
    return module


def test_unquantized_qat_module_still_becomes_float() -> None:
    qconfig = QConfig(activation=FakeQuantize, weight=default_weight_fake_quant)
    qat_module = nnqat.Linear.from_float(_with_qconfig(nn.Linear(8, 4), qconfig))
    prepared = hand_prepare(nn.Sequential(qat_module), {}, None, is_qat=True)
    gm = convert_to_reference_fx(prepared)
    assert type(gm.get_submodule("0")) is nn.Linear


def test_fused_module_keeps_its_container_with_a_reference_root() -> None:
    config = weighted_config(intrinsic.ConvReLU2d, reference.Conv2d, nn.Conv2d)
    model = nn.Sequential(intrinsic.ConvReLU2d(nn.Conv2d(3, 4, 3), nn.ReLU())).eval()
    prepared = hand_prepare(model, {intrinsic.ConvReLU2d: config}, PER_CHANNEL)
    x = torch.randn(2, 3, 8, 8)
    calibrate(prepared, x)
    gm = convert_to_reference_fx(prepared)
    fused = gm.get_submodule("0")
    assert type(fused) is intrinsic.ConvReLU2d
    assert type(fused[0]) is reference.Conv2d
    assert (gm(x) - model(x)).abs().max() < 0.1


def test_report_marks_quantized_nodes_reference() -> None:
    prepared, _ = quantized_mlp()
    gm = convert_to_reference_fx(prepared)
    statuses = {e.node: e.status for e in gm.meta[META_KEY].report.entries()}
    assert statuses["fc1"] == statuses["fc2"] == "reference"
    assert statuses["relu"] == "float"


def test_outputs_listed_as_quantized_return_integers() -> None:
    prepared, x = quantized_mlp()
    state = prepared.meta[META_KEY]
    custom = PrepareCustomConfig().set_output_quantized_indexes([0])
    prepared.meta[META_KEY] = FlowState(
        state.backend_config, state.qconfig_mapping, False, state.report, custom
    )
    out = convert_to_reference_fx(prepared)(x)
    assert out.dtype == torch.uint8


def test_convert_refuses_a_model_that_was_not_prepared() -> None:
    with pytest.raises(ConfigTypeError, match=r"expects a model returned by fxquant.prepare_fx"):
        convert_to_reference_fx(fx.symbolic_trace(Mlp()))


def test_reference_model_survives_state_dict_round_trip_and_torch_save() -> None:
    prepared, x = quantized_mlp(PER_CHANNEL)
    gm = convert_to_reference_fx(prepared)
    expected = gm(x)
    fresh = convert_to_reference_fx(quantized_mlp(PER_CHANNEL)[0])
    fresh.load_state_dict(gm.state_dict())
    assert torch.equal(fresh(x), expected)
    buffer = io.BytesIO()
    torch.save(gm, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(loaded(x), expected)


def test_convert_keeps_no_model_alive() -> None:
    prepared, _ = quantized_mlp()
    gm = convert_to_reference_fx(prepared)
    refs = [weakref.ref(prepared), weakref.ref(gm)]
    del prepared, gm
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_copy_of_reference_model_runs_the_same() -> None:
    prepared, x = quantized_mlp()
    gm = convert_to_reference_fx(prepared)
    assert torch.equal(copy.deepcopy(gm)(x), gm(x))


def test_qconfig_none_at_convert_keeps_that_node_float() -> None:
    prepared, x = quantized_mlp()
    mapping = QConfigMapping().set_global(STATIC).set_module_name("fc1", None)
    gm = convert_to_reference_fx(prepared, qconfig_mapping=mapping)
    assert type(gm.fc1) is nn.Linear
    assert type(gm.fc2) is reference.Linear
    # the observers around fc1 (input x, output into the float relu) are gone
    assert targets(gm).count(OPS.quantize_per_tensor.default) == 2
    entry = gm.meta[META_KEY].report.entry("fc1")
    assert (entry.status, entry.reason.code) == ("skipped", "qconfig_none")
    gm.fc1.weight.data.zero_()
    assert prepared.fc1.weight.abs().sum() > 0  # not shared with the prepared model
    assert gm(x).shape == (32, 4)


def test_values_beyond_calibration_saturate_at_the_dtype_bound_not_the_observer_bound() -> None:
    # torch.ao's default observer chooses qparams for 0..127 (reduce_range); its reference
    # model, like the 8-bit kernels, still stores 0..255
    half = MinMaxObserver.with_args(quant_min=0, quant_max=127)
    prepared = hand_prepare(nn.Sequential(nn.ReLU()), {nn.ReLU: ADD}, STATIC, activation=half)
    calibrate(prepared, torch.tensor([0.0, 1.27]))
    gm = convert_to_reference_fx(prepared)
    quantize = next(n for n in gm.graph.nodes if n.target == OPS.quantize_per_tensor.default)
    assert quantize.args[1:] == (pytest.approx(0.01), 0, 0, 255, torch.uint8)
    assert gm(torch.tensor([2.0])).item() == pytest.approx(2.0)


class ObservedDouble(nn.Module):
    leaf = True  # a custom module: kept as a call by the tracer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class QuantizedDouble(nn.Module):
    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        self.source = type(source).__name__

    @classmethod
    def from_observed(cls, observed: nn.Module) -> QuantizedDouble:
        return cls(observed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


def test_custom_modules_are_swapped_with_from_observed() -> None:
    from fxquant.config.custom import ConvertCustomConfig

    prepared = hand_prepare(nn.Sequential(ObservedDouble()), {}, None)
    config = ConvertCustomConfig().set_observed_to_quantized_mapping(
        ObservedDouble, QuantizedDouble
    )
    gm = convert_to_reference_fx(prepared, convert_custom_config=config)
    assert type(gm.get_submodule("0")) is QuantizedDouble
    assert gm.get_submodule("0").source == "ObservedDouble"
    bad = ConvertCustomConfig().set_observed_to_quantized_mapping(ObservedDouble, nn.ReLU)
    with pytest.raises(ConfigTypeError, match=r"has no from_observed\(observed_module\)"):
        convert_to_reference_fx(prepared, convert_custom_config=bad)
