from __future__ import annotations

import fxquant
import pytest
import torch
from fxquant.config.backend import BackendConfig
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow import qconfig_assign
from fxquant.flow.context import FlowContext
from fxquant.flow.fuse import fuse_assigned
from fxquant.flow.qconfig_assign import assign_qconfigs
from fxquant.flow.state import node_info
from fxquant.flow.trace import trace
from fxquant.registry.resolution import ResolvedBackend
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

A = QConfig(activation=nn.Identity, weight=nn.Identity)
B = QConfig(activation=nn.ReLU, weight=nn.Identity)
C = QConfig(activation=nn.Tanh, weight=nn.Identity)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.add(torch.add(self.fc(x), 1), 2)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def qconfigs(mapping: QConfigMapping) -> dict[str, object]:
    gm: fx.GraphModule = trace(Net(), FlowContext(ResolvedBackend(BackendConfig("b"))))
    result = assign_qconfigs(gm, dict(gm.named_modules()), mapping)
    return {n.name: q for n, q in result.qconfigs.items()}


def test_five_levels_apply_in_priority_order() -> None:
    mapping = (
        QConfigMapping()
        .set_global(A)
        .set_object_type(torch.add, B)
        .set_module_name_regex("b.*", C)
        .set_module_name("a.fc", None)
        .set_module_name_object_type_order("b", torch.add, 1, A)
    )
    got = qconfigs(mapping)
    assert got["a_fc"] is None  # module name
    assert got["add"] is B
    assert got["add_1"] is B
    assert got["add_2"] is C  # regex beats object type
    assert got["add_3"] is A  # second torch.add inside "b"


def test_module_name_entry_that_matches_nothing_is_reported() -> None:
    gm = trace(Net(), FlowContext(ResolvedBackend(BackendConfig("b"))))
    mapping = QConfigMapping().set_module_name("c", A).set_module_name_regex("zz.*", A)
    unused = assign_qconfigs(gm, dict(gm.named_modules()), mapping).unused
    assert [r.field for r in unused] == ["module_name", "module_name_regex"]


class FiveConvs(nn.Module):
    """The root calls five Conv2d directly, each followed by a ReLU; `block` calls one more."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(2, 2, 1) for _ in range(5))
        self.relus = nn.ModuleList(nn.ReLU() for _ in range(5))
        self.block = nn.Sequential(nn.Conv2d(2, 2, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, relu in zip(self.convs, self.relus, strict=True):
            x = relu(conv(x))
        return self.block(x)


def conv_qconfigs(mapping: QConfigMapping) -> dict[str, object]:
    gm = trace(FiveConvs(), FlowContext(ResolvedBackend(BackendConfig("b"))))
    result = assign_qconfigs(gm, dict(gm.named_modules()), mapping)
    return {str(n.target): q for n, q in result.qconfigs.items() if n.op == "call_module"}


def test_an_order_entry_for_a_module_class_names_the_nth_module_its_parent_calls() -> None:
    """Seed 003: ("", nn.Conv2d, 3) is the fourth Conv2d called directly by the root."""
    mapping = QConfigMapping().set_global(A).set_module_name_object_type_order("", nn.Conv2d, 3, B)
    got = conv_qconfigs(mapping)
    assert [name for name, q in got.items() if q is B] == ["convs.3"]
    assert got["block.0"] is A  # the first Conv2d `block` calls, not the root
    mapping.set_module_name_object_type_order("block", nn.Conv2d, 0, C)
    assert conv_qconfigs(mapping)["block.0"] is C


D = QConfig(activation=nn.Sigmoid, weight=nn.Identity)
LEVELS: list[tuple[str, object, object]] = [  # (to_dict key, entries, the QConfig they give)
    ("module_name_object_type_order", [("", nn.Conv2d, 3, A)], A),
    ("module_name", [("convs.3", B)], B),
    ("module_name_regex", [(r"convs\.[34]", C)], C),
    ("object_type", [(nn.Conv2d, None)], None),
    ("", D, D),
]


@pytest.mark.parametrize("top", range(len(LEVELS)))
def test_each_level_wins_over_the_ones_below_it_on_one_module(top: int) -> None:
    """convs.3 with all five entries stacked; dropping the top level exposes the next one."""
    mapping = QConfigMapping.from_dict({key: entries for key, entries, _ in LEVELS[top:]})
    rebuilt = QConfigMapping.from_dict(mapping.to_dict())
    assert rebuilt == mapping
    for candidate in (mapping, rebuilt):
        got = conv_qconfigs(candidate)
        assert got["convs.3"] is LEVELS[top][2]
        assert got["convs.0"] is (D if top == len(LEVELS) - 1 else None)  # named by none


def test_an_order_entry_survives_fusion_and_qat_swaps() -> None:
    """The index is the model's as written: fusing conv+relu or swapping QAT modules keeps it."""
    qconfig = fxquant.get_default_qconfig_mapping("reference", is_qat=True).global_qconfig
    mapping = (
        QConfigMapping()
        .set_global(qconfig)
        .set_module_name_object_type_order("", nn.Conv2d, 3, None)
    )
    example = (torch.randn(1, 2, 4, 4),)
    for prepare in (fxquant.prepare_fx, fxquant.prepare_qat_fx):
        model = FiveConvs().train(prepare is fxquant.prepare_qat_fx)
        prepared = prepare(model, mapping, example)
        report = fxquant.explain(prepared, show=False)
        assert report.entry("convs_3").status == "float", prepare.__name__
        assert report.entry("convs_3").reason.code == "qconfig_none"
        fused = [type(prepared.get_submodule(f"convs.{i}")).__name__ for i in range(5)]
        assert fused.count("ConvReLU2d") == 4, (prepare.__name__, fused)


