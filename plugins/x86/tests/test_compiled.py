"""x86's deployment: the reference model compiled by inductor runs oneDNN int8 kernels (#19).

Inductor compiles take seconds on this machine: one tiny conv + linear model,
compiled once for the module; the timings live in bench/bench_compiled_x86.py.
"""

from __future__ import annotations

import contextlib
import copy
import operator
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import fxquant
import pytest
import torch
from fxquant.errors import ConfigTypeError, ExportError
from fxquant.registry import get_deployment
from fxquant_x86.compiled import (
    INT8_KERNELS,
    CompiledModel,
    QuantizedDecomposedOps,
    compile_quantized,
    flatten_for_compile,
    input_signature,
    load,
    merge_sibling_linears,
    save_package,
)
from torch import fx, nn

BACKEND = "x86"
# how inductor's CPU code runs a float linear or conv: its Python wrapper, its C++ wrapper
FLOAT_KERNELS = (
    r"extern_kernels\.(mm|addmm|bmm|convolution)\(|aten\.(mm|addmm|convolution)\.default\(|"
    r"mkldnn\._(linear|convolution)_pointwise|"
    r"aoti_torch_cpu_+(mm|addmm|bmm|convolution|mkldnn|linear_pointwise)\w*\("
)


class ConvNet(nn.Module):
    """conv + relu6 + max pool, a linear int8 -> int8 (with relu), then two linears of that
    one input (int8 in, float out: as attention's query/key/value), added.

    x86 observes conv + relu6 after the clamp (``ConvUnary2d``) and quantizes the max pool
    and the functional relu on their own (shared qparams); the compiled model runs the relus
    as the kernels' post-ops, the max pool on the integers, and fc2 and fc3 as one GEMM."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.relu = nn.ReLU6()
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(8 * 3 * 3, 32)
        self.fc2 = nn.Linear(32, 10)
        self.fc3 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.conv(x))).flatten(1)
        hidden = torch.relu(self.fc1(x))
        return self.fc2(hidden) + self.fc3(hidden)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prepared() -> fx.GraphModule:
    torch.manual_seed(0)
    model = ConvNet().eval()
    x = torch.randn(4, 3, 8, 8)
    config = fxquant.get_backend_config(BACKEND)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn(4, 3, 8, 8))
    return prepared


@pytest.fixture(scope="module")
def reference(prepared: fx.GraphModule) -> fx.GraphModule:
    return fxquant.convert_to_reference_fx(prepared)


@pytest.fixture(scope="module")
def compiled(reference: fx.GraphModule) -> CompiledModel:
    deployment = get_deployment(BACKEND)
    assert deployment is not None
    deployed = deployment.deploy(reference, (torch.randn(4, 3, 8, 8),))
    assert isinstance(deployed, CompiledModel)
    return deployed


def one_step(reference: fx.GraphModule) -> float:
    """What one quantization step of fc2's and fc3's int8 input moves the output by, at most."""
    quantize = [
        n
        for n in reference.graph.nodes
        if n.target == torch.ops.fxquant.quantize_per_tensor.default
    ]
    scale = float(quantize[-1].args[1])  # the last quantize step feeds fc2 and fc3
    weights = (reference.fc2.weight, reference.fc3.weight)
    return scale * sum(float(w.detach().abs().sum(1).max()) for w in weights)


def test_x86_deployment_runs_onednn_int8_conv_and_linear_not_float(
    compiled: CompiledModel,
) -> None:
    # fc2 and fc3 read one int8 input: one GEMM over both weights
    assert compiled.merged == {"fc2_merged": ["fc2", "fc3"]}
    assert compiled.kernels == {"qconv_pointwise": 1, "qlinear_pointwise": 2}
    assert compiled.expected_kernels == 3
    assert compiled.flat  # inductor compiled flatten_for_compile's graph
    # no float conv or matmul runs (comments name the ATen ops a kernel came from): every
    # one became an int8 kernel
    assert compiled.cpp_wrapper  # the default: inductor's C++ wrapper runs the calls
    run = "\n".join(
        line for line in compiled.code.splitlines() if not line.strip().startswith(("#", "//"))
    )
    assert not re.search(FLOAT_KERNELS, run)
    # relu6 and relu run inside the conv and the first linear, not as passes over uint8
    assert re.search(r"aoti_torch_cpu__qconv_pointwise_tensor\([^\n]*\"hardtanh\"", run)
    assert re.search(r"aoti_torch_cpu__qlinear_pointwise_tensor\([^\n]*\"relu\"", run)
    # the max pool is inductor's own loop over uint8, not quantized::max_pool2d through
    # the dispatcher (whose headers slow the C++ wrapper's compile)
    assert "max_pool2d" in run
    assert "quantized::max_pool2d" not in run
    assert "Dispatcher" not in run
    statuses = {e.node: e.status for e in compiled.report.entries()}
    assert statuses["conv"] == statuses["fc1"] == statuses["fc2"] == statuses["fc3"] == "lowered"
    assert "qconv_pointwise" in repr(compiled)


def test_compiled_output_is_within_one_step_of_the_reference_and_the_eager_kernels(
    compiled: CompiledModel, reference: fx.GraphModule, prepared: fx.GraphModule
) -> None:
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    lowered = fxquant.convert_fx(prepared)
    with torch.no_grad():
        expected = reference(x)
        actual = compiled(x)
        eager = lowered(x)
    step = one_step(reference)
    assert float((actual - expected).abs().max()) <= step
    assert float((actual - eager).abs().max()) <= step


def test_a_new_batch_size_recompiles_once_still_on_int8_kernels(
    compiled: CompiledModel, reference: fx.GraphModule
) -> None:
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        for batch in (3, 5):
            x = torch.randn(batch, 3, 8, 8)
            with torch.no_grad():
                assert float((compiled(x) - reference(x)).abs().max()) <= one_step(reference)
    # batch 3 recompiles with a symbolic batch; 5 reuses it
    assert len(codes) == 1
    for code in codes:
        kernels = INT8_KERNELS.findall(code)
        assert sorted(kernels) == ["qconv_pointwise", "qlinear_pointwise", "qlinear_pointwise"]


def test_max_pool_between_one_set_of_qparams_pools_the_integers() -> None:
    ops = torch.ops.quantized_decomposed  # defined by inductor's passes, loaded by the pass
    QuantizedDecomposedOps()(fx.Graph())
    qparams = (0.1, 3, 0, 255, torch.uint8)
    graph = fx.Graph()
    x = graph.placeholder("x")
    q = graph.call_function(ops.quantize_per_tensor.default, (x, *qparams))
    dq = graph.call_function(ops.dequantize_per_tensor.default, (q, *qparams))
    pool = graph.call_function(torch.ops.aten.max_pool2d_with_indices.default, (dq, [2, 2]))
    values = graph.call_function(operator.getitem, (pool, 0))
    requantize = graph.call_function(ops.quantize_per_tensor.default, (values, *qparams))
    graph.output(requantize)
    QuantizedDecomposedOps()(graph)
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert targets == [
        ops.quantize_per_tensor.default,
        torch.ops.aten.max_pool2d_with_indices.default,
        operator.getitem,
    ]
    assert pool.args[0] is q
    # another scale after the pool: the quantize steps stay
    graph = fx.Graph()
    x = graph.placeholder("x")
    q = graph.call_function(ops.quantize_per_tensor.default, (x, *qparams))
    dq = graph.call_function(ops.dequantize_per_tensor.default, (q, *qparams))
    pool = graph.call_function(torch.ops.aten.max_pool2d.default, (dq, [2, 2]))
    other = (0.2, *qparams[1:])
    graph.output(graph.call_function(ops.quantize_per_tensor.default, (pool, *other)))
    QuantizedDecomposedOps()(graph)
    assert pool.args[0] is dq


def test_inductor_settings_hold_only_inside_the_compiled_calls(compiled: CompiledModel) -> None:
    from torch._inductor import config

    compiled(torch.randn(4, 3, 8, 8))
    assert config.freezing is False
    assert config.joint_custom_pre_pass is None
    assert config.cpp_wrapper is False


def test_python_wrapper_off_switch_runs_the_same_int8_kernels(reference: fx.GraphModule) -> None:
    x = torch.randn(4, 3, 8, 8)
    python = compile_quantized(reference, (x,), cpp_wrapper=False)
    assert not python.cpp_wrapper
    assert "aoti_torch" not in python.code
    run = "\n".join(line for line in python.code.splitlines() if not line.strip().startswith("#"))
    assert not re.search(FLOAT_KERNELS, run)
    assert python.kernels == {"qconv_pointwise": 1, "qlinear_pointwise": 2}
    assert re.search(r"qconv_pointwise\.tensor\([^\n]*'hardtanh', \[0\.0, 6\.0\]", run)
    assert re.search(r"qlinear_pointwise\.tensor\([^\n]*torch\.uint8, 'relu'", run)
    with torch.no_grad():
        assert float((python(x) - reference(x)).abs().max()) <= one_step(reference)


def test_convert_fx_model_deploys_as_its_reference_form(
    prepared: fx.GraphModule, reference: fx.GraphModule, compiled: CompiledModel
) -> None:
    deployment = get_deployment(BACKEND)
    assert deployment is not None
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    deployed = deployment.deploy(fxquant.convert_fx(prepared), (x,))
    assert deployed.kernels == compiled.kernels
    assert deployed.report.table() == compiled.report.table()
    with torch.no_grad():
        assert float((deployed(x) - reference(x)).abs().max()) <= one_step(reference)


def test_a_model_lowered_to_another_backend_is_refused_naming_what_to_pass() -> None:
    deployment = get_deployment(BACKEND)
    assert deployment is not None
    x = torch.randn(4, 3, 8, 8)
    onednn = fxquant.get_backend_config("onednn")
    mapping = fxquant.get_default_qconfig_mapping("onednn")
    prepared = fxquant.prepare_fx(ConvNet().eval(), mapping, (x,), backend_config=onednn)
    with torch.no_grad():
        prepared(x)
    lowered = fxquant.convert_fx(prepared)
    with pytest.raises(
        ConfigTypeError, match=r"lowered to kernels.*only for backend x86.*convert_to_reference"
    ):
        deployment.deploy(lowered, (torch.randn(4, 3, 8, 8),))
    with pytest.raises(ConfigTypeError, match="must be a model returned by"):
        deployment.deploy(ConvNet().eval(), (torch.randn(4, 3, 8, 8),))  # type: ignore[arg-type]


def test_a_prepared_model_is_refused_not_compiled_as_float(prepared: fx.GraphModule) -> None:
    deployment = get_deployment(BACKEND)
    assert deployment is not None
    with pytest.raises(ConfigTypeError, match=r"is a prepared model \(observers .*convert_fx"):
        deployment.deploy(prepared, (torch.randn(4, 3, 8, 8),))


def test_fxquant_explain_prints_the_deployed_models_report(
    compiled: CompiledModel, capsys: pytest.CaptureFixture[str]
) -> None:
    report = fxquant.explain(compiled)
    assert report is compiled.report
    assert capsys.readouterr().out.strip() == compiled.report.table()


def test_save_of_a_batch_that_cannot_vary_names_dynamic_batch_false(tmp_path: Path) -> None:
    class OneRow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.view(1, 16))  # batch 1 only

    x = torch.randn(1, 16)
    config = fxquant.get_backend_config(BACKEND)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    prepared = fxquant.prepare_fx(OneRow().eval(), mapping, (x,), backend_config=config)
    with torch.no_grad():
        prepared(x)
    with pytest.raises(ExportError, match=r"save\(path, dynamic_batch=False\)"):
        save_package(fxquant.convert_fx(prepared), (x,), tmp_path / "one.pt2")


def test_sibling_linears_merge_into_one_linear_with_the_same_output(
    reference: fx.GraphModule,
) -> None:
    merged = copy.deepcopy(reference)
    assert merge_sibling_linears(merged) == {"fc2_merged": ["fc2", "fc3"]}
    linears = [n.target for n in merged.graph.nodes if n.op == "call_module"]
    assert {"fc2", "fc3"}.isdisjoint(linears)
    assert "fc2_merged" in linears
    assert merged.get_submodule("fc2_merged").weight.shape == (20, 32)
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        # per-channel weights: each output channel is the same computation as before
        torch.testing.assert_close(merged(x), reference(x), rtol=0, atol=1e-6)
    assert merge_sibling_linears(merged) == {}  # nothing left to merge


def _package_kernels(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as package:
        code = "".join(
            package.read(name).decode(errors="ignore")
            for name in package.namelist()
            if name.endswith(".wrapper.cpp")
        )
    return re.findall(r"aoti_torch_cpu__(qlinear_pointwise|qconv\w*_pointwise)\w*\(", code)


def test_aot_package_of_a_batch_one_example_reloads_and_runs_any_batch_on_int8_kernels(
    tmp_path: Path,
) -> None:
    # a linear-only model: the package's compile is the slowest step of this module
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(4, 16)
    config = fxquant.get_backend_config(BACKEND)
    small = fxquant.prepare_fx(
        model, fxquant.get_default_qconfig_mapping(BACKEND), (x,), backend_config=config
    )
    with torch.no_grad():
        small(x)
    reference = fxquant.convert_to_reference_fx(small)
    # CompiledModel.save calls save_package: this skips the torch.compile the test does not
    # need. A batch-1 example: torch.export takes a size-1 dimension for a constant
    path = save_package(fxquant.convert_fx(small), (x[:1],), tmp_path / "small.pt2")
    assert _package_kernels(path) == ["qlinear_pointwise", "qlinear_pointwise"]
    for run in (load(path), CompiledModel.load(path)):
        for batch in (4, 1, 7):
            inputs = torch.randn(batch, 16)
            with torch.no_grad():
                difference = float((run(inputs) - reference(inputs)).abs().max())
            assert difference <= 1e-5
    assert "no report" in CompiledModel.load(path).report.notes()[0]  # save_package wrote none


def test_flat_graph_has_no_modules_integer_weights_and_the_same_output(
    reference: fx.GraphModule,
) -> None:
    flat = flatten_for_compile(reference)
    assert not [n for n in flat.graph.nodes if n.op == "call_module"]
    # each weight's quantize step ran once: an int8 constant feeds its dequantize
    dequantize = [
        n for n in flat.graph.nodes if n.target == torch.ops.fxquant.dequantize_per_channel.default
    ]
    assert len(dequantize) == 4  # conv, fc1, fc2, fc3
    for node in dequantize:
        assert node.args[0].op == "get_attr"
        assert getattr(flat, node.args[0].target).dtype == torch.int8
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(flat(x), reference(x))  # the same ops on the same values


def test_input_signature_tells_apart_what_dynamo_guards() -> None:
    x = torch.zeros(4, 6)
    same = input_signature((torch.ones(4, 6),))
    assert input_signature((x,)) == same is not None
    assert input_signature((x.t().contiguous().t(),)) != same  # strides
    assert input_signature((x[1:],)) != input_signature((torch.zeros(3, 6),))  # offset
    assert input_signature((x, x)) != input_signature((x, torch.zeros(4, 6)))  # aliasing
    assert input_signature((x.double(),)) != same
    assert input_signature((x, [1])) is None  # not a tensor or a plain value: guarded call
    with torch.no_grad():
        assert input_signature((x,)) != same  # grad mode: dynamo compiles one graph per mode
    with torch.inference_mode():
        assert input_signature((torch.ones(4, 6),)) != same


def test_convert_fx_keeps_its_reference_form_without_a_float_copy_of_the_weights() -> None:
    # the kept reference form rebuilds its weights from the int8 kernels when asked: the
    # converted model holds no second, four-times-larger copy of what the kernels hold
    from fxquant.flow.state import flow_state, reference_form

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    x = torch.randn(4, 64)
    backend = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=backend)
    prepared(x)
    expected = fxquant.convert_to_reference_fx(copy.deepcopy(prepared), backend_config=backend)
    converted = fxquant.convert_fx(prepared, backend_config=backend)
    kept = flow_state(converted).reference_model
    assert kept is not None
    held = [n for n, t in kept.named_parameters() if t.device.type != "meta" and t.dim() > 1]
    assert held == []
    assert torch.equal(reference_form(converted)(x), expected(x))


class Residual(nn.Module):
    """``x + fc(x)``: a transformer layer's residual on the model's input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


