"""The ``fxquant_graph_mode`` hook: a backend quantizes a graph of one shape its own way (#23).

A plugin registered for the backend ``modal`` gives the reference backend's patterns,
its default mapping, and a graph mode that keeps every Linear float (a change that
``explain`` shows), so each test can tell whether prepare used the mode.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import fxquant
import pytest
import torch
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.errors import (
    ConfigError,
    ConfigTypeError,
    GraphModeWarning,
    PluginConflictError,
    PluginError,
)
from fxquant.flow.state import flow_state
from fxquant.registry import GraphMode, Override, hookimpl
from torch import fx, nn

BACKEND = "modal"


def default_mapping(is_qat: bool = False) -> QConfigMapping:
    return fxquant.get_default_qconfig_mapping("reference", is_qat=is_qat)


def linears_float(is_qat: bool = False) -> QConfigMapping:
    return default_mapping(is_qat).set_object_type(nn.Linear, None)


class Modal:
    """A plugin whose graph mode keeps Linears float; it records every call."""

    def __init__(self, answer: Any = "mode") -> None:
        self.answer = answer
        self.calls: list[tuple[str, list[str], QConfigMapping, bool]] = []

    @hookimpl
    def fxquant_pattern_configs(self, backend: str) -> list[Any]:
        return fxquant.get_backend_config("reference").configs

    @hookimpl
    def fxquant_default_qconfig_mapping(self, backend: str, is_qat: bool) -> QConfigMapping:
        return default_mapping(is_qat)

    @hookimpl
    def fxquant_graph_mode(
        self, backend: str, model: fx.GraphModule, qconfig_mapping: QConfigMapping, is_qat: bool
    ) -> Any:
        ops = [str(n.target) for n in model.graph.nodes if n.op == "call_module"]
        self.calls.append((backend, ops, qconfig_mapping, is_qat))
        if self.answer == "mode":
            return GraphMode("linears-float", "a test mode", linears_float(is_qat))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.fixture
def modal() -> Iterator[Modal]:
    plugin = Modal()
    fxquant.register_plugin(plugin, backend=BACKEND)
    yield plugin
    fxquant.unregister_plugin(plugin)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def prepare(mapping: QConfigMapping, *, is_qat: bool = False, **kwargs: Any) -> fx.GraphModule:
    model = Net().train(is_qat)
    step = fxquant.prepare_qat_fx if is_qat else fxquant.prepare_fx
    config = fxquant.get_backend_config(BACKEND)
    return step(model, mapping, (torch.randn(2, 4),), backend_config=config, **kwargs)


def status_of(gm: fx.GraphModule, node: str) -> str:
    entry = fxquant.explain(gm, show=False).entry(node)
    assert entry is not None
    return str(entry.status)


def test_the_default_mapping_asks_the_hook_with_the_traced_graph_and_uses_its_mode(
    modal: Modal,
) -> None:
    gm = prepare(default_mapping())
    [(backend, ops, mapping, is_qat)] = modal.calls
    assert (backend, ops, is_qat) == (BACKEND, ["fc"], False)
    assert mapping == default_mapping()
    assert status_of(gm, "fc") == "float"  # the mode's mapping keeps Linears float
    state = flow_state(gm)
    assert state is not None
    assert state.graph_mode is not None
    assert state.graph_mode.name == "linears-float"
    assert state.qconfig_mapping == linears_float()


def test_explain_prints_the_mode_line_first_on_prepared_and_converted_models(
    modal: Modal,
) -> None:
    gm = prepare(default_mapping())
    gm(torch.randn(2, 4))
    converted = fxquant.convert_fx(copy.deepcopy(gm))
    for model in (gm, converted):
        notes = fxquant.explain(model, show=False).notes()
        assert notes[0] == "mode: linears-float (a test mode)"
    assert "mode: linears-float (a test mode)" in fxquant.explain(converted, show=False).table()


def test_a_users_entries_win_where_they_apply_and_the_mode_fills_the_rest(modal: Modal) -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.head = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.fc(x)))

    own = default_mapping().set_module_name("head", default_mapping().global_qconfig)
    config = fxquant.get_backend_config(BACKEND)
    gm = fxquant.prepare_fx(Two().eval(), own, (torch.randn(2, 4),), backend_config=config)
    assert len(modal.calls) == 1
    assert modal.calls[0][2] == own  # the hook sees the user's mapping
    assert status_of(gm, "fc") == "float"  # the mode's part: Linears float
    assert status_of(gm, "head") == "quantized"  # the user's entry for head wins there
    state = flow_state(gm)
    assert state is not None
    assert state.graph_mode is not None
    assert state.qconfig_mapping.module_name_qconfigs == own.module_name_qconfigs
    notes = fxquant.explain(gm, show=False).notes()
    assert notes[:2] == [
        "mode: linears-float (a test mode)",
        "mode linears-float: your entries win where they apply: module_name 'head'",
    ]


def test_a_users_entry_for_the_modes_own_key_is_kept_with_a_warning_naming_both(
    modal: Modal,
) -> None:
    own = default_mapping().set_object_type(nn.Linear, default_mapping().global_qconfig)
    with pytest.warns(GraphModeWarning) as caught:
        gm = prepare(own)
    [warning] = caught
    assert str(warning.message).startswith(
        "prepare_fx: backend 'modal' quantizes this graph in its 'linears-float' mode "
        "(a test mode) under your own mapping; not applied, your entries kept: "
        "object_type torch.nn.Linear."
    )
    assert warning.filename == __file__  # points at the user's prepare_fx call
    assert status_of(gm, "fc") == "quantized"
    notes = fxquant.explain(gm, show=False).notes()
    assert (
        "mode linears-float: not applied (your entries kept): object_type torch.nn.Linear"
    ) in notes


def test_a_custom_global_qconfig_gets_the_modes_other_parts_and_a_warning(modal: Modal) -> None:
    qconfig = fxquant.QConfig(
        activation=fxquant.observer.MinMaxObserver, weight=fxquant.observer.default_weight_observer
    )
    own = fxquant.QConfigMapping().set_global(qconfig)
    with pytest.warns(GraphModeWarning, match=r"applied the mode's object_type torch\.nn"):
        gm = prepare(own)
    assert status_of(gm, "fc") == "float"
    state = flow_state(gm)
    assert state is not None
    assert state.qconfig_mapping.global_qconfig == qconfig  # the user's global stays


def test_an_equalization_config_merges_with_the_modes_mapping(modal: Modal) -> None:
    equalization = QConfigMapping().set_object_type(nn.Linear, fxquant.default_equalization_qconfig)
    gm = prepare(default_mapping(), _equalization_config=equalization)
    assert len(modal.calls) == 1
    assert status_of(gm, "fc") == "float"  # the mode's part; nothing of the user's says else


def test_prepare_qat_fx_asks_with_is_qat(modal: Modal) -> None:
    gm = prepare(default_mapping(is_qat=True), is_qat=True)
    assert [call[3] for call in modal.calls] == [True]
    assert status_of(gm, "fc") == "float"


def test_a_mode_with_equalization_is_refused_for_qat_naming_the_plugin(modal: Modal) -> None:
    equalization = QConfigMapping().set_object_type(nn.Linear, fxquant.default_equalization_qconfig)
    modal.answer = GraphMode("eq", "why", linears_float(True), equalization)
    with pytest.raises(PluginError, match="register_plugin") as caught:
        prepare(default_mapping(is_qat=True), is_qat=True)
    assert "fxquant_graph_mode" in str(caught.value)
    assert "prepare_qat_fx, which takes none" in str(caught.value)


def test_a_mode_with_equalization_equalizes_the_linears(modal: Modal) -> None:
    equalization = QConfigMapping().set_object_type(nn.Linear, fxquant.default_equalization_qconfig)
    modal.answer = GraphMode("eq", "why", default_mapping(), equalization)
    gm = prepare(default_mapping())
    notes = fxquant.explain(gm, show=False).notes()
    assert notes[0] == "mode: eq (why)"
    assert any(n.startswith("equalized: x -> fc") for n in notes), notes


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ("a string", "returned 'a string' (expected a GraphMode, or None)"),
        (QConfigMapping(), "(expected a GraphMode, or None)"),
        (ValueError("boom"), "raised in hook fxquant_graph_mode for backend 'modal': ValueError"),
    ],
)
def test_a_bad_answer_is_a_plugin_error_naming_the_plugin_and_the_hook(
    modal: Modal, answer: Any, words: str
) -> None:
    modal.answer = answer
    with pytest.raises(PluginError) as caught:
        prepare(default_mapping())
    message = str(caught.value)
    assert "plugin 'Modal' (registered with register_plugin)" in message
    assert "fxquant_graph_mode" in message
    assert words in message


def test_none_keeps_the_default_mapping(modal: Modal) -> None:
    modal.answer = None
    gm = prepare(default_mapping())
    assert len(modal.calls) == 1
    assert status_of(gm, "fc") == "quantized"
    state = flow_state(gm)
    assert state is not None
    assert state.graph_mode is None


def test_other_backends_are_not_asked(modal: Modal) -> None:
    model = Net().eval()
    fxquant.prepare_fx(model, default_mapping(), (torch.randn(2, 4),))  # the reference backend
    assert modal.calls == []


def test_two_answers_conflict_unless_the_later_overrides(modal: Modal) -> None:
    class Second:
        def __init__(self, answer: Any) -> None:
            self.answer = answer

        @hookimpl
        def fxquant_graph_mode(self, backend: str, model: Any, qconfig_mapping: Any) -> Any:
            return self.answer

    second = Second(GraphMode("second", "mine", default_mapping()))
    fxquant.register_plugin(second, backend=BACKEND)
    try:
        with pytest.raises(PluginConflictError, match="Override"):
            prepare(default_mapping())
        second.answer = Override(second.answer)
        gm = prepare(default_mapping())
    finally:
        fxquant.unregister_plugin(second)
    state = flow_state(gm)
    assert state is not None
    assert state.graph_mode is not None
    assert state.graph_mode.name == "second"
    assert status_of(gm, "fc") == "quantized"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"name": "", "reason": "r"},
            ConfigError,
            "GraphMode name must not be empty; e.g. 'transformer'",
        ),
        (
            {"name": 3, "reason": "r"},
            ConfigTypeError,
            "GraphMode name must be a str, got 3 of type int",
        ),
        (
            {"name": "n", "reason": " "},
            ConfigError,
            "GraphMode reason must not be empty; e.g. '6 Linear -> add -> LayerNorm blocks'",
        ),
        (
            {"name": "n", "reason": "r", "qconfig_mapping": {"": None}},
            ConfigTypeError,
            "GraphMode qconfig_mapping must be a fxquant.QConfigMapping, got {'': None} of type "
            "dict",
        ),
        (
            {"name": "n", "reason": "r", "equalization": "eq"},
            ConfigTypeError,
            "GraphMode equalization must be a fxquant.QConfigMapping or None, got 'eq' of type str",
        ),
    ],
)
def test_graph_mode_validates_its_fields(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    kwargs.setdefault("qconfig_mapping", QConfigMapping())
    with pytest.raises(error) as caught:
        GraphMode(**kwargs)
    assert str(caught.value) == message
