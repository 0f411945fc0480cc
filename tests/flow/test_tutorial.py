"""The BackendConfig tutorial (seed 004) with its imports changed to fxquant.

The tutorial's backend has two ops, quantized linear and quantized conv-relu.
Its three experiments: (1) conv-relu is fused and both ops are quantized;
(2) with a BatchNorm between conv and relu, conv-bn-relu is neither fused nor
quantized, linear still is; (3) the default QConfigMapping violates the
backend's constraints (its eps is below ``scale_min_lower_bound``), so nothing
is quantized. Its configs name torch.ao module classes; they must still work,
so each experiment runs with torch.ao's classes (skipped where torch.ao is
gone) and with fxquant's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fxquant import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
    QConfig,
    QConfigMapping,
    get_default_qconfig_mapping,
)
from fxquant.flow import convert_fx, convert_to_reference_fx, explain, prepare_fx, prepare_qat_fx
from fxquant.numerics.observer import MinMaxObserver, default_weight_observer
from torch import fx, nn
from torch.utils._python_dispatch import TorchDispatchMode

from tests import oracle

# ---- the tutorial, steps 2-5 ------------------------------------------------------------------


def torch_ao_classes() -> dict[str, Any]:
    """The module classes the tutorial names, from torch.ao (as printed in the seed)."""
    oracle.load()
    with oracle.quiet():
        return {
            "qat_linear": torch.nn.qat.Linear,
            "conv_relu": torch.ao.nn.intrinsic.ConvReLU2d,
            "qat_conv_relu": torch.ao.nn.intrinsic.qat.ConvReLU2d,
            "ref_linear": torch.ao.nn.quantized.reference.Linear,
            "ref_conv": torch.ao.nn.quantized.reference.Conv2d,
        }


def fxquant_classes() -> dict[str, Any]:
    """The same module classes from fxquant.nn."""
    import fxquant.nn.intrinsic
    import fxquant.nn.intrinsic.qat
    import fxquant.nn.qat
    import fxquant.nn.reference

    return {
        "qat_linear": fxquant.nn.qat.Linear,
        "conv_relu": fxquant.nn.intrinsic.ConvReLU2d,
        "qat_conv_relu": fxquant.nn.intrinsic.qat.ConvReLU2d,
        "ref_linear": fxquant.nn.reference.Linear,
        "ref_conv": fxquant.nn.reference.Conv2d,
    }


def tutorial_backend_config(classes: dict[str, Any]) -> BackendConfig:
    quint8_with_constraints = DTypeWithConstraints(
        dtype=torch.quint8,
        quant_min_lower_bound=0,
        quant_max_upper_bound=255,
        scale_min_lower_bound=2**-12,
    )
    weighted_int8_dtype_config = DTypeConfig(
        input_dtype=quint8_with_constraints,
        output_dtype=quint8_with_constraints,
        weight_dtype=torch.qint8,
        bias_dtype=torch.float,
    )

    def fuse_conv2d_relu(is_qat: bool, conv: nn.Conv2d, relu: nn.ReLU) -> nn.Module:
        return classes["conv_relu"](conv, relu)

    linear_config = (
        BackendPatternConfig()
        .set_pattern(torch.nn.Linear)
        .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
        .add_dtype_config(weighted_int8_dtype_config)
        .set_root_module(torch.nn.Linear)
        .set_qat_module(classes["qat_linear"])
        .set_reference_quantized_module(classes["ref_linear"])
    )
    conv_relu_config = (
        BackendPatternConfig()
        .set_pattern((torch.nn.Conv2d, torch.nn.ReLU))
        .set_fused_module(classes["conv_relu"])
        .set_fuser_method(fuse_conv2d_relu)
    )
    fused_conv_relu_config = (
        BackendPatternConfig()
        .set_pattern(classes["conv_relu"])
        .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
        .add_dtype_config(weighted_int8_dtype_config)
        .set_root_module(torch.nn.Conv2d)
        .set_qat_module(classes["qat_conv_relu"])
        .set_reference_quantized_module(classes["ref_conv"])
    )
    return (
        BackendConfig("my_backend")
        .set_backend_pattern_config(linear_config)
        .set_backend_pattern_config(conv_relu_config)
        .set_backend_pattern_config(fused_conv_relu_config)
    )


def tutorial_qconfig_mapping() -> QConfigMapping:
    activation_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127, eps=2**-12)
    qconfig = QConfig(activation=activation_observer, weight=default_weight_observer)
    return (
        QConfigMapping()
        .set_object_type(torch.nn.Linear, qconfig)
        .set_object_type(torch.nn.Conv2d, qconfig)
        .set_object_type(torch.nn.BatchNorm2d, qconfig)
        .set_object_type(torch.nn.ReLU, qconfig)
    )


class MyModel(torch.nn.Module):
    def __init__(self, use_bn: bool):
        super().__init__()
        self.linear = torch.nn.Linear(10, 3)
        self.conv = torch.nn.Conv2d(3, 3, 3)
        self.bn = torch.nn.BatchNorm2d(3)
        self.relu = torch.nn.ReLU()
        self.sigmoid = torch.nn.Sigmoid()
        self.use_bn = use_bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        x = self.conv(x)
        if self.use_bn:
            x = self.bn(x)
        x = self.relu(x)
        x = self.sigmoid(x)
        return x


# ---- running an experiment --------------------------------------------------------------------


@pytest.fixture(params=["torch_ao_classes", "fxquant_classes"])
def backend_config(request: pytest.FixtureRequest) -> Iterator[BackendConfig]:
    classes = torch_ao_classes() if request.param == "torch_ao_classes" else fxquant_classes()
    yield tutorial_backend_config(classes)
    oracle.release()


def run_experiment(
    backend_config: BackendConfig, qconfig_mapping: QConfigMapping, *, use_bn: bool
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Prepare, calibrate and convert MyModel; returns (reference model, convert_fx model)."""
    torch.manual_seed(0)
    example_inputs = (torch.rand(1, 3, 10, 10, dtype=torch.float),)
    model = MyModel(use_bn=use_bn).eval()
    prepared = prepare_fx(model, qconfig_mapping, example_inputs, backend_config=backend_config)
    prepared(*example_inputs)  # calibrate
    # both converts from the same calibration: convert_to_reference_fx does not consume it
    reference = convert_to_reference_fx(prepared, backend_config=backend_config)
    converted = convert_fx(prepared, backend_config=backend_config)
    return reference, converted


