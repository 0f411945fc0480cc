"""Every generic config validates and survives to_dict/from_dict and JSON."""

from __future__ import annotations

import importlib.util

import fxquant
import pytest
from fxquant.config.backend import BackendConfig, BackendPatternConfig
from fxquant.patterns import conv_add_configs, reference_pattern_configs
from fxquant.patterns.generic import weighted_dtype_configs


@pytest.fixture(scope="module")
def backend() -> BackendConfig:
    configs = reference_pattern_configs() + conv_add_configs(weighted_dtype_configs())
    return BackendConfig("reference").set_backend_pattern_configs(configs)


def test_every_pattern_is_configured_once(backend: BackendConfig) -> None:
    configs = reference_pattern_configs()
    assert len({c.normalized_pattern for c in configs}) == len(configs)
    assert len(configs) == 209, f"reference has {len(configs)} patterns"


def test_every_config_round_trips_through_its_dict(backend: BackendConfig) -> None:
    for config in backend.configs:
        assert BackendPatternConfig.from_dict(config.to_dict()) == config
    assert BackendConfig.from_dict(backend.to_dict()) == backend


def test_the_backend_round_trips_through_json(backend: BackendConfig) -> None:
    if importlib.util.find_spec("fxquant.config.serialize") is None:
        pytest.skip("fxquant.config.serialize is not written yet")
    text = backend.to_json()
    again = BackendConfig.from_json(text)
    assert again == backend
    assert again.to_json() == text


@pytest.mark.parametrize("name", fxquant.list_backends())
def test_every_installed_backend_round_trips_through_json(name: str) -> None:
    """A user saves any backend they can get by name, and reads the same config back."""
    backend = fxquant.get_backend_config(name)
    text = backend.to_json()
    again = BackendConfig.from_json(text)
    assert again == backend
    assert again.to_json() == text