def _residual_reference() -> tuple[fx.GraphModule, torch.Tensor]:
    torch.manual_seed(2)
    model, x = Residual().eval(), torch.randn(2, 5, 16)
    config = fxquant.get_backend_config(BACKEND)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    with torch.no_grad():
        prepared(x)
    return fxquant.convert_to_reference_fx(prepared), x


def test_a_residual_on_the_input_leaves_the_callers_tensors_as_they_were() -> None:
    # inductor fused linear + add into oneDNN's qlinear with the `sum` post-op, accumulating
    # into the caller's tensor: the example at deploy, then every call's input
    reference, x = _residual_reference()
    example = x.clone()
    compiled = compile_quantized(reference, (example,))
    torch.testing.assert_close(example, x, rtol=0, atol=0)
    assert compiled.kernels == {"qlinear_pointwise": 1}  # still the int8 kernel, fused add
    z = torch.randn(2, 5, 16)
    given = z.clone()
    with torch.no_grad():
        first, again, expected = compiled(given), compiled(given), reference(z)
    torch.testing.assert_close(given, z, rtol=0, atol=0)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(first, expected, rtol=0, atol=1e-5)
    assert compiled.written_inputs == frozenset()  # no copy on any call


def test_aot_package_leaves_the_callers_tensors_as_they_were(tmp_path: Path) -> None:
    reference, x = _residual_reference()
    run = load(save_package(reference, (x,), tmp_path / "residual.pt2"))
    z = torch.randn(2, 5, 16)
    given = z.clone()
    with torch.no_grad():
        run(given)
    torch.testing.assert_close(given, z, rtol=0, atol=0)