def is_reference_module(module: nn.Module, name: str) -> bool:
    """A reference quantized module (torch.ao's or fxquant's): float op on a q/dq'd weight."""
    return type(module).__name__ == name and hasattr(module, "get_quantized_weight")


def sandwiched_modules(gm: fx.GraphModule) -> list[str]:
    """Targets of call_module nodes that read a dequantized input and feed a quantize step."""

    def named(node: fx.Node, word: str) -> bool:
        target = (
            node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        )
        return node.op in {"call_function", "call_method"} and target.startswith(word)

    return [
        str(node.target)
        for node in gm.graph.nodes
        if node.op == "call_module"
        and any(named(arg, "dequantize") for arg in node.all_input_nodes)
        and any(named(user, "quantize") for user in node.users)
    ]


def reason_code(gm: fx.GraphModule, node: str) -> str | None:
    entry = explain(gm).entry(node)
    assert entry is not None, f"explain() has no entry for node {node!r}"
    return None if entry.reason is None else entry.reason.code


class DtypeRecorder(TorchDispatchMode):
    """Records the dtype of every tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, tuple | list) else (out,):
            if isinstance(value, torch.Tensor):
                self.dtypes.add(value.dtype)
        return out


# ---- the three experiments --------------------------------------------------------------------


def test_experiment_1_quantizes_linear_and_fuses_conv_relu(backend_config: BackendConfig) -> None:
    reference, _ = run_experiment(backend_config, tutorial_qconfig_mapping(), use_bn=False)
    assert is_reference_module(reference.linear, "Linear")
    assert type(reference.conv).__name__ == "ConvReLU2d"
    assert is_reference_module(reference.conv[0], "Conv2d")
    assert sandwiched_modules(reference) == ["linear", "conv"]
    assert isinstance(reference.sigmoid, nn.Sigmoid)
    assert reason_code(reference, "linear") is None
    assert reason_code(reference, "sigmoid") in {"qconfig_none", "no_pattern"}


def test_experiment_1_reference_model_runs_on_plain_integer_tensors(
    backend_config: BackendConfig,
) -> None:
    """Even with torch.ao's reference classes named in the config, no quint8/qint8 tensor."""
    reference, _ = run_experiment(backend_config, tutorial_qconfig_mapping(), use_bn=False)
    recorder = DtypeRecorder()
    with recorder:
        reference(torch.rand(2, 3, 10, 10))
    quantized = {d for d in recorder.dtypes if "quint" in str(d) or "qint" in str(d)}
    assert quantized == set()
    assert torch.uint8 in recorder.dtypes


def test_experiment_1_convert_fx_keeps_reference_form_without_lowering_kernels(
    backend_config: BackendConfig,
) -> None:
    """my_backend contributes no kernels: convert_fx leaves the reference patterns, and says so."""
    reference, converted = run_experiment(backend_config, tutorial_qconfig_mapping(), use_bn=False)
    assert sandwiched_modules(converted) == ["linear", "conv"]
    assert reason_code(converted, "linear") == "no_lowering_kernel"
    inputs = torch.rand(2, 3, 10, 10)
    torch.testing.assert_close(converted(inputs), reference(inputs))


