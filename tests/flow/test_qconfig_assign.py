from __future__ import annotations

import torch
from fxquant.config.backend import BackendConfig
from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow.context import FlowContext
from fxquant.flow.qconfig_assign import assign_qconfigs
from fxquant.flow.trace import trace
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
    gm: fx.GraphModule = trace(Net(), FlowContext(BackendConfig("b")))
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
    gm = trace(Net(), FlowContext(BackendConfig("b")))
    mapping = QConfigMapping().set_module_name("c", A).set_module_name_regex("zz.*", A)
    unused = assign_qconfigs(gm, dict(gm.named_modules()), mapping).unused
    assert [r.field for r in unused] == ["module_name", "module_name_regex"]
