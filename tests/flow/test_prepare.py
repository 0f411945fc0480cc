from __future__ import annotations

import copy
import operator

import fxquant
import pytest
import torch
from fxquant.errors import QuantizationSkipped
from fxquant.flow import explain, prepare_fx, prepare_qat_fx
from fxquant.numerics.observer import FixedQParamsObserver, MinMaxObserver, PlaceholderObserver
from torch import fx, nn

torch.set_num_threads(1)


REF = fxquant.get_backend_config("reference")
"""What these tests observe: the generic patterns (``backend_config=None`` is the host's
native backend, whose patterns differ: x86 ends a model on a Linear's float output)."""


def mapping(is_qat: bool = False) -> fxquant.QConfigMapping:
    return fxquant.get_default_qconfig_mapping("reference", is_qat=is_qat)


def ops(gm: fx.GraphModule) -> list[str]:
    """Observers as 'obs', modules by class name, functions by name."""
    result = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            target = str(node.target)
            name = "obs" if target.startswith("activation_post_process") else None
            result.append(name or type(gm.get_submodule(target)).__name__)
        elif node.op in ("call_function", "call_method"):
            result.append(getattr(node.target, "__name__", str(node.target)))
    return result


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


def test_linear_gets_an_input_and_an_output_observer() -> None:
    gm = prepare_fx(
        nn.Sequential(nn.Linear(4, 4)).eval(), mapping(), (torch.randn(1, 4),), backend_config=REF
    )
    assert ops(gm) == ["obs", "Linear", "obs"]


def test_conv_bn_relu_is_fused_and_observed_once_on_each_side() -> None:
    gm = prepare_fx(ConvBnRelu().eval(), mapping(), (torch.randn(1, 3, 8, 8),))
    assert ops(gm) == ["obs", "ConvReLU2d", "obs"]


def test_add_of_two_quantized_ops_needs_no_second_observer_between_them() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x) + self.b(x)

    gm = prepare_fx(M().eval(), mapping(), (torch.randn(1, 4),))
    assert ops(gm) == ["obs", "Linear", "obs", "Linear", "obs", "add", "obs"]


def test_cat_shares_one_observer_instance_with_its_inputs() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, y], 1)

    gm = prepare_fx(M().eval(), mapping(), (torch.randn(1, 2), torch.randn(1, 2)))
    observers = {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}
    assert ops(gm) == ["obs", "obs", "cat", "obs"]
    assert len(observers) == 1


def test_sigmoid_output_gets_the_fixed_qparams_observer() -> None:
    gm = prepare_fx(nn.Sequential(nn.Sigmoid()).eval(), mapping(), (torch.randn(1, 4),))
    last = [n for n in gm.graph.nodes if n.op == "call_module"][-1]
    observer = gm.get_submodule(str(last.target))
    assert isinstance(observer, FixedQParamsObserver)
    assert float(observer.scale) == 1 / 256


def test_dynamic_linear_observes_only_its_input_with_a_dynamic_placeholder() -> None:
    dynamic = fxquant.QConfig(
        activation=PlaceholderObserver.with_args(dtype=torch.quint8, is_dynamic=True),
        weight=fxquant.observer.default_weight_observer,
    )
    qmap = fxquant.QConfigMapping().set_object_type(nn.Linear, dynamic)
    gm = prepare_fx(nn.Sequential(nn.Linear(4, 4)).eval(), qmap, (torch.randn(1, 4),))
    assert ops(gm) == ["obs", "Linear"]
    observer = gm.get_submodule("activation_post_process_0")
    assert observer.is_dynamic
    assert explain(gm, show=False).entry("_0").status == "quantized"  # type: ignore[union-attr]