# with the cache off, inductor warns that its profile-guided cache is off too
@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
def test_an_input_the_compiled_code_writes_is_copied_on_every_call() -> None:
    # without the compile's guard (a torch whose checks moved), the first call's check finds
    # the written input, and every later call runs on a copy of it
    reference, x = _residual_reference()
    with (
        mock.patch("fxquant_x86.compiled.never_into_inputs", contextlib.nullcontext),
        torch._inductor.config.patch(force_disable_caches=True),  # a compile without the guard
    ):
        compiled = compile_quantized(reference, (x.clone(),))
        assert compiled.written_inputs == frozenset({0})
        z = torch.randn(2, 5, 16)
        given = z.clone()
        with torch.no_grad():
            first, again = compiled(given), compiled(given)
    torch.testing.assert_close(given, z, rtol=0, atol=0)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


class ResidualCNN(nn.Module):
    """conv + bn + relu, conv + bn added to its input + relu, a mean and a linear: the
    residual add becomes the second conv's ``sum`` post-op in the compiled model."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(y.mean((2, 3)))


def _residual_cnn(qat: bool) -> fx.GraphModule:
    torch.manual_seed(0)
    model, x = ResidualCNN().train(qat), torch.randn(1, 3, 16, 16)
    config = fxquant.get_backend_config(BACKEND)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND, is_qat=qat)
    prepare = fxquant.prepare_qat_fx if qat else fxquant.prepare_fx
    prepared = prepare(model, mapping, (x,), backend_config=config)
    with torch.no_grad():
        for _ in range(3):
            prepared(torch.randn(4, 3, 16, 16))
    return fxquant.convert_fx(prepared.eval())


def _deploy(converted: fx.GraphModule) -> CompiledModel:
    deployment = get_deployment(BACKEND)
    assert deployment is not None
    compiled = deployment.deploy(converted, (torch.randn(1, 3, 16, 16),))
    assert isinstance(compiled, CompiledModel)
    return compiled


def _float_linears_run(code: str) -> bool:
    """Whether inductor's code runs a float GEMM, or a GEMM it rewrote as a fused loop."""
    return re.search(FLOAT_KERNELS + r"|cpp_fused_\w*addmm", code) is not None


