"""Dict forms with keys fxquant does not know load with one warning, as in torch.ao (#22)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from fxquant.config import (
    BackendConfig,
    BackendPatternConfig,
    ConvertCustomConfig,
    DTypeConfig,
    FuseCustomConfig,
    PrepareCustomConfig,
    QConfigMapping,
)
from fxquant.errors import ConfigError, ConfigTypeError, ConfigWarning

CASES: list[tuple[Any, dict[str, Any], str]] = [
    (QConfigMapping, {"": None, "stray": 1}, "QConfigMapping.from_dict"),
    (
        PrepareCustomConfig,
        {"input_quantized_idxs": [0], "stray": 1},
        "PrepareCustomConfig.from_dict",
    ),
    (
        ConvertCustomConfig,
        {"preserved_attributes": ["a"], "stray": 1},
        "ConvertCustomConfig.from_dict",
    ),
    (FuseCustomConfig, {"preserved_attributes": ["a"], "stray": 1}, "FuseCustomConfig.from_dict"),
]


@pytest.mark.parametrize(("cls", "data", "owner"), CASES)
def test_an_unknown_key_warns_once_naming_it_and_the_rest_loads(
    cls: Any, data: dict[str, Any], owner: str
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = cls.from_dict(data)
    assert [type(w.message) for w in caught] == [ConfigWarning]
    message = str(caught[0].message)
    assert message.startswith(f"{owner}: unknown key(s) 'stray' at {owner}['stray'] ignored")
    assert "strict=True" in message
    assert caught[0].filename == __file__  # the warning points at the caller's line
    known = {k: v for k, v in data.items() if k != "stray"}
    assert loaded == cls.from_dict(known)


@pytest.mark.parametrize(("cls", "data", "owner"), CASES)
def test_strict_makes_an_unknown_key_an_error(cls: Any, data: dict[str, Any], owner: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{owner}: unknown key\(s\) 'stray'.*valid keys: "):
        cls.from_dict(data, strict=True)


def test_a_torch_ao_mapping_dict_with_a_stray_key_loads() -> None:
    saved = {"": None, "object_type": [("relu", None)], "_comment": "from a torch.ao run"}
    with pytest.warns(ConfigWarning, match="'_comment'"):
        mapping = QConfigMapping.from_dict(saved)
    assert mapping.object_type_qconfigs == {"relu": None}


@pytest.mark.parametrize(
    "cls",
    [
        QConfigMapping,
        PrepareCustomConfig,
        ConvertCustomConfig,
        FuseCustomConfig,
        BackendConfig,
        BackendPatternConfig,
        DTypeConfig,
    ],
)
def test_a_dict_form_that_is_no_dict_is_refused_naming_the_class_and_the_type(cls: Any) -> None:
    with pytest.raises(ConfigTypeError) as caught:
        cls.from_dict([("fc", None)])
    assert str(caught.value) == (
        f"{cls.__name__}.from_dict expects a dict, got [('fc', None)] of type list"
    )