def test_qat_swaps_conv_bn_relu_to_its_qat_module_with_fake_quant() -> None:
    gm = prepare_qat_fx(ConvBnRelu().train(), mapping(True), (torch.randn(1, 3, 8, 8),))
    assert ops(gm) == ["obs", "ConvBnReLU2d", "obs"]
    assert type(gm.get_submodule("conv")).__module__ == "fxquant.nn.intrinsic.qat"
    assert isinstance(
        gm.get_submodule("activation_post_process_0"), fxquant.fake_quantize.FakeQuantize
    )


def test_prepare_leaves_the_users_model_unmodified() -> None:
    model = ConvBnRelu().eval()
    before = copy.deepcopy(model.state_dict())
    gm = prepare_fx(model, mapping(), (torch.randn(1, 3, 8, 8),))
    gm(torch.randn(2, 3, 8, 8))
    assert type(model.conv) is nn.Conv2d
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_shape_arguments_and_sizes_never_get_observers() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t = x.size(0), x.size(1) * 2
            return torch.relu(x).view(b, t // 2, -1)

    gm = prepare_fx(M().eval(), mapping(), (torch.randn(2, 3, 4),))
    for node in gm.graph.nodes:
        if node.op == "call_module":
            assert node.args[0].op in ("placeholder", "call_function", "call_method")
            assert node.args[0].target not in ("size", "mul", "floordiv")
    gm(torch.randn(2, 3, 4))  # calibration must not crash on a torch.Size


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        additive = (1.0 - mask[:, None, :].float()) * -10000.0
        scores = torch.matmul(self.q(x), self.k(x).transpose(-1, -2)) + additive
        return torch.matmul(torch.softmax(scores, -1), x)


def _calibrated_ranges(x: torch.Tensor, mask: torch.Tensor) -> list[float]:
    gm = prepare_fx(Attention().eval(), mapping(), (x, mask))
    gm(x, mask)
    return [
        float(m.min_val)
        for m in gm.modules()
        if isinstance(m, MinMaxObserver) and m.min_val.numel() == 1
    ]


def test_a_padded_batch_calibrates_the_same_ranges_as_an_unpadded_one() -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 5, 8)
    full = torch.ones(2, 5, dtype=torch.long)
    padded = full.clone()
    padded[:, 3:] = 0
    plain, masked = _calibrated_ranges(x, full), _calibrated_ranges(x, padded)
    assert min(masked) > -100  # no -1e4 from the mask reached any observer
    assert len(plain) == len(masked)


def test_additive_mask_nodes_are_reported_with_their_reason() -> None:
    x, mask = torch.randn(2, 5, 8), torch.ones(2, 5, dtype=torch.long)
    report = explain(prepare_fx(Attention().eval(), mapping(), (x, mask)), show=False)
    codes = {e.node: e.reason.code for e in report.entries() if e.reason}
    assert codes["add"] == "additive_mask"
    assert codes["softmax"] == "additive_mask"


def test_unsupported_qconfig_is_skipped_with_a_reason_naming_the_bound() -> None:
    narrow = fxquant.BackendConfig("narrow").set_backend_pattern_config(
        fxquant.BackendPatternConfig(nn.Linear).add_dtype_config(
            fxquant.DTypeConfig(
                input_dtype=fxquant.DTypeWithConstraints(torch.quint8, 0, 127),
                output_dtype=fxquant.DTypeWithConstraints(torch.quint8, 0, 127),
                weight_dtype=torch.qint8,
                bias_dtype=torch.float,
            )
        )
    )
    wide = fxquant.QConfig(
        activation=MinMaxObserver.with_args(quant_min=0, quant_max=255),
        weight=fxquant.observer.default_weight_observer,
    )
    qmap = fxquant.QConfigMapping().set_global(wide)
    gm = prepare_fx(
        nn.Sequential(nn.Linear(4, 4)).eval(), qmap, (torch.randn(1, 4),), None, None, narrow
    )
    (entry,) = explain(gm, show=False).skipped()
    assert entry.reason is not None
    assert (entry.reason.code, entry.reason.field, entry.reason.bound) == (
        "quant_range",
        "quant_max_upper_bound",
        127,
    )
    assert "quant_max 255 exceeds the backend bound 127" in entry.reason.words
    assert "give the activation observer quant_min=0, quant_max=127" in entry.reason.words
    assert ops(gm) == ["Linear"]