@pytest.mark.parametrize("qat", [False, True], ids=["ptq", "qat"])
def test_a_small_linear_inductor_fuses_into_a_float_loop_is_reported_lowered_with_a_note(
    qat: bool,
) -> None:
    # fc is 16 -> 10 at batch 1: inductor's CPU decomposition turns such an addmm into a
    # multiply and a sum (a fused loop), before its int8 passes run; the convs are int8
    converted = _residual_cnn(qat)
    compiled = _deploy(converted)
    conv_kernels = sum(n for k, n in compiled.kernels.items() if k.startswith("qconv"))
    assert (conv_kernels, compiled.kernels["qlinear_pointwise"]) == (2, 0)
    assert compiled.expected_kernels == 2
    assert re.search(r"cpp_fused_\w*addmm", compiled.code)
    entries = {e.node: e for e in compiled.report.entries()}
    assert {n: entries[n].status for n in ("conv", "conv2", "fc")} == dict.fromkeys(
        ("conv", "conv2", "fc"), "lowered"
    )
    (note,) = [n for n in compiled.report.notes() if n.startswith("fc:")]
    assert "fused C++ loop" in note
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected, actual = converted(x), compiled(x)
    # the loop computes the reference's float linear on the same int8 values
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-4)


def test_a_linear_inductor_runs_in_float_unexplained_is_reported_not_delegated() -> None:
    # were fc not one of the small GEMMs inductor fuses, its float loop would be a miss
    with mock.patch("fxquant_x86.compiled._fused_small_linears", return_value=[]):
        compiled = _deploy(_residual_cnn(qat=False))
    assert compiled.kernels["qlinear_pointwise"] == 0
    entries = {e.node: e for e in compiled.report.entries()}
    assert entries["conv"].status == entries["conv2"].status == "lowered"
    reason = entries["fc"].reason
    assert entries["fc"].status == "reference"
    assert reason is not None
    assert reason.code == "not_delegated"
    assert "fc runs as a float linear" in reason.words


