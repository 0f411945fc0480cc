"""fxquant.numerics.qdq: quantize/dequantize on plain integer tensors (torch.ops.fxquant.*)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.numerics import qdq
from hypothesis import given
from hypothesis import strategies as st

RANGES = {torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int32: (-(2**31), 2**31 - 1)}


@given(
    dtype=st.sampled_from([torch.uint8, torch.int8]),
    exponent=st.integers(-20, 10),
    data=st.data(),
)
def test_values_on_the_grid_round_trip_exactly(dtype: torch.dtype, exponent: int, data: Any):
    low, high = RANGES[dtype]
    zero_point = data.draw(st.integers(low, high))
    levels = data.draw(st.lists(st.integers(low, high), min_size=1, max_size=50))
    scale = 2.0**exponent  # a power of two keeps (level - zp) * scale exact
    x = (torch.tensor(levels, dtype=torch.float64) - zero_point).mul(scale).float()
    q = qdq.quantize_per_tensor(x, scale, zero_point, low, high, dtype)
    assert q.tolist() == levels
    assert torch.equal(qdq.dequantize_per_tensor(q, scale, zero_point, low, high, dtype), x)


@given(
    values=st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=50),
    quant_max=st.integers(1, 255),
)
def test_quantize_clamps_to_a_custom_range(values: list[float], quant_max: int):
    q = qdq.quantize_per_tensor(torch.tensor(values), 0.5, 0, 0, quant_max, torch.uint8)
    assert int(q.min()) >= 0
    assert int(q.max()) <= quant_max


def test_quantize_rounds_half_to_even_like_torch_kernels():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5])
    q = qdq.quantize_per_tensor(x, 1.0, 0, -128, 127, torch.int8)
    assert q.tolist() == [0, 2, 2, 0, -2]


def test_quantized_dtype_names_give_plain_integer_tensors():
    quint8 = getattr(torch, "quint8", torch.uint8)
    q = qdq.quantize_per_tensor(torch.tensor([1.0]), 0.1, 0, 0, 255, quint8)
    assert q.dtype == torch.uint8
    assert q.tolist() == [10]


def test_dequantize_honours_out_dtype():
    q = torch.tensor([3, 8], dtype=torch.uint8)
    y = qdq.dequantize_per_tensor(q, 0.5, 2, 0, 255, torch.uint8, out_dtype=torch.float16)
    assert y.dtype == torch.float16
    assert y.tolist() == [0.5, 3.0]


def test_per_channel_quantize_uses_each_channels_qparams():
    x = torch.tensor([[1.0, -1.0], [2.0, 4.0]])
    scales, zero_points = torch.tensor([0.5, 0.25]), torch.tensor([1, -2])
    q = qdq.quantize_per_channel(x, scales, zero_points, 1, -128, 127, torch.int8)
    assert q.tolist() == [[3, -6], [5, 14]]
    back = qdq.dequantize_per_channel(q, scales, zero_points, 1, -128, 127, torch.int8)
    assert torch.equal(back, x)


def test_choose_qparams_covers_zero_and_the_data_range():
    scale, zero_point = qdq.choose_qparams_per_tensor(
        torch.tensor([-1.0, 3.0]), 0, 255, torch.uint8
    )
    assert scale.dtype == torch.float64
    assert float(scale) == pytest.approx(4.0 / 255)
    assert int(zero_point) == 64


def test_a_range_outside_the_dtype_is_rejected_with_the_fix():
    with pytest.raises(ConfigError) as info:
        qdq.quantize_per_tensor(torch.ones(2), 0.1, 0, 0, 300, torch.uint8)
    assert str(info.value) == (
        "quant_min=0, quant_max=300 do not fit dtype torch.uint8; "
        "expected 0 <= quant_min < quant_max <= 255"
    )


def test_quantizing_an_integer_tensor_is_a_type_error():
    with pytest.raises(ConfigTypeError, match="floating point input, got a tensor of dtype"):
        qdq.quantize_per_tensor(torch.ones(2, dtype=torch.int32), 0.1, 0, 0, 255, torch.uint8)


def test_per_channel_scales_must_match_the_axis_size():
    with pytest.raises(ConfigError, match="one value per channel of axis 0"):
        qdq.quantize_per_channel(
            torch.ones(3, 2), torch.ones(2), torch.zeros(2), 0, 0, 255, torch.uint8
        )


def test_per_tensor_tensor_overload_rejects_several_scales():
    with pytest.raises(ConfigError, match="scale must hold one value"):
        qdq.quantize_per_tensor(torch.ones(2), torch.ones(2), torch.tensor(0), 0, 255, torch.uint8)


def test_ops_are_registered_with_float_and_tensor_overloads():
    for name in ("quantize_per_tensor", "dequantize_per_tensor"):
        assert set(getattr(torch.ops.fxquant, name).overloads()) == {"default", "tensor"}
    for name in ("quantize_per_channel", "dequantize_per_channel", "choose_qparams_per_tensor"):
        assert getattr(torch.ops.fxquant, name).overloads() == ["default"]


def test_meta_tensors_get_the_output_dtype_and_shape():
    x = torch.empty(2, 3, device="meta")
    q = qdq.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
    assert (q.device.type, q.dtype, q.shape) == ("meta", torch.int8, (2, 3))
    y = qdq.dequantize_per_channel(
        q, torch.ones(2, device="meta"), torch.zeros(2, device="meta"), 0, -128, 127, torch.int8
    )
    assert (y.dtype, y.shape) == (torch.float32, (2, 3))


class StaticQDQ(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = qdq.quantize_per_tensor(x, 0.05, 3, 0, 255, torch.uint8)
        y = qdq.dequantize_per_tensor(q, 0.05, 3, 0, 255, torch.uint8)
        qc = qdq.quantize_per_channel(
            y, torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, -128, 127, torch.int8
        )
        return qdq.dequantize_per_channel(
            qc, torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, -128, 127, torch.int8
        )


class DynamicQDQ(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, zero_point = qdq.choose_qparams_per_tensor(x, 0, 255, torch.uint8)
        q = qdq.quantize_per_tensor(x, scale, zero_point, 0, 255, torch.uint8)
        return qdq.dequantize_per_tensor(q, scale, zero_point, 0, 255, torch.uint8)


def fxquant_targets(graph: torch.fx.Graph) -> list[str]:
    return [
        str(node.target)
        for node in graph.nodes
        if node.op == "call_function" and str(node.target).startswith("fxquant.")
    ]


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (
            StaticQDQ(),
            [
                "fxquant.quantize_per_tensor.default",
                "fxquant.dequantize_per_tensor.default",
                "fxquant.quantize_per_channel.default",
                "fxquant.dequantize_per_channel.default",
            ],
        ),
        (
            DynamicQDQ(),
            [
                "fxquant.choose_qparams_per_tensor.default",
                "fxquant.quantize_per_tensor.tensor",
                "fxquant.dequantize_per_tensor.tensor",
            ],
        ),
    ],
)
def test_torch_export_keeps_fxquant_ops_and_runs(module: torch.nn.Module, expected: list[str]):
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(0))
    exported = torch.export.export(module, (x,))
    assert fxquant_targets(exported.graph) == expected
    assert torch.equal(exported.module()(x), module(x))


def test_fx_symbolic_trace_records_the_ops():
    traced = torch.fx.symbolic_trace(StaticQDQ())
    assert fxquant_targets(traced.graph) == [
        "fxquant.quantize_per_tensor.default",
        "fxquant.dequantize_per_tensor.default",
        "fxquant.quantize_per_channel.default",
        "fxquant.dequantize_per_channel.default",
    ]


def test_no_code_path_warns():
    x = torch.randn(2, 3, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        StaticQDQ()(x)
        DynamicQDQ()(x.detach())
        qdq.quantize_per_tensor(x, 0.1, 0, 0, 255, getattr(torch, "quint8", torch.uint8))
    assert [str(w.message) for w in caught] == []


def test_choose_qparams_accepts_an_activation_that_requires_grad_without_warning() -> None:
    # dynamic quantization runs on activations inside autograd-enabled forwards
    x = torch.tensor([-1.0, 3.0], requires_grad=True)
    scale, zero_point = qdq.choose_qparams_per_tensor(x, 0, 255, torch.uint8)
    assert (round(float(scale), 6), int(zero_point)) == (0.015686, 64)


@given(
    low=st.floats(-1e4, 1e4, allow_nan=False, width=32),
    width=st.floats(0.0, 1e4, allow_nan=False, width=32),
    signed=st.booleans(),
)
def test_qparams_for_a_range_are_those_chosen_from_a_tensor_with_that_range(
    low: float, width: float, signed: bool
) -> None:
    # a dynamic kernel computes the range once and asks for the qparams as numbers (#12)
    x = torch.tensor([low, low + width], dtype=torch.float32)
    quant_min, quant_max, dtype = (-128, 127, torch.int8) if signed else (0, 255, torch.uint8)
    scale, zero_point = qdq.choose_qparams_per_tensor(x, quant_min, quant_max, dtype)
    low_, high_ = (float(v) for v in x)
    assert qdq.qparams_for_range(low_, high_, quant_min, quant_max) == (
        scale.item(),
        zero_point.item(),
    )


# --- per token (#23: XNNPACK's dynamic fully-connected input) ---------------------------------


@st.composite
def token_rows(draw: Any) -> torch.Tensor:
    rows, width = draw(st.integers(1, 6)), draw(st.integers(1, 40))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    magnitude = 10.0 ** draw(st.integers(-4, 4))
    offset = draw(st.floats(-3, 3))
    return (torch.randn(2, rows, width, generator=gen) + offset) * magnitude


@given(x=token_rows())
def test_each_token_gets_a_grid_that_covers_zero_and_its_own_range(x: torch.Tensor) -> None:
    scales, zero_points = qdq.choose_qparams_per_token_asymmetric(x, torch.int8)
    assert scales.shape == zero_points.shape == (*x.shape[:-1], 1)
    assert scales.dtype == torch.float64
    assert zero_points.dtype == torch.int64
    assert int(zero_points.min()) >= -128
    assert int(zero_points.max()) <= 127
    low = x.amin(-1, keepdim=True).clamp(max=0).double()
    high = x.amax(-1, keepdim=True).clamp(min=0).double()
    # the grid spans the row's range (and 0) in 255 steps, to float32 rounding
    expected = ((high - low) / 255).clamp(min=torch.finfo(torch.float32).eps)
    assert torch.allclose(scales, expected, rtol=1e-6)
    q = qdq.quantize_per_token(x, scales, zero_points, -128, 127, torch.int8)
    back = qdq.dequantize_per_token(q, scales, zero_points, -128, 127, torch.int8)
    assert q.dtype == torch.int8
    assert back.dtype == torch.float32
    # every value within one step of its row's grid (half a step, and the zero point's rounding)
    assert bool(((back - x).abs() <= scales.float() * 1.0001).all())


@given(data=st.data())
def test_per_token_values_on_the_grid_round_trip_exactly(data: Any) -> None:
    rows = data.draw(st.integers(1, 5))
    exponents = data.draw(st.lists(st.integers(-12, 6), min_size=rows, max_size=rows))
    zero_points = data.draw(st.lists(st.integers(-128, 127), min_size=rows, max_size=rows))
    levels = [
        data.draw(st.lists(st.integers(-128, 127), min_size=7, max_size=7)) for _ in exponents
    ]
    scales = torch.tensor([[2.0**e] for e in exponents], dtype=torch.float64)
    zps = torch.tensor([[z] for z in zero_points])
    x = ((torch.tensor(levels) - zps).double() * scales).float()
    q = qdq.quantize_per_token(x, scales, zps, -128, 127, torch.int8)
    assert q.tolist() == levels
    assert torch.equal(qdq.dequantize_per_token(q, scales, zps, -128, 127, torch.int8), x)


def test_per_token_quantize_rounds_half_to_even_in_float32() -> None:
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5]])
    q = qdq.quantize_per_token(x, torch.ones(1, 1), torch.zeros(1, 1), -128, 127, torch.int8)
    assert q.tolist() == [[0, 2, 2, 0, -2]]


def test_a_token_of_zeros_gets_the_smallest_scale_and_quantizes_to_its_zero_point() -> None:
    x = torch.zeros(1, 2, 4)
    scales, zero_points = qdq.choose_qparams_per_token_asymmetric(x)
    assert float(scales.max()) == torch.finfo(torch.float32).eps
    q = qdq.quantize_per_token(x, scales, zero_points, -128, 127, torch.int8)
    assert torch.equal(q.long(), zero_points.expand(1, 2, 4))


def test_per_token_qparams_must_hold_one_value_per_token() -> None:
    x = torch.randn(3, 4)
    with pytest.raises(ConfigError, match=r"one value per token .* shape \(3, 1\)"):
        qdq.quantize_per_token(x, torch.ones(4, 1), torch.zeros(4, 1), -128, 127, torch.int8)
    with pytest.raises(ConfigError, match="token dimension"):
        qdq.choose_qparams_per_token_asymmetric(torch.tensor(1.0))


def test_per_token_ops_export_with_their_shapes() -> None:
    class PerToken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scales, zero_points = qdq.choose_qparams_per_token_asymmetric(x)
            q = qdq.quantize_per_token(x, scales, zero_points, -128, 127, torch.int8)
            return qdq.dequantize_per_token(q, scales, zero_points, -128, 127, torch.int8)

    x = torch.randn(2, 3, 8)
    program = torch.export.export(PerToken(), (x,))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert "fxquant.quantize_per_token.default" in targets
    assert torch.equal(program.module()(x), PerToken()(x))


def _meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


@pytest.mark.parametrize("shape", [(3, 4, 5), (7,), (0, 4)], ids=["3-d", "1-d", "no rows"])
def test_every_op_gives_on_meta_tensors_the_shapes_and_dtypes_it_computes(
    shape: tuple[int, ...],
) -> None:
    """torch.export traces the ops on meta tensors: the kernels must answer there too."""
    ops, x = torch.ops.fxquant, torch.randn(shape)
    channels = shape[0]
    scales, zero_points = torch.rand(channels) + 0.1, torch.zeros(channels, dtype=torch.int64)
    token_scales, token_zps = qdq.choose_qparams_per_token_asymmetric(x)
    q8 = qdq.quantize_per_tensor(x, 0.1, 3, 0, 255, torch.uint8)
    calls = [
        (ops.quantize_per_tensor.default, (x, 0.1, 3, 0, 255, torch.uint8), {}),
        (
            ops.quantize_per_tensor.tensor,
            (x, torch.tensor(0.1), torch.tensor(3), 0, 255, torch.uint8),
            {},
        ),
        (
            ops.dequantize_per_tensor.tensor,
            (q8, torch.tensor(0.1), torch.tensor(3), 0, 255, torch.uint8),
            {"out_dtype": torch.float16},
        ),
        (ops.choose_qparams_per_tensor.default, (x, 0, 255, torch.uint8), {}),
        (ops.quantize_per_channel.default, (x, scales, zero_points, 0, -128, 127, torch.int8), {}),
        (ops.dequantize_per_channel.default, (q8, scales, zero_points, 0, 0, 255, torch.uint8), {}),
        (ops.choose_qparams_per_token_asymmetric.default, (x, torch.int8), {}),
        (ops.quantize_per_token.default, (x, token_scales, token_zps, -128, 127, torch.int8), {}),
        (
            ops.dequantize_per_token.default,
            (q8, token_scales, token_zps, 0, 255, torch.uint8, torch.float32),
            {},
        ),
    ]
    for op, args, kwargs in calls:
        real, meta = op(*args, **kwargs), op(*map(_meta, args), **kwargs)
        real, meta = (real, meta) if isinstance(real, tuple) else ((real,), (meta,))
        assert [(t.shape, t.dtype) for t in meta] == [(t.shape, t.dtype) for t in real], op
        assert all(t.is_meta for t in meta), op