def test_a_weight_range_refusal_says_the_fix_and_following_it_quantizes_the_layer() -> None:
    # torch.ao's default weight observer (-128..127) against a backend taking -127..127: the
    # reason must tell the user what to pass, and what it says must work
    from fxquant.numerics.observer import default_weight_observer

    if "executorch" not in fxquant.list_backends():
        pytest.skip("the executorch plugin is not installed")
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    example = (torch.randn(2, 8),)
    mapping = fxquant.get_default_qconfig_mapping("executorch")
    activation = mapping.global_qconfig.activation
    mapping.set_object_type(nn.Linear, fxquant.QConfig(activation, default_weight_observer))
    backend = fxquant.get_backend_config("executorch")
    refused = explain(prepare_fx(model, mapping, example, backend_config=backend), show=False)
    words = {entry.reason.words for entry in refused.skipped() if entry.reason is not None}
    # every bound the observer breaks, in one fix (not one round trip per bound)
    hint = "`.with_args(quant_min=-127, quant_max=127, eps=0.000244140625, ...)`"
    assert any(hint in w for w in words), words

    fixed = default_weight_observer.with_args(quant_min=-127, quant_max=127, eps=0.000244140625)
    mapping.set_object_type(nn.Linear, fxquant.QConfig(activation, fixed))
    prepared = prepare_fx(model, mapping, example, backend_config=backend)
    assert not [e for e in explain(prepared, show=False).skipped() if "weight" in str(e.reason)]


def test_strict_mode_lists_every_skipped_node() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(x) + torch.erf(x)

    with pytest.raises(QuantizationSkipped, match=r"exp: \[no_pattern\]") as info:
        prepare_fx(M().eval(), mapping(), (torch.randn(2),), strict=True)
    assert [e.node for e in info.value.skipped] == ["exp", "erf"]  # type: ignore[attr-defined]


def test_unused_module_name_entry_is_reported_and_strict_raises() -> None:
    qmap = mapping().set_module_name("encoder.typo", None)
    model = nn.Sequential(nn.Linear(2, 2)).eval()
    gm = prepare_fx(model, qmap, (torch.randn(1, 2),))
    (unused,) = explain(gm, show=False).unused()
    assert unused.code == "unused_qconfig_entry"
    assert "'encoder.typo'" in unused.words
    with pytest.raises(QuantizationSkipped, match=r"encoder\.typo"):
        prepare_fx(model, qmap, (torch.randn(1, 2),), strict=True)


def test_qconfig_none_leaves_a_node_in_float_without_strict_error() -> None:
    qmap = mapping().set_object_type(nn.ReLU, None)
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU()).eval()
    qmap.set_object_type(nn.Linear, None)
    gm = prepare_fx(model, qmap, (torch.randn(1, 2),), strict=True)
    assert ops(gm) == ["LinearReLU"]  # one qconfig (None): fused, never observed


def test_same_nodes_observed_as_torch_ao(ao: object) -> None:
    from tests import oracle

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = ConvBnRelu()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.block(x)
            y = torch.nn.functional.max_pool2d(y, 2) + 1.0
            y = torch.flatten(torch.mean(y, (2, 3)), 1)
            return torch.sigmoid(self.fc(y))

    example = (torch.randn(1, 3, 8, 8),)
    ours = prepare_fx(M().eval(), fxquant.get_default_qconfig_mapping("reference"), example)
    with oracle.quiet():
        qfx = __import__("torch.ao.quantization.quantize_fx", fromlist=["prepare_fx"])
        theirs = qfx.prepare_fx(M().eval(), ao.get_default_qconfig_mapping("fbgemm"), example)  # type: ignore[attr-defined]

    def observed(gm: fx.GraphModule) -> list[str]:
        return sorted(
            n.args[0].name
            for n in gm.graph.nodes
            if n.op == "call_module" and "activation_post_process" in str(n.target)
        )

    assert observed(ours) == observed(theirs)


