"""The config fuzzer's fast slice (#18 item 4); ``nox -s fuzz`` runs 20,000 cases."""

from __future__ import annotations

import json

import pytest
from fxquant.config import BackendConfig, QConfigMapping
from fxquant.errors import ConfigError

from tests.config import fuzz

SLICE = 300


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzzed_configs_fail_only_with_fxquant_errors(seed: int) -> None:
    cases = fuzz.generate(SLICE, seed=1000 + seed)
    unrelated = [(c.loader, c.mutations, repr(e)) for c in cases if (e := fuzz.run(c))]
    assert unrelated == []


def test_the_fuzzer_mutates_every_loader() -> None:
    loaders = {case.loader for case in fuzz.generate(SLICE, seed=7)}
    assert loaders >= {"backend_json", "mapping_json", "mapping_dict", "prepare_dict"}


@pytest.mark.parametrize("depth", [65, 500, 5000])
def test_deep_json_is_a_config_error(depth: int) -> None:
    text = '{"name": "b", "configs": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(ConfigError, match="nests deeper than 64 levels"):
        BackendConfig.from_json(text)


@pytest.mark.parametrize(
    ("data", "where"),
    [(b'{"": null, "x": "\xff"}', "byte 17: b'\\\\xff'"), (b"\xc0\x80{}", "byte 0")],
)
def test_non_utf8_bytes_are_a_config_error_naming_the_byte(data: bytes, where: str) -> None:
    with pytest.raises(ConfigError, match=rf"the bytes are not UTF-8 \({where}"):
        QConfigMapping.from_json(data)  # type: ignore[arg-type]  # bytes are accepted


def test_utf8_bytes_with_a_bom_load() -> None:
    text = QConfigMapping().to_json()
    assert QConfigMapping.from_json(b"\xef\xbb\xbf" + text.encode()) == QConfigMapping()  # type: ignore[arg-type]


def test_a_json_nan_in_observer_kwargs_names_the_path() -> None:
    observer = {"module": "fxquant.observer", "name": "MinMaxObserver", "kwargs": {"eps": 1}}
    broken = json.dumps({"": {"activation": observer, "weight": observer}}).replace(
        '"eps": 1', '"eps": NaN', 1
    )
    with pytest.raises(ConfigError) as info:
        QConfigMapping.from_json(broken)
    assert str(info.value) == (
        '[""].activation.kwargs: MinMaxObserver eps=nan: expected a finite number > 0'
    )
