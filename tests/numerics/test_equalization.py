"""Input-weight equalization beyond torch.ao (issue 23): folding, alpha, shared inputs, errors."""

from __future__ import annotations

import copy
import inspect

import fxquant
import pytest
import torch
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.flow import convert_fx, convert_to_reference_fx, explain, prepare_fx, prepare_qat_fx
from fxquant.flow.equalization.prepare import EQUALIZATION_KEY
from fxquant.numerics import (
    EqualizationQConfig,
    InputEqualizationObserver,
    compare,
    default_equalization_qconfig,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

HIDDEN = 16
GAIN = torch.ones(HIDDEN)
GAIN[3], GAIN[11] = 40.0, 25.0  # outlier channels after the norm, as in BERT


class Block(nn.Module):
    """LayerNorm feeding query/key/value, as a pre-norm transformer block does."""

    def __init__(self, residual: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)  # the same weights whatever ran before
        self.residual = residual
        self.norm = nn.LayerNorm(HIDDEN)
        self.q = nn.Linear(HIDDEN, HIDDEN)
        self.k = nn.Linear(HIDDEN, HIDDEN)
        self.v = nn.Linear(HIDDEN, HIDDEN)
        with torch.no_grad():
            self.norm.weight.copy_(GAIN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        y = self.q(h) + self.k(h) + self.v(h)
        return y + h if self.residual else y


def _data() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(8, 6, HIDDEN, generator=generator) for _ in range(3)]


def _equalization(alpha: float = 0.5) -> fxquant.QConfigMapping:
    qconfig = EqualizationQConfig(InputEqualizationObserver.with_args(alpha=alpha))
    return fxquant.QConfigMapping().set_object_type(nn.Linear, qconfig)


def _prepared(
    model: nn.Module, equalization: fxquant.QConfigMapping | None, backend: str = "reference"
) -> torch.fx.GraphModule:
    data = _data()
    prepared = prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping(backend),
        (data[0],),
        None,
        equalization,
        fxquant.get_backend_config(backend),
    )
    for batch in data:
        prepared(batch)
    return prepared


def _sqnr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    return float(10 * torch.log10(expected.pow(2).sum() / (expected - actual).pow(2).sum()))


def test_prepare_fx_takes_the_seed_order_with_backend_config_sixth() -> None:
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    backend = fxquant.get_backend_config("qnnpack")
    mapping = fxquant.get_default_qconfig_mapping("qnnpack")
    prepared = prepare_fx(model, mapping, (torch.randn(2, 4),), None, None, backend)
    _ = prepared(torch.randn(2, 4))
    assert convert_fx(prepared).meta["fxquant"].backend_config.name == "qnnpack"
    assert "_equalization_config" not in inspect.signature(prepare_qat_fx).parameters


def test_a_backend_config_in_the_equalization_position_is_refused_with_the_fix() -> None:
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    backend = fxquant.get_backend_config("reference")
    mapping = fxquant.get_default_qconfig_mapping("reference")
    with pytest.raises(ConfigTypeError, match=r"backend_config=\.\.\. by keyword"):
        prepare_fx(model, mapping, (torch.randn(2, 4),), None, backend)  # type: ignore[arg-type]
    with pytest.raises(ConfigTypeError, match="_equalization_config must be"):
        prepare_fx(model, mapping, (torch.randn(2, 4),), None, 0.5)  # type: ignore[arg-type]


def test_default_equalization_qconfig_is_importable_from_fxquant_but_not_in_all() -> None:
    from fxquant import default_equalization_qconfig as top_level

    assert top_level is default_equalization_qconfig
    assert "default_equalization_qconfig" not in fxquant.__all__
    assert top_level.input_activation().alpha == 0.5


def test_alpha_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"alpha=1\.5"):
        InputEqualizationObserver(alpha=1.5)


def test_layer_norm_feeding_qkv_takes_the_scale_so_no_op_is_added_and_error_drops() -> None:
    model = Block().eval()
    x = torch.cat(_data())
    plain = convert_to_reference_fx(_prepared(model, None))
    equalized = convert_to_reference_fx(_prepared(model, _equalization()))
    ops = [n.target for n in equalized.graph.nodes if n.op == "call_function"]
    assert torch.mul not in ops  # nothing extra runs at inference
    (pair,) = equalized.meta[EQUALIZATION_KEY]
    assert (pair.input, pair.linears, pair.applied) == ("norm", ("q", "k", "v"), "folded into norm")
    assert (
        "equalized: norm -> q, k, v (alpha 0.5): folded into norm"
        in explain(equalized, show=False).table()
    )
    with torch.no_grad():
        expected = model(x)
        assert _sqnr(expected, equalized(x)) > _sqnr(expected, plain(x)) + 2.0
    # compare knows the norm's output is scaled on purpose: it compares it scaled
    assert compare(model, equalized, x)["norm"].sqnr > 20.0


def test_an_input_that_also_feeds_the_residual_gets_a_mul_with_its_own_observer() -> None:
    model = Block(residual=True).eval()
    x = torch.cat(_data())
    equalized = convert_to_reference_fx(_prepared(model, _equalization()))
    (pair,) = equalized.meta[EQUALIZATION_KEY]
    assert pair.applied.startswith("mul node")
    assert "also feeds" in pair.applied
    mul = next(n for n in equalized.graph.nodes if n.target is torch.mul)
    assert mul.args[0].name == "norm"  # the float value: quantized once, after the scale
    plain = convert_to_reference_fx(_prepared(model, None))
    ours, theirs = compare(model, equalized, x), compare(model, plain, x)
    for name in ("q", "k", "v"):  # the residual add's error is the norm's, the same in both
        assert ours[name].local_sqnr > theirs[name].local_sqnr + 2.0


