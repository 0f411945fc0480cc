from __future__ import annotations

import importlib
import io
from types import ModuleType
from typing import Any

import pytest
import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.nn import intrinsic as nni
from fxquant.nn import reference as ref
from fxquant.nn.intrinsic import qat as nniqat
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from tests import oracle
from tests.nn.helpers import tiny_qconfig

QUINT8 = getattr(torch, "quint8", torch.uint8)
QINT8 = getattr(torch, "qint8", torch.int8)
RANGES = {QUINT8: (0, 255), QINT8: (-128, 127)}


def _ao_reference() -> ModuleType:
    """torch.ao's reference modules (the test skips when torch.ao is gone)."""
    oracle.load()
    with oracle.quiet():
        return importlib.import_module("torch.ao.nn.quantized.reference")


def _oracle_pair(name: str, float_module: nn.Module, qparams: dict[str, Any]) -> tuple[Any, Any]:
    ours = getattr(ref, name).from_float(float_module, qparams)
    with oracle.quiet():
        theirs = getattr(_ao_reference(), name).from_float(float_module, qparams)
    return ours, theirs


def _assert_same_as_oracle(ours: Any, theirs: Any, *inputs: torch.Tensor) -> None:
    with oracle.quiet():
        expected = theirs(*inputs)
        expected_q = theirs.get_quantized_weight()
    assert torch.equal(ours(*inputs), expected)
    quantized = ours.get_quantized_weight()
    assert not quantized.is_quantized
    assert torch.equal(quantized, expected_q.int_repr())


@st.composite
def per_tensor_qparams(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from([QUINT8, QINT8]))
    low, high = RANGES[dtype]
    return {
        "qscheme": torch.per_tensor_affine,
        "dtype": dtype,
        "scale": draw(st.floats(1e-3, 0.2)),
        "zero_point": draw(st.integers(low, high)),
    }


def per_channel_qparams(
    draw: st.DrawFn, channels: int, axis: int, dtype: torch.dtype
) -> dict[str, Any]:
    low, high = RANGES[dtype]
    scales = draw(st.lists(st.floats(1e-3, 0.2), min_size=channels, max_size=channels))
    zero_points = draw(st.lists(st.integers(low, high), min_size=channels, max_size=channels))
    return {
        "qscheme": torch.per_channel_affine,
        "dtype": dtype,
        "scale": torch.tensor(scales, dtype=torch.float32),
        "zero_point": torch.tensor(zero_points, dtype=torch.int32),
        "axis": axis,
    }