def test_experiment_2_conv_bn_relu_is_neither_fused_nor_quantized(
    backend_config: BackendConfig,
) -> None:
    reference, _ = run_experiment(backend_config, tutorial_qconfig_mapping(), use_bn=True)
    assert is_reference_module(reference.linear, "Linear")
    assert type(reference.conv) is nn.Conv2d
    assert type(reference.bn) is nn.BatchNorm2d
    assert type(reference.relu) is nn.ReLU
    assert sandwiched_modules(reference) == ["linear"]
    for node in ("conv", "bn", "relu"):
        assert reason_code(reference, node) == "no_pattern", node
    words = explain(reference).entry("conv").reason.words
    assert "my_backend" in words


def test_experiment_3_default_mapping_violates_the_constraints_and_nothing_is_quantized(
    backend_config: BackendConfig,
) -> None:
    """The default observers' eps (float32 eps) is below the backend's scale_min 2**-12."""
    mapping = get_default_qconfig_mapping("reference")
    reference, _ = run_experiment(backend_config, mapping, use_bn=True)
    assert type(reference.linear) is nn.Linear
    assert type(reference.conv) is nn.Conv2d
    assert sandwiched_modules(reference) == []
    kinds = {node.op for node in reference.graph.nodes}
    assert kinds == {"placeholder", "call_module", "output"}
    reason = explain(reference).entry("linear").reason
    assert reason is not None
    assert reason.code == "scale_min"
    assert reason.bound == 2**-12


# ---- the same backend under QAT (issue 11) ----------------------------------------------------


def tutorial_qat_qconfig_mapping() -> QConfigMapping:
    """The tutorial's constraints (activations in 0..127, eps 2**-12) with fake quantization."""
    from fxquant.numerics.fake_quantize import FakeQuantize, default_weight_fake_quant
    from fxquant.numerics.observer import MovingAverageMinMaxObserver

    activation = FakeQuantize.with_args(
        observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=127, eps=2**-12
    )
    qconfig = QConfig(activation=activation, weight=default_weight_fake_quant)
    return (
        QConfigMapping()
        .set_object_type(torch.nn.Linear, qconfig)
        .set_object_type(torch.nn.Conv2d, qconfig)
        .set_object_type(torch.nn.ReLU, qconfig)
    )


def test_qat_swaps_in_the_qat_modules_and_quantizes_them_as_ptq_does(
    backend_config: BackendConfig,
) -> None:
    """The backend names set_qat_module: that is enough to match the QAT modules it swaps in."""
    torch.manual_seed(0)
    inputs = torch.rand(4, 3, 10, 10)
    prepared = prepare_qat_fx(
        MyModel(use_bn=False).train(),
        tutorial_qat_qconfig_mapping(),
        (inputs,),
        backend_config=backend_config,
    )
    assert [type(prepared.linear).__name__, type(prepared.conv).__name__] == [
        "Linear",
        "ConvReLU2d",
    ]
    assert hasattr(prepared.linear, "weight_fake_quant")  # the QAT classes
    assert hasattr(prepared.conv, "weight_fake_quant")
    report = explain(prepared, show=False)
    assert [report.entry(n).status for n in ("linear", "conv")] == ["quantized", "quantized"]
    prepared(inputs).sum().backward()  # a training step
    reference = convert_to_reference_fx(prepared.eval(), backend_config=backend_config)
    assert is_reference_module(reference.linear, "Linear")
    assert type(reference.conv).__name__ == "ConvReLU2d"
    assert is_reference_module(reference.conv[0], "Conv2d")
    assert sandwiched_modules(reference) == ["linear", "conv"]


def test_a_qat_module_no_config_matches_is_reported_with_its_class_and_the_missing_config() -> None:
    """A model holding qat.Linear already, on a backend whose Linear declares no QAT module."""
    import fxquant.nn.qat

    int8 = DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)
    linear = BackendPatternConfig(torch.nn.Linear).add_dtype_config(int8)
    backend = BackendConfig("my_backend").set_backend_pattern_config(linear)
    qconfig = tutorial_qat_qconfig_mapping().object_type_qconfigs[torch.nn.Linear]
    mapping = QConfigMapping().set_global(qconfig)
    float_linear = torch.nn.Linear(4, 4)
    float_linear.qconfig = qconfig
    model = torch.nn.Sequential(fxquant.nn.qat.Linear.from_float(float_linear)).train()
    prepared = prepare_qat_fx(model, mapping, (torch.randn(2, 4),), backend_config=backend)
    reason = explain(prepared, show=False).entry("_0").reason
    assert reason is not None
    assert reason.code == "no_pattern"
    assert reason.words == (
        "_0: no pattern in backend 'my_backend' matches fxquant.nn.qat.Linear; "
        "fxquant.nn.qat.Linear is the QAT module of torch.nn.Linear; backend 'my_backend' has "
        "no BackendPatternConfig(fxquant.nn.qat.Linear), and its config for torch.nn.Linear "
        "declares no set_qat_module(fxquant.nn.qat.Linear) (fxquant derives the first from "
        "the second)"
    )
