"""Capture of models fxquant's tracer cannot trace alone: a GraphModule as it is, concrete_args.

Issue 11: a Hugging Face model failed in ``prepare_fx`` twice, once because its optional
arguments became proxies, once because fxquant traced the user's GraphModule again and its
code slices a buffer by a traced length. These models reproduce both without transformers
(tests/backends/test_transformers.py runs the real BertModel).
"""

from __future__ import annotations

import warnings

import fxquant
import pytest
import torch
from fxquant.errors import ConfigError, ConfigTypeError, UntraceableModelError
from fxquant.flow.state import node_info
from torch import fx, nn

MAPPING = fxquant.get_default_qconfig_mapping("reference")


class Embed(nn.Module):
    """Adds a position table sliced to the input's length: ``table[:, : x.size(1)]``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(1, 16, 4))
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.table[:, : x.size(1)]


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = Embed()
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.embed(x)))


class BufferTracer(fx.Tracer):
    """Another library's tracer: buffers read in forward become graph values (as HFTracer)."""

    proxy_buffer_attributes = True
    record_stack_traces = True


def users_graph_module() -> fx.GraphModule:
    model = Model().eval()
    return fx.GraphModule(model, BufferTracer().trace(model), "Model")


def snapshot(gm: fx.GraphModule) -> tuple[str, dict[str, type], dict[str, torch.Tensor]]:
    modules = {name: type(m) for name, m in gm.named_modules()}
    state = {k: v.clone() for k, v in gm.state_dict().items()}
    return gm.code, modules, state


def test_fxquants_tracer_cannot_trace_the_users_graph_module_again() -> None:
    """What prepare_fx(graph_module) did before issue 11: trace its code again, and fail."""
    from fxquant.flow.trace import QuantizationTracer

    with pytest.raises(TypeError, match="slice indices must be integers"):
        QuantizationTracer().trace(users_graph_module())


def test_a_graph_module_is_quantized_as_it_is_and_left_unmodified() -> None:
    gm = users_graph_module()
    before = snapshot(gm)
    x = torch.randn(2, 5, 4)
    expected = gm(x)
    reference = fxquant.get_backend_config("reference")
    prepared = fxquant.prepare_fx(gm, MAPPING, (x,), backend_config=reference)
    prepared(x)
    quantized = fxquant.convert_fx(prepared)
    assert quantized.graph is not gm.graph
    assert snapshot(gm)[:2] == before[:2]
    for key, value in snapshot(gm)[2].items():
        assert torch.equal(value, before[2][key]), key
    statuses = {e.node: e.status for e in fxquant.explain(quantized, show=False).entries()}
    assert statuses["embed_fc"] == statuses["head"] == "reference"  # quantized, no kernels
    assert quantized(torch.randn(2, 7, 4)).shape == (2, 7, 4)  # the slice follows the input
    error = (quantized(x) - expected).abs().max() / expected.abs().max()
    assert 0 < error < 0.05  # quantized, and close to float


def test_graph_module_nodes_get_their_owner_module_and_source_line() -> None:
    """From the tracer's nn_module_stack and stack traces: mapping entries by name still apply."""
    gm = users_graph_module()
    mapping = fxquant.QConfigMapping().set_global(MAPPING.global_qconfig)
    mapping.set_module_name("embed", None)
    prepared = fxquant.prepare_fx(gm, mapping, (torch.randn(2, 5, 4),))
    add = next(n for n in prepared.graph.nodes if n.name == "add")
    assert node_info(add).module_path == "embed"
    assert node_info(add).module_type is Embed
    assert (node_info(add).source or "").endswith(f"test_capture.py:{Embed.forward_line}")
    report = fxquant.explain(prepared, show=False)
    assert report.entry("add").reason.code == "qconfig_none"  # named by "embed"
    assert report.entry("head").status == "quantized"


Embed.forward_line = Embed.forward.__code__.co_firstlineno + 1  # type: ignore[attr-defined]


def test_qat_on_a_graph_module_trains_a_copy() -> None:
    gm = users_graph_module().train()
    before = snapshot(gm)
    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
    prepared = fxquant.prepare_qat_fx(gm, mapping, (torch.randn(2, 5, 4),))
    prepared(torch.randn(2, 5, 4)).sum().backward()
    assert type(prepared.head).__module__ == "fxquant.nn.qat"
    assert snapshot(gm)[1] == before[1]
    assert gm.head.weight.grad is None