def test_convert_reads_the_order_entries_of_its_mapping_with_the_prepared_indices() -> None:
    """convert_fx(qconfig_mapping=...) turns off the fourth conv, not one shifted by fusion."""
    # seeded: a chain of 2-channel conv+relu dies (all zeros) for many draws, and convert
    # then rightly warns that an observer saw a single value
    torch.manual_seed(0)
    mapping = fxquant.get_default_qconfig_mapping("reference")
    example = (torch.randn(1, 2, 4, 4),)
    prepared = fxquant.prepare_fx(FiveConvs().eval(), mapping, example)
    prepared(*example)
    off = QConfigMapping.from_dict(
        {**mapping.to_dict(), "module_name_object_type_order": [("", nn.Conv2d, 3, None)]}
    )
    reference = fxquant.convert_to_reference_fx(prepared, qconfig_mapping=off)
    report = fxquant.explain(reference, show=False)
    statuses = {name: report.entry(name).status for name in ("convs_2", "convs_3", "convs_4")}
    assert statuses == {"convs_2": "reference", "convs_3": "skipped", "convs_4": "reference"}


class Fusable(nn.Module):
    """Convs that fuse with a BN, a module ReLU, a functional relu or nothing; a Linear+ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(2, 2, 1) for _ in range(4))
        self.bn = nn.BatchNorm2d(2)
        self.relu = nn.ReLU()
        self.head = nn.Sequential(nn.Linear(2, 2), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn(self.convs[0](x)))
        x = torch.relu(self.convs[1](x))
        x = self.convs[3](self.convs[2](x))
        return self.head(x.mean((2, 3)))


ENTRIES: list[tuple[str, tuple[object, ...]]] = [
    ("object_type", (nn.Conv2d,)),
    ("object_type", (nn.ReLU,)),
    ("object_type", (torch.relu,)),
    ("object_type", (fxquant.nn.intrinsic.ConvReLU2d,)),
    ("object_type", (fxquant.nn.intrinsic.ConvBnReLU2d,)),
    ("object_type", (fxquant.nn.intrinsic.LinearReLU,)),
    ("module_name", ("convs.1",)),
    ("module_name", ("relu",)),
    ("module_name", ("head.1",)),
    ("module_name", ("gone",)),
    ("module_name_regex", (r"convs\.[02]",)),
    ("module_name_object_type_order", ("", torch.relu, 0)),
    ("module_name_object_type_order", ("convs", nn.Conv2d, 1)),
]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(ENTRIES), st.sampled_from([A, B, C, None])), max_size=6),
    st.sampled_from([A, B, None]),
)
def test_the_qconfigs_fusion_leaves_are_those_of_the_fused_graph(
    entries: list[tuple[tuple[str, tuple[object, ...]], QConfig | None]],
    global_qconfig: QConfig | None,
) -> None:
    """Prepare takes fusion's assignment: it must be what assigning the fused graph gives."""
    mapping = QConfigMapping().set_global(global_qconfig)
    for (level, key), qconfig in entries:
        getattr(mapping, f"set_{level}")(*key, qconfig)
    ctx = FlowContext.for_prepare(
        mapping, (), None, fxquant.get_backend_config("reference"), is_qat=False, strict=False
    )
    gm, kept = fuse_assigned(trace(Fusable().eval(), ctx), ctx)
    assert kept is not None
    whole = assign_qconfigs(gm, dict(gm.named_modules()), mapping)
    assert kept.qconfigs == whole.qconfigs
    assert (kept.named, kept.unused, kept.fused_types) == (
        whole.named,
        whole.unused,
        whole.fused_types,
    )


