"""Prepared and converted models survive torch.save; calibration survives a state_dict."""

from __future__ import annotations

import io

import fxquant
import pytest
import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.max_pool2d is a closure pickle cannot name: the backend config holds it
        x = F.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.linear(x.mean((2, 3)))


def _prepared() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    mapping = fxquant.get_default_qconfig_mapping("reference")
    return fxquant.prepare_fx(Net().eval(), mapping, (torch.randn(1, 3, 8, 8),))


def _reload(model: torch.nn.Module) -> torch.nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded: torch.nn.Module = torch.load(buffer, weights_only=False)
    return loaded


def test_a_prepared_model_saved_whole_loads_and_calibrates_the_same() -> None:
    prepared = _prepared()
    x = torch.randn(2, 3, 8, 8)
    prepared(x)
    loaded = _reload(prepared)
    torch.testing.assert_close(loaded(x), prepared(x), rtol=0, atol=0)


def test_converting_a_reloaded_prepared_model_says_to_convert_before_saving() -> None:
    loaded = _reload(_prepared())
    with pytest.raises(TypeError, match="loses its flow state: convert before saving"):
        fxquant.convert_to_reference_fx(loaded)


def test_calibration_moves_through_a_state_dict_into_a_freshly_prepared_model() -> None:
    calibrated, fresh = _prepared(), _prepared()
    x = torch.randn(4, 3, 8, 8)
    calibrated(x)
    fresh.load_state_dict(calibrated.state_dict())
    expected = fxquant.convert_to_reference_fx(calibrated)(x)
    torch.testing.assert_close(fxquant.convert_to_reference_fx(fresh)(x), expected, rtol=0, atol=0)


def test_a_converted_model_saved_whole_gives_identical_outputs() -> None:
    prepared = _prepared()
    x = torch.randn(2, 3, 8, 8)
    prepared(x)
    converted = fxquant.convert_to_reference_fx(prepared)
    torch.testing.assert_close(_reload(converted)(x), converted(x), rtol=0, atol=0)
