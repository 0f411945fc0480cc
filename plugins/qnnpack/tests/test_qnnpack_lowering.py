"""Every kernel of the qnnpack backend matches the reference model within one quantization step."""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
import textwrap
import warnings

import fxquant
import pytest
import torch
from fxquant.kernels.quantized_engine import QuantizedConv, QuantizedLinear
from hypothesis import given, settings
from hypothesis import strategies as st
from qnnpack_cases import ALL_CASES, Case, output_scale, quantize, statuses

BACKEND = "qnnpack"
# QNNPACK has no fp16 GEMM (linear_prepack_fp16 raises): the backend offers no fp16 config
CASES = [c for c in ALL_CASES if c.name != "linear_fp16"]
SIZES = st.tuples(
    st.integers(1, 4), st.integers(1, 9), st.integers(1, 9), st.integers(4, 9)
)  # batch, in channels, out channels, spatial size


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def _close(case: Case, lowered: torch.Tensor, reference: torch.Tensor, step: float) -> None:
    difference = float((lowered - reference).abs().max())
    if case.name == "linear_dynamic":  # float out: activations quantized per call by both
        assert difference <= 1e-4 * (1 + float(reference.abs().max()))
    elif case.name == "linear_fp16":  # the fp16 GEMM rounds its float input too
        assert difference <= 2e-3 * (1 + float(reference.abs().max()))
    else:
        assert difference <= step * 1.001, f"{case.name}: {difference} > one step {step}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@settings(max_examples=3, deadline=None)
@given(sizes=SIZES)
def test_lowered_op_is_within_one_step_of_the_reference_model(
    case: Case, sizes: tuple[int, int, int, int]
) -> None:
    lowered, reference, inputs = quantize(BACKEND, case, sizes)
    assert "reference" not in statuses(lowered).values(), fxquant.explain(lowered)
    with torch.no_grad():
        _close(case, lowered(*inputs), reference(*inputs), output_scale(reference))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_quantized_op_is_lowered_to_a_kernel(case: Case) -> None:
    lowered, _, _ = quantize(BACKEND, case, (2, 4, 4, 6))
    found = set(statuses(lowered).values())
    assert "lowered" in found, fxquant.explain(lowered)
    assert found <= {"lowered", "float"}, fxquant.explain(lowered)


def _residual() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    cases = {c.name: c for c in CASES}
    lowered, _, inputs = quantize(BACKEND, cases["conv_bn_relu2d"], (2, 3, 4, 8))
    return lowered, inputs


def test_state_dict_round_trip_gives_identical_outputs() -> None:
    lowered, inputs = _residual()
    with torch.no_grad():
        expected = lowered(*inputs)
        buffer = io.BytesIO()
        torch.save(lowered.state_dict(), buffer)
        other = copy.deepcopy(lowered)
        for name, value in other.state_dict().items():
            if name.endswith("weight"):
                value.zero_()  # the prepacked weights now hold zeros ...
        assert not torch.equal(other(*inputs), expected)
        buffer.seek(0)
        other.load_state_dict(torch.load(buffer))  # ... and are rebuilt from the loaded ones
        assert torch.equal(other(*inputs), expected)


def test_deepcopy_and_pickle_rebuild_the_prepacked_weights() -> None:
    lowered, inputs = _residual()
    with torch.no_grad():
        expected = lowered(*inputs)
        copied = copy.deepcopy(lowered)
        assert torch.equal(copied(*inputs), expected)
        restored = pickle.loads(pickle.dumps(lowered))
        assert torch.equal(restored(*inputs), expected)
    kernels = [m for m in copied.modules() if isinstance(m, (QuantizedConv, QuantizedLinear))]
    assert kernels
    assert all(k._packed is not None for k in kernels)


def test_kernel_restores_the_quantized_engine() -> None:
    lowered, inputs = _residual()
    before = torch.backends.quantized.engine
    other = "qnnpack" if before != "qnnpack" else "fbgemm"
    torch.backends.quantized.engine = other
    try:
        with torch.no_grad():
            lowered(*inputs)
        assert torch.backends.quantized.engine == other
    finally:
        torch.backends.quantized.engine = before


def test_lowered_forward_shows_no_deprecation_warning_in_a_fresh_process() -> None:
    # torch warns once per process on the first quint8 tensor: only a fresh process shows it
    code = textwrap.dedent(
        f"""
        import warnings, torch, fxquant
        warnings.simplefilter("error")
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
        x = torch.randn(1, 3, 8, 8)
        mapping = fxquant.get_default_qconfig_mapping({BACKEND!r})
        backend = fxquant.get_backend_config({BACKEND!r})
        prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=backend)
        prepared(x)
        lowered = fxquant.convert_fx(prepared)
        lowered(x)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert "deprecated" not in result.stderr


def test_lowered_forward_emits_no_warning() -> None:
    lowered, inputs = _residual()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lowered(*inputs)


def test_lowering_a_dynamic_linear_warns_nothing() -> None:
    case = next(c for c in CASES if c.name == "linear_dynamic")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lowered, _, _ = quantize(BACKEND, case, (2, 4, 4, 4))
    assert statuses(lowered)["_0"] == "lowered"


def test_fp16_linear_is_not_offered_since_qnnpack_has_no_fp16_kernel() -> None:
    case = next(c for c in ALL_CASES if c.name == "linear_fp16")
    lowered, _, _ = quantize(BACKEND, case, (2, 4, 4, 4))
    (entry,) = [e for e in fxquant.explain(lowered).entries() if e.op == "call_module"]
    assert entry.status == "skipped"


def test_lowered_model_runs_inside_and_outside_inference_mode() -> None:
    lowered, inputs = _residual()
    with torch.inference_mode():
        inside = lowered(*inputs)
    with torch.no_grad():
        outside = lowered(*inputs)
    assert torch.equal(inside, outside)