def test_prepare_resolves_each_node_once_and_a_fused_node_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolved: list[str] = []
    original = qconfig_assign._resolve

    def counted(node: fx.Node, *args: object) -> object:
        resolved.append(node.name)
        return original(node, *args)  # type: ignore[arg-type]  # the same arguments

    monkeypatch.setattr(qconfig_assign, "_resolve", counted)
    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = fxquant.prepare_fx(
        Fusable().eval(),
        mapping,
        (torch.randn(1, 2, 4, 4),),
        backend_config=fxquant.get_backend_config("reference"),
    )
    fused = [n.name for n in prepared.graph.nodes if node_info(n).fused_from]
    assert fused == ["convs_0", "convs_1", "head_0"]  # conv+bn+relu, conv+torch.relu, linear+relu
    assert sorted(name for name in set(resolved) if resolved.count(name) > 1) == fused
    assert len(resolved) == len(set(resolved)) + len(fused)


class _Residual(nn.Module):
    """conv + BN + add (+ relu), the residual block x86 and onednn fuse into ConvAdd(ReLU)2d,
    then linear + relu, which fbgemm and executorch fuse into LinearReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4, 4)
        self.fc_relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn(self.conv(x)) + x)
        return self.fc_relu(self.fc(y.mean((2, 3))))


@pytest.mark.parametrize(
    ("backend", "kind"),
    [("x86", nn.Conv2d), ("onednn", nn.Conv2d), ("fbgemm", nn.Linear), ("executorch", nn.Linear)],
)
def test_a_users_type_entry_reaches_the_layers_a_default_fused_class_entry_covered(
    backend: str, kind: type[nn.Module]
) -> None:
    # these backends' default mappings give the fused class (ConvAdd2d, LinearReLU) its own
    # entry; a user setting the conv's or linear's type afterwards means those layers too
    if backend not in fxquant.list_backends():
        pytest.skip(f"the {backend} plugin is not installed")
    from fxquant.flow import explain, prepare_fx
    from fxquant.numerics.observer import MinMaxObserver

    mapping = fxquant.get_default_qconfig_mapping(backend)
    default = mapping.global_qconfig
    weight = MinMaxObserver.with_args(
        dtype=torch.int8, qscheme=torch.per_tensor_symmetric, quant_min=-127, quant_max=127,
        eps=2**-12,
    )  # fmt: skip
    mapping.set_object_type(kind, QConfig(activation=default.activation, weight=weight))
    prepared = prepare_fx(
        _Residual().eval(), mapping, (torch.randn(1, 4, 8, 8),),
        backend_config=fxquant.get_backend_config(backend),
    )  # fmt: skip
    rows = explain(prepared, show=False)
    layer = "conv" if kind is nn.Conv2d else "fc"
    (row,) = [r for r in rows.entries() if r.node == layer or r.node.startswith(f"{layer}_")]
    assert row.status == "quantized", row
    assert row.qconfig.endswith("/MinMaxObserver"), row  # the user's per-tensor weights
    assert row.pattern.startswith(("ConvAdd", "LinearReLU")), row  # and still fused
