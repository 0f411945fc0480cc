"""A lowered model called with an input its kernels cannot take names the failing node."""

from __future__ import annotations

import copy
import re

import fxquant
import pytest
import torch
from fxquant.errors import KernelCallError
from fxquant.flow.state import flow_state
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

BACKENDS = [
    b for b in ("x86", "fbgemm", "qnnpack", "onednn", "reference") if b in fxquant.list_backends()
]


def _lowered(backend: str) -> torch.fx.GraphModule:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5)).eval()
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    prepared(x)
    return fxquant.convert_fx(prepared)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrong_input_shape_names_the_node_its_module_and_the_shapes(backend: str) -> None:
    lowered = _lowered(backend)
    for model in (lowered, copy.deepcopy(lowered)):
        with pytest.raises(KernelCallError) as channels:
            model(torch.randn(2, 4, 8, 8))
        # an nn.Sequential's forward is torch's: no line of the user's to show (the
        # prepare_fx call would mislead), the module path says which layer
        assert re.match(
            r"node '_0' \(call_module \w+, module path '0'\) "
            r"of the lowered model failed on inputs of shape \(2, 4, 8, 8\)",
            str(channels.value),
        )
        with pytest.raises(KernelCallError) as features:
            model(torch.randn(2, 3, 10, 10))
        words = str(features.value)
        assert re.search(
            r"node '_3' \(call_module \w+, module path '3'\) "
            r"of the lowered model failed on inputs of shape \(2, 256\) ",
            words,
        )
        assert "(the model was called with (2, 3, 10, 10))" in words
        assert "check the call's inputs against the example inputs given to prepare_fx" in words
        assert isinstance(features.value, RuntimeError)  # what torch.ao's callers catch
        assert isinstance(features.value.__cause__, RuntimeError)  # the kernel's own words
    # the names the errors give are the report's (what explain() prints), not the lowered
    # graph's renamed nodes
    state = flow_state(lowered)
    assert state is not None
    assert {"_0", "_3"} <= {e.node for e in state.report.entries()}
    assert lowered(torch.randn(2, 3, 8, 8)).shape == (2, 5)


def test_an_inner_lowered_models_error_is_not_wrapped_twice() -> None:
    inner = _lowered(BACKENDS[0])
    outer = nn.Sequential(inner)
    with pytest.raises(KernelCallError) as info:
        outer(torch.randn(2, 4, 8, 8))
    assert not isinstance(info.value.__cause__, KernelCallError)


@pytest.mark.parametrize("engine", ["qnnpack", "fbgemm"])
def test_a_dynamic_linear_given_other_features_raises_where_qnnpack_read_on(engine: str) -> None:
    engines = pytest.importorskip("fxquant_quantized_engine")
    from fxquant.nn import reference

    qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.int8, "scale": 0.1}
    linear = reference.Linear.from_float(nn.Linear(16, 2), {**qparams, "zero_point": 0})
    kernel = engines.QuantizedLinearDynamic(engine, linear)
    assert kernel(torch.randn(3, 16)).shape == (3, 2)
    for features in (12, 20):
        with pytest.raises(
            RuntimeError, match=rf"takes 16 input features .* shape \(3, {features}\)"
        ):
            kernel(torch.randn(3, features))


def test_the_lowered_model_keeps_the_users_class_name() -> None:
    """fx names a traced model's class after the user's; the lowered model's repr keeps it."""

    class TinyNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    x = torch.randn(2, 4)
    backend = fxquant.get_backend_config("x86")
    prepared = fxquant.prepare_fx(
        TinyNet().eval(), fxquant.get_default_qconfig_mapping("x86"), (x,), backend_config=backend
    )
    prepared(x)
    lowered = fxquant.convert_fx(prepared)
    assert type(lowered).__name__ == "TinyNet"
    assert repr(lowered).startswith("TinyNet(")


class Wrapped(nn.Module):
    """A Sequential called from the user's forward: that line is the layers' source."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)  # the line the errors name

    forward_line = forward.__code__.co_firstlineno + 1


def test_a_layer_of_a_sequential_called_from_a_forward_names_that_line() -> None:
    x = torch.randn(2, 3, 8, 8)
    prepared = fxquant.prepare_fx(
        Wrapped().eval(),
        fxquant.get_default_qconfig_mapping(BACKENDS[0]),
        (x,),
        backend_config=fxquant.get_backend_config(BACKENDS[0]),
    )
    prepared(x)
    with pytest.raises(KernelCallError) as error:
        fxquant.convert_fx(prepared)(torch.randn(2, 3, 10, 10))
    assert f"module path 'body.3', {__file__}:{Wrapped.forward_line})" in str(error.value)


class NormFirst(nn.Module):
    """A LayerNorm left float before a quantized Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(tokens))


def _converted(model: nn.Module, backend: str, x: torch.Tensor) -> tuple[nn.Module, nn.Module]:
    """(reference, lowered) models of ``model``, calibrated on ``x``."""
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    prepared = fxquant.prepare_fx(model.eval(), mapping, (x,), backend_config=config)
    prepared(x)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    return reference, fxquant.convert_fx(prepared)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "reference"])  # quantizes it
def test_a_float64_input_reaching_a_float_op_names_the_input_its_dtype_and_the_fix(
    backend: str,
) -> None:
    x = torch.randn(3, 8)
    reference, lowered = _converted(NormFirst(), backend, x)
    with pytest.raises(RuntimeError):
        NormFirst()(x.double())  # the float model refuses it too
    with pytest.raises(RuntimeError):
        reference(x.double())
    with pytest.raises(KernelCallError) as error:
        lowered(x.double())
    words = str(error.value)
    assert "node 'norm' (call_module LayerNorm" in words
    assert "called with 'tokens' of dtype float64" in words
    assert "this node's other tensors are float32" in words
    assert "call it with float32 inputs (x.to(torch.float32))" in words
    assert "packed for" not in words  # not a shape problem


@settings(max_examples=12, deadline=None)
@given(
    backend=st.sampled_from(BACKENDS),
    dtype=st.sampled_from([torch.float64, torch.float16, torch.bfloat16]),
)
def test_another_float_dtype_quantized_at_the_boundary_runs_as_the_reference_model(
    backend: str, dtype: torch.dtype
) -> None:
    # the first op is quantized: the quantize step takes any float dtype, as the reference
    # model's does, and the result is the float32 cast's (int8 holds no more precision)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5))
    reference, lowered = _converted(model, backend, x)
    given = x.to(dtype)
    out = lowered(given)
    assert out.dtype == torch.float32
    assert torch.equal(out, lowered(given.float()))
    assert torch.equal(reference(given), reference(given.float()))