@settings(max_examples=5, deadline=None)
@given(alpha=st.sampled_from([0.0, 0.25, 0.75, 1.0]))
def test_alpha_is_the_migration_strength_of_smoothquant(alpha: float) -> None:
    model = Block().eval()
    reference = convert_to_reference_fx(_prepared(model, _equalization(alpha)))
    (pair,) = reference.meta[EQUALIZATION_KEY]
    with torch.no_grad():
        h = model.norm(torch.cat(_data())).reshape(-1, HIDDEN)
        x_range = h.amax(0) - h.amin(0)
        weights = torch.cat([model.q.weight, model.k.weight, model.v.weight])
        w_range = weights.amax(0) - weights.amin(0)
    expected = w_range ** (1 - alpha) / x_range**alpha
    torch.testing.assert_close(pair.scale, expected, rtol=1e-5, atol=0)


def test_convert_leaves_the_prepared_model_as_it_was() -> None:
    prepared = _prepared(Block().eval(), _equalization())
    before = copy.deepcopy(prepared.state_dict())
    first = convert_to_reference_fx(prepared)
    second = convert_to_reference_fx(prepared)
    after = prepared.state_dict()
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert torch.equal(value, after[key]), key
    x = _data()[0]
    with torch.no_grad():
        assert torch.equal(first(x), second(x))


def test_a_linear_whose_input_is_not_quantized_is_listed_as_not_equalized() -> None:
    model = nn.Sequential(nn.Linear(4, 4)).eval()
    mapping = fxquant.QConfigMapping()  # nothing quantized
    equalization = fxquant.QConfigMapping().set_object_type(nn.Linear, default_equalization_qconfig)
    reference = fxquant.get_backend_config("reference")  # no line on the backend chosen
    prepared = prepare_fx(model, mapping, (torch.randn(2, 4),), None, equalization, reference)
    (line,) = explain(prepared, show=False).notes()
    assert "not equalized: input not quantized" in line


def test_a_convolution_is_listed_as_not_equalized() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 2)).eval()
    equalization = fxquant.QConfigMapping().set_global(default_equalization_qconfig)
    prepared = prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping("reference"),
        (torch.randn(2, 1, 4, 4),),
        None,
        equalization,
    )
    notes = explain(prepared, show=False).notes()
    assert any("not convolutions" in line for line in notes)
    assert any("-> _2 (alpha 0.5): observing" in line for line in notes)


class SplitWeight(nn.Module):
    """Two F.linear on one input, one weight split from a packed parameter in ``forward`` (as
    ``nn.MultiheadAttention`` does when query and key differ: ``nn.Transformer``'s decoder)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.packed = nn.Parameter(torch.randn(2 * HIDDEN, HIDDEN) / 4)
        self.plain = nn.Parameter(torch.randn(HIDDEN, HIDDEN) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, _ = self.packed.chunk(2)
        h = x * GAIN
        return nn.functional.linear(h, first) + nn.functional.linear(h, self.plain)


def test_a_weight_computed_in_forward_is_listed_and_the_parameter_one_still_equalized() -> None:
    model = SplitWeight().eval()
    equalization = fxquant.QConfigMapping().set_global(default_equalization_qconfig)
    prepared = _prepared(model, equalization)  # convert asserted on the computed weight
    notes = explain(prepared, show=False).notes()
    assert sum("weight is computed in forward" in line for line in notes) == 1
    assert sum("observing" in line for line in notes) == 1
    plain = _prepared(SplitWeight().eval(), None)
    x = _data()[0]
    with torch.no_grad():
        expected = model(x)
        equalized = _sqnr(expected, convert_fx(prepared)(x))
        assert equalized >= _sqnr(expected, convert_fx(plain)(x)) - 0.5
        assert equalized >= 25


class SharedLayer(nn.Module):
    """One Linear run twice (ALBERT's shared layers): equalizing it per call scaled its one
    weight twice, with two scales, and the zoo's ALBERT fell to 1 dB on tensorrt."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shared = nn.Linear(HIDDEN, HIDDEN)
        self.last = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.shared(x * GAIN)
        return self.last(self.shared(h * GAIN))


def test_a_weight_read_by_two_calls_is_listed_and_the_others_still_equalized() -> None:
    model = SharedLayer().eval()
    equalization = fxquant.QConfigMapping().set_global(default_equalization_qconfig)
    prepared = _prepared(model, equalization)
    notes = explain(prepared, show=False).notes()
    assert sum("read by 2 calls" in line for line in notes) == 2
    assert sum("observing" in line for line in notes) == 1  # last
    plain = _prepared(SharedLayer().eval(), None)
    x = _data()[0]
    with torch.no_grad():
        expected = model(x)
        equalized = _sqnr(expected, convert_fx(prepared)(x))
        assert equalized >= _sqnr(expected, convert_fx(plain)(x)) - 0.5
        assert equalized >= 20  # 0.1 dB when the shared weight was scaled twice
