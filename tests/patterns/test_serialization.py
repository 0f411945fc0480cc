"""Every generic config validates and survives to_dict/from_dict and JSON."""

from __future__ import annotations

import hashlib
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


# sha256 of each backend's to_json text: the patterns in the order users see them
# in `fxquant show` and saved JSON. A change here is a change users see: update the
# digest only when the new order is meant. x86 adds 8 bfloat16 patterns on a CPU that
# computes bfloat16 (or under FXQUANT_X86_BF16=1): one digest per pattern count.
_SAVED_JSON_DIGESTS: dict[str, dict[int, str]] = {
    "executorch": {158: "508dbedf3a60c7d9"},
    "fbgemm": {227: "b3b2b8e7cab12da3"},
    "onednn": {236: "aaacd42dc5224a85"},
    "qnnpack": {227: "31f1d54a7dc08acb"},
    "reference": {209: "f19c6359c8ac58f5"},
    "tensorrt": {162: "432882de4583aba6"},
    "x86": {240: "11f4130608f8e725", 248: "52a106df1fd09eea"},
}


@pytest.mark.parametrize("name", sorted(_SAVED_JSON_DIGESTS))
def test_each_backend_saves_its_patterns_in_the_same_order(name: str) -> None:
    if name not in fxquant.list_backends():
        pytest.skip(f"backend {name!r} is not installed")
    config = fxquant.get_backend_config(name)
    digests = _SAVED_JSON_DIGESTS[name]
    assert len(config.configs) in digests, f"{name}: {len(config.configs)} patterns"
    text = config.to_json()
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == digests[len(config.configs)]
