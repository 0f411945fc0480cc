"""torch.ao config objects passed in by a migrating user: named as torch.ao's, with the fix."""

from __future__ import annotations

import re
from types import ModuleType

import fxquant
import pytest
import torch
from fxquant.errors import ConfigTypeError

from tests import oracle

X = (torch.randn(1, 3, 8, 8),)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3), torch.nn.ReLU()).eval()


def _message(call: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(ConfigTypeError) as info:
        call(*args, **kwargs)  # type: ignore[operator]  # the flow entry points
    return str(info.value)


def _says_torch_ao(message: str, argument: str, ao_class: str, ours: str) -> None:
    # the hint first: a cut repr of a torch.ao mapping opened the message and said nothing
    assert message.startswith(
        f"{argument} is torch.ao's {ao_class}, and fxquant does not take torch.ao's config "
        f"objects: build it with {ours} (import from fxquant what you imported"
    )
    assert "see docs/migration.md); " in message
    assert re.search(rf"; {argument} must be a fxquant\.\w+", message)
    assert len(message) < 600, message
    assert "characters)" not in message  # no repr at all


def test_a_torch_ao_mapping_is_named_with_the_fxquant_class_to_use(ao: ModuleType) -> None:
    with oracle.quiet():
        mapping = ao.get_default_qconfig_mapping("x86")
    message = _message(fxquant.prepare_fx, _model(), mapping, X)
    ao_class = "torch.ao.quantization.qconfig_mapping.QConfigMapping"
    _says_torch_ao(message, "qconfig_mapping", ao_class, "fxquant.QConfigMapping")
    assert "e.g. fxquant.get_default_qconfig_mapping('x86')" in message


def test_a_torch_ao_mappings_dict_form_names_its_torch_ao_qconfig(ao: ModuleType) -> None:
    with oracle.quiet():
        as_dict = ao.get_default_qconfig_mapping("x86").to_dict()
    message = _message(fxquant.prepare_fx, _model(), as_dict, X)
    ao_class = "torch.ao.quantization.qconfig.QConfig"
    _says_torch_ao(message, "global_qconfig", ao_class, "fxquant.QConfig")
    assert "e.g. fxquant.get_default_qconfig('x86')" in message


def test_a_torch_ao_qconfig_is_refused_by_the_mapping(ao: ModuleType) -> None:
    with oracle.quiet():
        qconfig = ao.get_default_qconfig("x86")
    message = _message(fxquant.QConfigMapping().set_object_type, torch.nn.Conv2d, qconfig)
    _says_torch_ao(message, "qconfig", "torch.ao.quantization.qconfig.QConfig", "fxquant.QConfig")


def test_a_torch_ao_backend_config_names_fxquants_getter(ao: ModuleType) -> None:
    with oracle.quiet():
        config = ao.backend_config.get_native_backend_config()
    mapping = fxquant.get_default_qconfig_mapping("x86")
    message = _message(fxquant.prepare_fx, _model(), mapping, X, backend_config=config)
    ao_class = "torch.ao.quantization.backend_config.backend_config.BackendConfig"
    _says_torch_ao(message, "backend_config", ao_class, "fxquant.BackendConfig")
    assert "e.g. fxquant.get_backend_config('x86')" in message


def test_other_wrong_types_keep_their_own_hint() -> None:
    message = _message(fxquant.QConfigMapping().set_object_type, torch.nn.ReLU(), None)
    assert message.endswith("of type ReLU; e.g. torch.nn.Linear, torch.add, 'relu'")
    assert "torch.ao" not in message