def test_functional_linear_weight_gets_the_weight_observer_on_its_edge() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return nn.functional.linear(x, self.w)

    gm = prepare_fx(M().eval(), mapping(), (torch.randn(1, 4),))
    linear = next(n for n in gm.graph.nodes if n.op == "call_function")
    weight_observer = gm.get_submodule(str(linear.args[1].target))
    assert linear.args[1].args[0].op == "get_attr"
    assert weight_observer.dtype in (torch.qint8, torch.int8)


def test_quantized_input_and_output_indexes_remove_the_boundary_observers() -> None:
    config = (
        fxquant.PrepareCustomConfig()
        .set_input_quantized_indexes([0])
        .set_output_quantized_indexes([0])
    )
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).eval()
    qmap = fxquant.get_default_qconfig_mapping("reference").set_object_type(nn.Tanh, None)
    gm = prepare_fx(model, qmap, (torch.randn(1, 4),), config, backend_config=REF)
    assert ops(gm) == ["Linear", "obs", "Tanh", "obs"]


def test_fp16_config_observes_with_float16_placeholders() -> None:
    fp16 = fxquant.QConfig(
        activation=PlaceholderObserver.with_args(dtype=torch.float16),
        weight=PlaceholderObserver.with_args(dtype=torch.float16),
    )
    qmap = fxquant.QConfigMapping().set_global(fp16)
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    gm = prepare_fx(model, qmap, (torch.randn(1, 4),), backend_config=REF)
    assert ops(gm) == ["obs", "Linear", "obs"]
    assert gm.get_submodule("activation_post_process_0").dtype == torch.float16


def test_standalone_module_is_kept_as_one_call_and_reported() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU())).eval()
    config = fxquant.PrepareCustomConfig().set_standalone_module_name(
        "1", None, (torch.randn(1, 4),), None, None
    )
    gm = prepare_fx(model, mapping(), (torch.randn(1, 4),), config, backend_config=REF)
    entry = explain(gm, show=False).entry("_1")
    assert entry is not None
    assert entry.reason is not None
    assert entry.reason.code == "standalone_module"
    assert ops(gm) == ["obs", "Linear", "obs", "Sequential"]


def _tutorial(use_bn: bool, qmap: fxquant.QConfigMapping | None = None) -> fx.GraphModule:
    from tests.flow import test_tutorial as tutorial

    backend = tutorial.tutorial_backend_config(tutorial.fxquant_classes())
    qmap = qmap or tutorial.tutorial_qconfig_mapping()
    model = tutorial.MyModel(use_bn=use_bn).eval()
    return prepare_fx(model, qmap, (torch.rand(1, 3, 10, 10),), backend_config=backend)


def test_tutorial_experiment_1_observes_linear_and_the_fused_conv_relu() -> None:
    assert ops(_tutorial(use_bn=False)) == ["obs", "Linear", "obs", "ConvReLU2d", "obs", "Sigmoid"]


def test_tutorial_experiment_2_leaves_conv_bn_relu_unobserved_and_says_why() -> None:
    gm = _tutorial(use_bn=True)
    assert ops(gm) == ["obs", "Linear", "obs", "Conv2d", "BatchNorm2d", "ReLU", "Sigmoid"]
    entry = explain(gm, show=False).entry("bn")
    assert entry is not None
    assert entry.reason is not None
    assert entry.reason.words == (
        "conv -> bn -> relu: no pattern in backend 'my_backend' matches (Conv2d, BatchNorm2d, ReLU)"
    )


def test_tutorial_experiment_3_default_mapping_fails_scale_min_and_observes_nothing() -> None:
    gm = _tutorial(use_bn=True, qmap=mapping())
    assert "obs" not in ops(gm)
    entry = explain(gm, show=False).entry("linear")
    assert entry is not None
    assert entry.reason is not None
    assert (entry.reason.code, entry.reason.bound) == ("scale_min", 2**-12)


class FunctionalConvRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.relu(torch.nn.functional.conv2d(x, self.w, self.b))


@pytest.mark.parametrize("is_qat", [False, True])
def test_a_functional_conv_inside_a_fused_pattern_keeps_its_weight_a_weight(is_qat: bool) -> None:
    # F.conv2d -> F.relu matches as one pattern whose config names no argument roles;
    # the weight must still get the weight observer (int8) and the bias none.
    model = FunctionalConvRelu().train(is_qat)
    prepare = prepare_qat_fx if is_qat else prepare_fx
    gm = prepare(model, mapping(is_qat), (torch.randn(1, 3, 8, 8),))
    conv = next(n for n in gm.graph.nodes if n.target is torch.conv2d)
    weight, bias = conv.args[1], conv.args[2]
    assert isinstance(weight, fx.Node)
    assert weight.op == "call_module"
    assert gm.get_submodule(str(weight.target)).dtype in (torch.int8, getattr(torch, "qint8", None))
    assert isinstance(bias, fx.Node)
    assert bias.op == "get_attr"


class FixedAfterFloat(nn.Module):
    """A fixed-qparams op (sigmoid, tanh...) whose input no quantized op produced."""

    def __init__(self, op: str, *, on_input: bool) -> None:
        super().__init__()
        self.op, self.on_input = op, on_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value = x if self.on_input else x * 3  # the mul is left float by the mapping below
        if self.op == "hardsigmoid":
            return nn.functional.hardsigmoid(value)
        return getattr(torch, self.op)(value)


@pytest.mark.parametrize("is_qat", [False, True], ids=["ptq", "qat"])
@pytest.mark.parametrize("on_input", [False, True], ids=["after_float_op", "on_model_input"])
@pytest.mark.parametrize("op", ["sigmoid", "tanh", "hardsigmoid"])
def test_a_fixed_qparams_op_observes_its_float_input_by_its_range_not_the_output_grid(
    op: str, on_input: bool, is_qat: bool
) -> None:
    # before: the input got the op's output grid (sigmoid: 0..1 in steps of 1/256), so every
    # negative input became 0 and sigmoid gave 0.5: 7 dB from the float model, no warning
    torch.manual_seed(0)
    model, x = FixedAfterFloat(op, on_input=on_input), torch.randn(64, 8) * 2
    chosen = mapping(is_qat).set_object_type(operator.mul, None)
    prepare = prepare_qat_fx if is_qat else prepare_fx
    prepared = prepare(model.train() if is_qat else model.eval(), chosen, (x,))
    prepared(x)
    reference = fxquant.convert_to_reference_fx(prepared.eval())
    with torch.no_grad():
        expected, got = model(x), reference(x)
    sqnr = 10 * torch.log10(expected.pow(2).mean() / (expected - got).pow(2).mean())
    assert sqnr > 30