@given(
    qparams=per_tensor_qparams(),
    in_features=st.integers(1, 8),
    out_features=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_linear_per_tensor_matches_torch_ao(
    qparams: dict[str, Any], in_features: int, out_features: int, seed: int
) -> None:
    torch.manual_seed(seed)
    ours, theirs = _oracle_pair("Linear", nn.Linear(in_features, out_features), qparams)
    _assert_same_as_oracle(ours, theirs, torch.randn(3, in_features))


@given(data=st.data(), out_features=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_linear_per_channel_matches_torch_ao(
    data: st.DataObject, out_features: int, seed: int
) -> None:
    torch.manual_seed(seed)
    dtype = data.draw(st.sampled_from([QUINT8, QINT8]))
    qparams = per_channel_qparams(data.draw, out_features, 0, dtype)
    ours, theirs = _oracle_pair("Linear", nn.Linear(5, out_features), qparams)
    _assert_same_as_oracle(ours, theirs, torch.randn(2, 5))


@given(
    data=st.data(),
    dim=st.sampled_from([1, 2, 3]),
    per_channel=st.booleans(),
    stride=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_conv_matches_torch_ao(
    data: st.DataObject, dim: int, per_channel: bool, stride: int, seed: int
) -> None:
    torch.manual_seed(seed)
    float_conv = getattr(nn, f"Conv{dim}d")(2, 4, 3, stride=stride, padding=1)
    if per_channel:
        qparams = per_channel_qparams(data.draw, 4, 0, QINT8)
    else:
        qparams = data.draw(per_tensor_qparams())
    ours, theirs = _oracle_pair(f"Conv{dim}d", float_conv, qparams)
    _assert_same_as_oracle(ours, theirs, torch.randn(1, 2, *([5] * dim)))


@given(
    data=st.data(),
    dim=st.sampled_from([1, 2, 3]),
    per_channel=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_conv_transpose_matches_torch_ao(
    data: st.DataObject, dim: int, per_channel: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    float_conv = getattr(nn, f"ConvTranspose{dim}d")(2, 3, 3, stride=2, output_padding=1)
    if per_channel:
        # a transposed weight is (in, out, *k): output channels are axis 1
        qparams = per_channel_qparams(data.draw, 3, 1, QINT8)
    else:
        qparams = data.draw(per_tensor_qparams())
    ours, theirs = _oracle_pair(f"ConvTranspose{dim}d", float_conv, qparams)
    _assert_same_as_oracle(ours, theirs, torch.randn(1, 2, *([3] * dim)))


def _float_qparams(weight: torch.Tensor) -> dict[str, Any]:
    low, high = weight.min(1).values, weight.max(1).values
    scale = ((high - low) / 255).clamp_min(1e-6)  # a one-column table has max == min
    return {
        "qscheme": torch.per_channel_affine_float_qparams,
        "dtype": QUINT8,
        "scale": scale,
        "zero_point": -low / scale,
        "axis": 0,
    }


@given(rows=st.integers(2, 12), dim=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_embeddings_with_float_qparams_match_torch_ao(rows: int, dim: int, seed: int) -> None:
    torch.manual_seed(seed)
    indices = torch.randint(0, rows, (7,))
    emb = nn.Embedding(rows, dim)
    ours, theirs = _oracle_pair("Embedding", emb, _float_qparams(emb.weight.detach()))
    _assert_same_as_oracle(ours, theirs, indices)
    bag = nn.EmbeddingBag(rows, dim, mode="sum")
    ours, theirs = _oracle_pair("EmbeddingBag", bag, _float_qparams(bag.weight.detach()))
    _assert_same_as_oracle(ours, theirs, indices, torch.tensor([0, 3]))


@given(qparams=per_tensor_qparams(), seed=st.integers(0, 2**16))
def test_weight_error_is_at_most_half_a_step_inside_the_range(
    qparams: dict[str, Any], seed: int
) -> None:
    torch.manual_seed(seed)
    linear = nn.Linear(6, 4)
    low, high = RANGES[qparams["dtype"]]
    scale, zero_point = qparams["scale"], qparams["zero_point"]
    with torch.no_grad():  # keep the weight inside the representable range
        linear.weight.uniform_((low - zero_point) * scale, (high - zero_point) * scale)
    module = ref.Linear.from_float(linear, qparams)
    error = (module.get_weight() - linear.weight).abs().max()
    assert error <= scale / 2 * (1 + 1e-5)
    x = torch.randn(3, 6)
    bound = scale / 2 * x.abs().sum(1, keepdim=True) * (1 + 1e-4) + 1e-5
    assert ((module(x) - linear(x)).abs() <= bound).all()


def test_quant_range_limits_the_integer_weight() -> None:
    qparams = {
        "qscheme": "per_tensor_symmetric",
        "dtype": torch.int8,
        "scale": 0.001,
        "zero_point": 0,
        "quant_min": -7,
        "quant_max": 7,
    }
    module = ref.Linear.from_float(nn.Linear(8, 8), qparams)
    quantized = module.get_quantized_weight()
    assert quantized.dtype == torch.int8
    assert quantized.min() == -7
    assert quantized.max() == 7


@pytest.mark.parametrize(
    ("dtype", "plain"), [(QUINT8, torch.uint8), (QINT8, torch.int8), (torch.int8, torch.int8)]
)
def test_quantized_weight_is_a_plain_integer_tensor(dtype: torch.dtype, plain: torch.dtype) -> None:
    qparams = {"qscheme": torch.per_tensor_affine, "dtype": dtype, "scale": 0.1, "zero_point": 0}
    weight = ref.Conv2d.from_float(nn.Conv2d(1, 2, 1), qparams).get_quantized_weight()
    assert weight.dtype == plain
    assert not weight.is_quantized


def test_symmetric_qscheme_computes_like_affine_with_the_same_qparams() -> None:
    linear = nn.Linear(4, 4)
    base = {"dtype": QINT8, "scale": 0.02, "zero_point": 0}
    symmetric = ref.Linear.from_float(linear, {**base, "qscheme": torch.per_tensor_symmetric})
    affine = ref.Linear.from_float(linear, {**base, "qscheme": torch.per_tensor_affine})
    assert torch.equal(symmetric.get_weight(), affine.get_weight())


def test_fp16_weight_is_rounded_through_half_precision() -> None:
    linear = nn.Linear(4, 4)
    module = ref.Linear.from_float(
        linear, {"qscheme": torch.per_tensor_affine, "dtype": torch.float16}
    )
    assert module.get_quantized_weight().dtype == torch.float16
    assert torch.equal(module.get_weight(), linear.weight.detach().half().float())


def test_unquantized_weight_passes_through() -> None:
    linear = nn.Linear(4, 4)
    module = ref.Linear.from_float(linear, {"qscheme": None, "dtype": torch.float32})
    x = torch.randn(2, 4)
    assert torch.equal(module(x), linear(x))
    assert not module.is_weight_quantized()


def test_state_dict_round_trips_qparams_into_a_differently_configured_module() -> None:
    conv = nn.Conv2d(2, 3, 3)
    per_channel = {
        "qscheme": torch.per_channel_affine,
        "dtype": QUINT8,
        "scale": torch.tensor([0.01, 0.02, 0.03]),
        "zero_point": torch.tensor([100, 128, 140], dtype=torch.int32),
        "axis": 0,
    }
    source = ref.Conv2d.from_float(conv, per_channel)
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    buffer.seek(0)
    target = ref.Conv2d(2, 3, 3)  # default qparams: per-tensor
    target.load_state_dict(torch.load(buffer, weights_only=True))
    assert target.get_weight_qparams()["axis"] == 0
    assert target.weight_qscheme == torch.per_channel_affine
    assert torch.equal(target.weight_scale, per_channel["scale"])
    x = torch.randn(1, 2, 4, 4)
    assert torch.equal(target(x), source(x))


def test_from_float_accepts_a_fused_module_and_uses_its_root() -> None:
    conv = nn.Conv2d(2, 3, 3)
    qparams = {"qscheme": torch.per_tensor_affine, "dtype": QINT8, "scale": 0.02, "zero_point": 0}
    from_fused = ref.Conv2d.from_float(nni.ConvReLU2d(conv, nn.ReLU()), qparams)
    x = torch.randn(1, 2, 4, 4)
    assert torch.equal(from_fused(x), ref.Conv2d.from_float(conv, qparams)(x))
    linear = ref.Linear.from_float(nni.LinearReLU(nn.Linear(2, 2), nn.ReLU()), qparams)
    assert type(linear) is ref.Linear


def test_from_float_of_a_qat_conv_bn_folds_the_batch_norm() -> None:
    fused = nni.ConvBn2d(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3))
    fused.qconfig = tiny_qconfig()
    qat = nniqat.ConvBn2d.from_float(fused)
    qat(torch.randn(4, 2, 5, 5))  # move BN's running statistics
    qparams = {"qscheme": None, "dtype": torch.float32}
    module = ref.Conv2d.from_float(qat, qparams)
    assert torch.equal(module.weight, qat.to_float().weight)


def test_from_float_copies_parameters() -> None:
    linear = nn.Linear(2, 2)
    module = ref.Linear.from_float(linear, None)
    assert module.weight is not linear.weight
    assert torch.equal(module.weight, linear.weight)


def test_from_float_rejects_the_wrong_float_module() -> None:
    with pytest.raises(
        ConfigTypeError, match=r"reference Conv2d\.from_float expects a torch\.nn\.Conv2d"
    ):
        ref.Conv2d.from_float(nn.Conv1d(1, 1, 1), None)


def test_missing_qparams_key_is_named() -> None:
    with pytest.raises(ConfigError, match="needs the key 'axis'"):
        ref.Linear.from_float(
            nn.Linear(2, 2),
            {
                "qscheme": "per_channel_affine",
                "dtype": QINT8,
                "scale": torch.ones(2),
                "zero_point": torch.zeros(2),
            },
        )
    with pytest.raises(ConfigError, match="needs the key 'dtype'"):
        ref.Linear.from_float(nn.Linear(2, 2), {"qscheme": "per_tensor_affine"})


def test_unknown_qparams_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown keys \['scales'\]"):
        ref.Linear.from_float(
            nn.Linear(2, 2), {"qscheme": None, "dtype": torch.float32, "scales": 1}
        )


def test_quant_range_outside_the_dtype_is_refused() -> None:
    qparams = {
        "qscheme": "per_tensor_affine",
        "dtype": QINT8,
        "scale": 0.1,
        "zero_point": 0,
        "quant_min": 0,
        "quant_max": 255,
    }
    with pytest.raises(ConfigError, match=r"-128 <= quant_min <= quant_max <= 127"):
        ref.Linear.from_float(nn.Linear(2, 2), qparams)


def test_repr_names_reference_module_and_weight_scheme() -> None:
    module = ref.Linear.from_float(nn.Linear(2, 3), None)
    assert repr(module) == (
        "ReferenceLinear(in_features=2, out_features=3, bias=True, "
        f"weight_qscheme=per_tensor_affine, weight_dtype={torch.uint8})"
    )


@pytest.mark.parametrize("per_channel", [False, True])
def test_export_shows_quantize_dequantize_then_the_float_op(per_channel: bool) -> None:
    qparams: dict[str, Any] = {"qscheme": "per_tensor_affine", "scale": 0.1, "zero_point": 0}
    if per_channel:
        qparams = {
            "qscheme": "per_channel_affine",
            "scale": torch.full((3,), 0.1),
            "zero_point": torch.zeros(3, dtype=torch.int32),
            "axis": 0,
        }
    module = ref.Linear.from_float(nn.Linear(4, 3), {**qparams, "dtype": torch.int8})
    x = torch.randn(2, 4)
    program = torch.export.export(module, (x,))
    ops = [n.target._opname for n in program.graph.nodes if n.op == "call_function"]
    kind = "per_channel" if per_channel else "per_tensor"
    assert ops == [f"quantize_{kind}", f"dequantize_{kind}", "linear"]
    assert torch.equal(program.module()(x), module(x))