class Optional(nn.Module):
    """Like transformers' models: optional inputs, checked in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(
        self, x: torch.Tensor | None = None, embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x is not None and embeds is not None:
            msg = "give x or embeds, not both"
            raise ValueError(msg)
        return self.fc(x if x is not None else embeds)


def test_optional_arguments_are_traced_as_concrete_values_with_concrete_args() -> None:
    x = torch.randn(2, 4)
    with pytest.raises(UntraceableModelError, match="give x or embeds"):
        fxquant.prepare_fx(Optional().eval(), MAPPING, (x,))
    for prepare in (fxquant.prepare_fx, fxquant.prepare_qat_fx):
        prepared = prepare(Optional(), MAPPING, (x,), concrete_args={"embeds": None})
        assert fxquant.explain(prepared, show=False).entry("fc").status == "quantized"
        assert prepared(x).shape == (2, 4)
        with pytest.raises(AssertionError, match="embeds has been specialized"):  # torch.fx's
            prepared(x, x)


def test_concrete_args_must_name_parameters_of_forward() -> None:
    with pytest.raises(ConfigError) as info:
        fxquant.prepare_fx(Optional(), MAPPING, (torch.randn(2, 4),), concrete_args={"mask": None})
    assert str(info.value) == (
        "concrete_args names 'mask', not parameters of Optional.forward; its parameters: x, embeds"
    )
    with pytest.raises(ConfigTypeError, match="concrete_args must be a dict"):
        fxquant.prepare_fx(Optional(), MAPPING, (torch.randn(2, 4),), concrete_args=["embeds"])  # type: ignore[arg-type]  # tested


def test_concrete_args_do_not_apply_to_a_graph_module() -> None:
    with pytest.raises(ConfigError, match="already a GraphModule"):
        fxquant.prepare_fx(
            users_graph_module(), MAPPING, (torch.randn(2, 5, 4),), concrete_args={"x": None}
        )


def test_a_module_the_graph_modules_tracer_traced_through_cannot_be_kept_as_one_call() -> None:
    config = fxquant.PrepareCustomConfig().set_non_traceable_module_names(["embed"])
    with pytest.raises(ConfigError) as info:
        fxquant.prepare_fx(users_graph_module(), MAPPING, (torch.randn(2, 5, 4),), config)
    assert str(info.value).startswith(
        "prepare_custom_config non_traceable_module_names lists 'embed', but this GraphModule "
        "has no call of it"
    )
    kept = fxquant.PrepareCustomConfig().set_non_traceable_module_names(["head"])  # a call
    fxquant.prepare_fx(users_graph_module(), MAPPING, (torch.randn(2, 5, 4),), kept)


@pytest.mark.parametrize("qat", [False, True])
def test_a_torch_compiled_model_or_submodule_is_quantized_as_its_module(qat: bool) -> None:
    # before: "cannot trace the model: the root module failed at an unknown line:
    # NotImplementedError: Module [OptimizedModule] is missing the required "forward"
    # function ... symbolic tracing cannot follow data-dependent control flow"
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    plain.train(qat)
    with warnings.catch_warnings():  # dynamo's first import uses torch.jit.script_method
        warnings.simplefilter("ignore", DeprecationWarning)
        compiled = torch.compile(plain)
        outer = nn.Sequential(torch.compile(plain), nn.ReLU()).train(qat)
    x = torch.randn(8, 4)
    prepare = fxquant.prepare_qat_fx if qat else fxquant.prepare_fx
    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=qat)
    results = []
    for model in (plain, compiled, nn.Sequential(plain, nn.ReLU()).train(qat), outer):
        prepared = prepare(model, mapping, (x,))
        prepared(x)
        results.append(fxquant.convert_fx(prepared.eval())(x))
    assert torch.equal(results[0], results[1])  # the compiled model's module, quantized
    assert torch.equal(results[2], results[3])
    assert type(outer[0]).__name__ == "OptimizedModule"  # the user's model is not changed