class ScalarOp(nn.Module):
    """A linear's output scaled or shifted by a constant, then another linear."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.a, self.b, self.op = nn.Linear(16, 16), nn.Linear(16, 8), op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if self.op == "mul":
            y = y * 50
        elif self.op == "torch.mul":
            y = torch.mul(y, 0.02)
        else:
            y = y + 100
        return self.b(y)


@pytest.mark.parametrize("backend", ["reference", "fbgemm", "qnnpack", "executorch"])
@pytest.mark.parametrize("op", ["mul", "torch.mul", "add"])
def test_a_binary_op_with_a_constant_gets_its_own_output_observer(backend: str, op: str) -> None:
    # before: `linear(x) * 50` shared the linear's output observer with the product, so the
    # linear's output was quantized on a grid 50 times too coarse: 0.6 dB from the float
    # model on the reference backend, 6.5 dB on fbgemm/qnnpack, and no warning
    torch.manual_seed(0)
    model, x = ScalarOp(op).eval(), torch.randn(8, 16)
    config = fxquant.get_backend_config(backend)
    chosen = fxquant.get_default_qconfig_mapping(backend)
    prepared = prepare_fx(model, chosen, (x,), backend_config=config)
    for scale in (1.0, 1.5):
        prepared(x * scale)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    lowered = fxquant.convert_fx(prepared)
    with torch.no_grad():
        expected, got, low = model(x), reference(x), lowered(x)
    sqnr = 10 * torch.log10(expected.pow(2).mean() / (expected - got).pow(2).mean())
    assert sqnr > 25
    steps = [
        float(n.args[1]) for n in reference.graph.nodes if "quantize_per_tensor" in str(n.target)
    ]
    if steps:  # executorch's linears quantize per token at run time: no static step
        assert float((low - got).abs().max()) <= max(steps) * 1.001


def test_a_refusal_names_a_zero_point_the_backend_needs_beside_a_broken_range() -> None:
    # an affine per-channel weight observer on executorch breaks two rules: the user should
    # read both in the one reason, not meet the second after mending the first
    if "executorch" not in fxquant.list_backends():
        pytest.skip("the executorch plugin is not installed")
    from fxquant.numerics.observer import PerChannelMinMaxObserver

    affine = PerChannelMinMaxObserver.with_args(dtype=torch.int8, qscheme=torch.per_channel_affine)
    mapping = fxquant.get_default_qconfig_mapping("executorch")
    mapping.set_object_type(nn.Linear, fxquant.QConfig(mapping.global_qconfig.activation, affine))
    model = nn.Sequential(nn.Linear(8, 4)).eval()
    backend = fxquant.get_backend_config("executorch")
    report = explain(
        prepare_fx(model, mapping, (torch.randn(2, 8),), backend_config=backend), show=False
    )
    (entry,) = report.skipped()
    assert "quant_min=-127, quant_max=127" in entry.reason.words
    assert "zero point 0" in entry.reason.words
    assert "_symmetric qscheme" in entry.reason.words


def _projected(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return nn.functional.linear(x, weight, bias).relu()


torch.fx.wrap("_projected")  # torch.fx calls it as one function: torchvision's Swin attention


class _Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_projected(x, self.proj.weight, self.proj.bias))


@pytest.mark.parametrize("backend", ["x86", "qnnpack"])
def test_a_function_traced_as_one_call_says_the_layers_it_takes_run_in_float(backend: str) -> None:
    # a skipped call hides the Linear whose weight it takes: the report names it, as no row
    # of its own does
    gm = prepare_fx(
        _Wrapped().eval(),
        fxquant.get_default_qconfig_mapping(backend),
        (torch.randn(2, 4),),
        backend_config=fxquant.get_backend_config(backend),
    )
    entry = explain(gm, show=False).entry("_projected")
    assert entry is not None
    assert entry.reason is not None
    assert entry.reason.code == "no_pattern"
    assert entry.reason.words.endswith(
        "; torch.fx traced _projected as one call, not into it: it runs in float with the 2 "
        "parameters it takes (proj.weight, proj.bias)"
    )
    assert explain(gm, show=False).entry("head").status == "quantized"


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x * mask


torch.fx.wrap("_masked")


class _MaskedBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("mask", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(_masked(x, self.mask))


def test_a_function_traced_as_one_call_that_takes_no_parameter_gets_no_hint() -> None:
    # a buffer (a mask, a table) is no layer: nothing float hides behind the call
    gm = prepare_fx(
        _MaskedBuffer().eval(),
        fxquant.get_default_qconfig_mapping("x86"),
        (torch.randn(2, 4),),
        backend_config=fxquant.get_backend_config("x86"),
    )
    entry = explain(gm, show=False).entry("_masked")
    assert entry is not None
    assert entry.reason is not None
    assert entry.reason.code == "no_pattern"
    assert "traced" not in entry.reason.words
