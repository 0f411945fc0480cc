"""Each pattern the backend quantizes, exported, delegated to XNNPACK and run in ExecuTorch.

Every case is quantized with the backend's static mapping (``static_qconfig_mapping``:
each op int8; the default's per-token Linear layers have their own cases), converted, exported
with ``to_executorch`` and run in ExecuTorch's runtime in this process
(:func:`fxquant.tools.testing.check_deployed`): every quantized node must run in
XNNPACK and the output must be within one quantization step of fxquant's
reference model. The ops XNNPACK has no kernel for must say so in the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from fxquant.registry import get_deployment
from fxquant.tools import testing
from fxquant.tools.testing import Binary, Case, Function, Sizes
from fxquant_executorch.qconfig import static_qconfig_mapping
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

BACKEND = "executorch"

# XNNPACK runs these on int8 (or, for avg pooling, upsampling, leaky relu, in float32
# between its own int8 conversions): all inside the delegate. Dynamic linears take an
# int8 dynamic qconfig (the shared case's is uint8): test_program.py tests them.
DELEGATED = {
    "linear",
    "linear_relu",
    "functional_linear",
    "conv1d",
    "conv2d",
    "conv2d_relu",
    "conv_bn_relu2d",
    "depthwise_conv2d",
    "conv_transpose2d",
    "add",
    "add_relu",
    "mul",
    "mul_relu",
    "cat",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "flatten",
    "reshape",
    "mean",
    "relu",
    "torch_relu",
    "hardtanh",
    "relu6",
    "functional_relu6",
    "leaky_relu",
    "batch_norm2d",
    "bn_relu2d",
}


def _img(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s, s)]


def _seq(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s)]


def _img2(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, s, s), (b, c, s, s)]


EXTRA = (
    Case("sub", lambda i, o: Binary(torch.sub), _img2),
    Case("slice", lambda i, o: Function(lambda x: x[:, :, 1:]), _img),
    Case("permute", lambda i, o: Function(lambda x: x.permute(0, 2, 3, 1)), _img),
    Case("mean_keepdim", lambda i, o: Function(lambda x: x.mean((2, 3), keepdim=True)), _img),
    Case(
        "upsample_bilinear",
        lambda i, o: Function(lambda x: F.interpolate(x, scale_factor=2.0, mode="bilinear")),
        _img,
    ),
    Case("pad", lambda i, o: nn.ConstantPad2d(1, 0.0), _img),
    Case("conv1d_relu", lambda i, o: nn.Sequential(nn.Conv1d(i, o, 3), nn.ReLU()), _seq),
    Case("linear_3d", lambda i, o: nn.Linear(i, o), lambda b, c, s: [(b, s, c)]),
)


def _static(backend: str) -> object:
    return static_qconfig_mapping()


# every pattern in XNNPACK's int8 kernels: the static mapping quantizes each op (the default
# keeps adds, relus and reshapes float and makes Linear dynamic per token, #23)
CASES = [
    dataclasses.replace(c, mapping=c.mapping or _static)
    for c in [c for c in testing.LOWERING_CASES if c.name in DELEGATED] + list(EXTRA)
]
# and the default mapping's Linear layers: dynamic int8 per token, float out
DEFAULT_LINEARS = [c for c in testing.LOWERING_CASES if c.name in ("linear", "linear_relu")]


def test_every_listed_case_exists() -> None:
    assert {c.name for c in testing.LOWERING_CASES} >= DELEGATED


@pytest.mark.parametrize("case", CASES, ids=str)
def test_pattern_runs_in_xnnpack_within_one_step_of_the_reference(case: Case) -> None:
    testing.check_deployed(BACKEND, case, (2, 4, 6, 8))


@pytest.mark.parametrize("case", DEFAULT_LINEARS, ids=str)
def test_the_default_per_token_linear_runs_in_xnnpack_as_the_reference_says(case: Case) -> None:
    testing.check_deployed(BACKEND, case, (2, 4, 6, 8))


KEY_CASES = [c for c in CASES if c.name in ("conv2d", "depthwise_conv2d", "linear", "add")]


@pytest.mark.parametrize("case", KEY_CASES, ids=str)
@settings(max_examples=3, deadline=None)
@given(sizes=st.tuples(*(st.integers(*bounds) for bounds in testing.SIZE_BOUNDS)))
def test_pattern_is_within_one_step_at_any_size(case: Case, sizes: Sizes) -> None:
    testing.check_deployed(BACKEND, case, sizes)


def _deployed_report(model: nn.Module, inputs: list[torch.Tensor]) -> dict[str, object]:
    converted, _ = testing.quantize_model(BACKEND, model.eval(), [inputs])
    deployment = get_deployment(BACKEND)
    assert deployment is not None
    program = deployment.deploy(converted, tuple(inputs))
    return {e.node: e for e in program.report.entries()}


def test_nearest_upsampling_runs_in_the_portable_runtime_and_says_so() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.Upsample(scale_factor=2.0))
    entries = _deployed_report(model, [torch.randn(1, 3, 4, 4)])
    upsample = entries["_1"]
    assert upsample.status == "reference"
    assert upsample.reason.code == "not_delegated"
    assert "aten::upsample_nearest2d" in upsample.reason.words
    assert "portable runtime, not XNNPACK" in upsample.reason.words
    assert entries["_0"].status == "lowered"


def test_an_embedding_is_looked_up_in_its_int8_table_by_the_portable_runtime(
    linear_input_step: Callable[..., float],
) -> None:
    model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 4))
    ids = torch.randint(0, 100, (2, 5))
    converted, reference = testing.quantize_model(BACKEND, model.eval(), [[ids]])
    deployment = get_deployment(BACKEND)
    assert deployment is not None
    program = deployment.deploy(converted, (ids,))
    entries = {e.node: e for e in program.report.entries()}
    assert "quantized_decomposed::embedding_byte" in entries["_0"].reason.words
    assert entries["_1"].status == "lowered"
    step = linear_input_step(reference, "1", (ids,))  # the Linear returns float (#23)
    with torch.no_grad():
        assert float((program(ids) - reference(ids)).abs().max()) <= step * 1.001
    # the table stays int8 in the program: 100 x 16 bytes, not 4x that
    assert program.size < 100 * 16 * 4


def test_batch_norm_patterns_are_chosen_by_class_whatever_their_functions_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a pattern's str holds its functions' addresses: F.relu at 0x...3d... once dropped
    # (BatchNorm2d, F.relu) from the backend in about one process of twenty
    from fxquant.config.backend import BackendPatternConfig
    from fxquant_executorch import patterns

    def relu_at_0x7f3d(x: torch.Tensor) -> torch.Tensor:
        return F.relu(x)

    given = [
        BackendPatternConfig((torch.nn.BatchNorm2d, relu_at_0x7f3d)),
        BackendPatternConfig((torch.nn.BatchNorm3d, F.relu)),
        BackendPatternConfig(torch.nn.BatchNorm2d),
    ]
    monkeypatch.setattr(patterns, "bn_configs", lambda static: given)
    kept = [c.pattern for c in patterns._batch_norm_configs([])]
    assert kept == [(torch.nn.BatchNorm2d, relu_at_0x7f3d), torch.nn.BatchNorm2d]