class TransposedWeight(nn.Module):
    """A linear whose weight is a transposed view, as transformers' GPT-2 ``Conv1D`` weights
    reach the reference Linear (``weight.t()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 48)
        self.fc.weight = nn.Parameter(torch.randn(16, 48).t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_transposed_weight_compiles_to_the_matrix_the_reference_model_holds(
    tmp_path: Path,
) -> None:
    # oneDNN's int8 prepack read the view's storage as a contiguous (48, 16) matrix: the
    # compiled output and the AOT package's were as far from the reference as the range
    torch.manual_seed(0)
    model = TransposedWeight().eval()
    x = torch.randn(4, 16)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_fx(
        model, fxquant.get_default_qconfig_mapping(BACKEND), (x,), backend_config=config
    )
    with torch.no_grad():
        for _ in range(3):
            prepared(torch.randn(4, 16))
    reference = fxquant.convert_to_reference_fx(prepared)
    compiled = compile_quantized(reference, (x,))
    assert compiled.kernels == {"qlinear_pointwise": 1}
    assert not reference.fc.weight.is_contiguous()  # the caller's model is left as it was
    package = load(save_package(reference, (x,), tmp_path / "t.pt2", dynamic_batch=False))
    with torch.no_grad():
        expected = reference(x)
        torch.testing.assert_close(compiled(x), expected, rtol=0, atol=1e-4)
        torch.testing.assert_close(package(x), expected, rtol=0, atol=1e-4)


class Conv1dGroupNorm(nn.Module):
    """Wav2Vec2's first feature-encoder layer: Conv1d (stride 5) then GroupNorm per channel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 32, 10, stride=5, bias=False)
        self.norm = nn.GroupNorm(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


def test_a_quantized_conv1d_then_group_norm_compiles_and_agrees() -> None:
    # inductor's shape function of a prepacked conv1d took the weight's height of one for
    # its kernel width: 80 outputs for 79, and GroupNorm's reshape failed the compile
    torch.manual_seed(0)
    x = torch.randn(2, 1, 400)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_fx(
        Conv1dGroupNorm().eval(),
        fxquant.get_default_qconfig_mapping(BACKEND),
        (x,),
        backend_config=config,
    )
    with torch.no_grad():
        prepared(torch.randn(2, 1, 400))
    reference = fxquant.convert_to_reference_fx(prepared)
    compiled = compile_quantized(reference, (x,))
    assert compiled.kernels == {"qconv_pointwise": 1}  # still oneDNN's int8 conv
    quantize = torch.ops.fxquant.quantize_per_tensor.default
    step = [float(n.args[1]) for n in reference.graph.nodes if n.target == quantize][-1]
    with torch.no_grad():  # inductor's float GroupNorm may round a value across one step
        torch.testing.assert_close(compiled(x), reference(x), rtol=0, atol=step * 1.001)
