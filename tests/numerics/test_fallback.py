"""fxquant.numerics.fallback: the fewest float patterns that meet a budget (issue 23)."""

from __future__ import annotations

import json

import fxquant
import pytest
import torch
from fxquant.config import QConfig
from fxquant.errors import ConfigError, ConfigTypeError
from fxquant.flow import convert_fx, explain, prepare_fx
from fxquant.numerics import Budget, fallback
from fxquant.numerics.observer import MinMaxObserver, default_per_channel_weight_observer
from fxquant.tools import testing

from tests.flow.zoo import SmallCNN, seeded
from tests.numerics.planted import DOMINANT, SENSITIVE, Dominant, Planted, batches, outlier_batches

BACKEND = "fbgemm"


def test_fallback_starts_where_compare_points_and_its_first_step_improves_the_output() -> None:
    model, data = Dominant().eval(), outlier_batches()
    mapping = fxquant.get_default_qconfig_mapping("reference")
    result = fallback(model, mapping, data[0], data, 0.999)
    first = result.steps[1]
    assert (first.action, first.node) == ("keep float", DOMINANT)
    assert first.score > result.steps[0].score + 0.01  # mean cosine to the float outputs
    assert next(iter(result.sensitivity)) == DOMINANT  # compare's ranking, largest gain first
    assert result.met
    assert DOMINANT in result.float_nodes


def test_fallback_keeps_only_the_planted_layers_float() -> None:
    model, data = Planted().eval(), batches()
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    backend = fxquant.get_backend_config(BACKEND)
    result = fallback(model, mapping, (data[0],), data, 0.999, backend_config=backend)
    assert result.met
    assert set(result.float_nodes) == set(SENSITIVE)
    assert set(list(result.sensitivity)[:2]) == set(SENSITIVE)  # ranked worst first
    assert result.steps[0].action == "quantize all"
    assert result.steps[0].score < 0.999
    assert result.score >= 0.999
    # the mapping is the answer: reusable, serializable
    again = prepare_fx(model, result.qconfig_mapping, (data[0],), backend_config=backend)
    statuses = {e.node: str(e.status) for e in explain(again, show=False).entries()}
    assert {statuses[name] for name in SENSITIVE} == {"float"}
    assert statuses["fc1"] == statuses["fc3"] == statuses["fc5"] == "quantized"
    loaded = fxquant.QConfigMapping.from_json(result.qconfig_mapping.to_json())
    assert loaded.to_dict() == result.qconfig_mapping.to_dict()
    plain = json.loads(json.dumps(result.to_dict()))
    assert set(plain["float_nodes"]) == set(SENSITIVE)
    assert "budget met" in result.table()
    assert "fc2" in result.table()


def test_a_model_within_budget_keeps_everything_quantized() -> None:
    model, data = Planted().eval(), batches()
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    result = fallback(model, mapping, (data[0],), data, Budget(0.0, evaluate=lambda quantized: 1.0))
    assert result.met
    assert result.float_nodes == ()
    assert len(result.steps) == 1


def test_an_unreachable_budget_returns_the_best_try_and_says_not_met() -> None:
    model, data = Planted().eval(), batches(2)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    result = fallback(model, mapping, (data[0],), data, Budget(2.0, evaluate=lambda q: 0.5))
    assert not result.met
    assert "NOT met" in result.table()


def test_bad_budget_and_empty_calibration_data_are_refused() -> None:
    model, data = Planted().eval(), batches(1)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    with pytest.raises(ConfigTypeError, match="budget must be"):
        fallback(model, mapping, (data[0],), data, "0.99")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="calibration_data is empty"):
        fallback(model, mapping, (data[0],), [], 0.99)
    with pytest.raises(ConfigTypeError, match="must be a callable"):
        Budget(0.5, evaluate=0.9)  # type: ignore[arg-type]


@pytest.mark.slow  # trains the digits CNN (a few seconds on one thread)
def test_digits_cnn_meets_an_accuracy_budget_with_the_fewest_float_patterns() -> None:
    pytest.importorskip("sklearn.datasets")
    digits = testing.load_digits()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = testing.train_digits_classifier(seeded(SmallCNN), digits, steps=300)
    finally:
        torch.set_num_threads(threads)
    float_accuracy = testing.digits_accuracy(model, digits)
    # 3-bit activations: the whole model quantized loses several points, so some must stay float
    three_bits = QConfig(
        activation=MinMaxObserver.with_args(quant_min=0, quant_max=7),
        weight=default_per_channel_weight_observer,
    )
    mapping = fxquant.QConfigMapping().set_global(three_bits)
    budget = Budget.accuracy_drop(
        lambda quantized: testing.digits_accuracy(quantized, digits), float_accuracy, 1.0
    )
    calibration = list(digits.train_x[:256].split(64))
    backend = fxquant.get_backend_config("reference")
    result = fallback(
        model, mapping, (calibration[0],), calibration, budget, backend_config=backend
    )
    assert result.met, result.table()
    assert result.steps[0].score < budget.min_score  # fallback was needed
    assert 0 < len(result.float_nodes) < len(result.sensitivity)
    # fewest: giving back any one of them breaks the budget
    for name in result.float_nodes:
        trial = [n for n in result.float_nodes if n != name]
        tries = [s for s in result.steps if s.action == "give back" and s.node == name]
        step = tries[-1] if tries else None
        assert step is not None
        assert not step.kept
        assert set(step.float_nodes) == set(trial)
    for name in result.float_nodes:
        assert name in result.table()
    prepared = prepare_fx(model, result.qconfig_mapping, (calibration[0],), backend_config=backend)
    with torch.no_grad():
        for batch in calibration:
            prepared(batch)
    assert testing.digits_accuracy(convert_fx(prepared), digits) == pytest.approx(result.score)
