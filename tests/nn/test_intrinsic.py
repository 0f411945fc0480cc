from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import pytest
import torch
from fxquant.errors import ConfigTypeError
from fxquant.nn import intrinsic as nni
from fxquant.nn import is_leaf_module
from torch import fx, nn

# fused class -> (parts builder, input shape)
CASES: dict[type[nn.Module], tuple[Callable[[], list[nn.Module]], tuple[int, ...]]] = {
    nni.ConvReLU1d: (lambda: [nn.Conv1d(2, 3, 3), nn.ReLU()], (2, 2, 7)),
    nni.ConvReLU2d: (lambda: [nn.Conv2d(2, 3, 3), nn.ReLU()], (2, 2, 5, 5)),
    nni.ConvReLU3d: (lambda: [nn.Conv3d(2, 3, 1), nn.ReLU()], (2, 2, 3, 3, 3)),
    nni.ConvBn1d: (lambda: [nn.Conv1d(2, 3, 3), nn.BatchNorm1d(3)], (2, 2, 7)),
    nni.ConvBn2d: (lambda: [nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)], (2, 2, 5, 5)),
    nni.ConvBn3d: (lambda: [nn.Conv3d(2, 3, 1), nn.BatchNorm3d(3)], (2, 2, 3, 3, 3)),
    nni.ConvBnReLU1d: (lambda: [nn.Conv1d(2, 3, 3), nn.BatchNorm1d(3), nn.ReLU()], (2, 2, 7)),
    nni.ConvBnReLU2d: (
        lambda: [nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU()],
        (2, 2, 5, 5),
    ),
    nni.ConvBnReLU3d: (
        lambda: [nn.Conv3d(2, 3, 1), nn.BatchNorm3d(3), nn.ReLU()],
        (2, 2, 3, 3, 3),
    ),
    nni.LinearReLU: (lambda: [nn.Linear(4, 3), nn.ReLU()], (5, 4)),
    nni.LinearBn1d: (lambda: [nn.Linear(4, 3), nn.BatchNorm1d(3)], (5, 4)),
    nni.BNReLU2d: (lambda: [nn.BatchNorm2d(3), nn.ReLU()], (2, 3, 4, 4)),
    nni.BNReLU3d: (lambda: [nn.BatchNorm3d(3), nn.ReLU()], (2, 3, 2, 2, 2)),
}


def _build(cls: type[nn.Module]) -> tuple[nn.Module, list[nn.Module], torch.Tensor]:
    make_parts, shape = CASES[cls]
    parts = make_parts()
    return cls(*parts).eval(), parts, torch.randn(shape)


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_fused_module_computes_exactly_its_parts_in_order(cls: type[nn.Module]) -> None:
    fused, parts, x = _build(cls)
    expected = x
    for part in parts:
        expected = part.eval()(expected)
    assert torch.equal(fused(x), expected)
    assert list(fused) == parts


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_fused_module_survives_pickle_and_deepcopy(cls: type[nn.Module]) -> None:
    fused, _, x = _build(cls)
    for clone in (pickle.loads(pickle.dumps(fused)), copy.deepcopy(fused)):
        assert type(clone) is cls
        assert torch.equal(clone(x), fused(x))


def test_wrong_part_type_names_argument_and_expected_type() -> None:
    conv1d = nn.Conv1d(1, 1, 1)
    with pytest.raises(
        ConfigTypeError, match=r"ConvReLU2d argument 'conv' must be a torch\.nn\.Conv2d"
    ) as info:
        nni.ConvReLU2d(conv1d, nn.ReLU())  # type: ignore[arg-type]
    assert "torch.nn.Conv1d" in str(info.value)


def test_second_part_type_is_checked_too() -> None:
    with pytest.raises(
        ConfigTypeError, match=r"ConvBnReLU2d argument 'bn' must be a torch\.nn\.BatchNorm2d"
    ):
        nni.ConvBnReLU2d(nn.Conv2d(1, 1, 1), nn.BatchNorm1d(1), nn.ReLU())  # type: ignore[arg-type]


def test_subclass_of_expected_module_is_refused() -> None:
    class MyLinear(nn.Linear):
        pass

    with pytest.raises(ConfigTypeError, match=r"'linear' must be a torch\.nn\.Linear"):
        nni.LinearReLU(MyLinear(2, 2), nn.ReLU())


def test_type_error_is_also_a_builtin_type_error() -> None:
    with pytest.raises(TypeError):
        nni.BNReLU2d(nn.BatchNorm3d(2), nn.ReLU())  # type: ignore[arg-type]


def test_conv_add_adds_second_input_to_conv_output() -> None:
    conv = nn.Conv2d(2, 2, 3, padding=1)
    x1, x2 = torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4)
    assert torch.equal(nni.ConvAdd2d(conv, torch.add)(x1, x2), conv(x1) + x2)
    fused = nni.ConvAddReLU2d(conv, torch.add, nn.ReLU())
    assert torch.equal(fused(x1, x2), torch.relu(conv(x1) + x2))


def test_conv_add_rejects_a_module_as_add() -> None:
    with pytest.raises(ConfigTypeError, match="argument 'add' must be an add function"):
        nni.ConvAdd2d(nn.Conv2d(1, 1, 1), nn.ReLU())  # type: ignore[arg-type]


def test_conv_add_relu_checks_relu_type() -> None:
    with pytest.raises(ConfigTypeError, match=r"'relu' must be a torch\.nn\.ReLU"):
        nni.ConvAddReLU2d(nn.Conv2d(1, 1, 1), torch.add, nn.Sigmoid())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("conv", "add", "relu", "named"),
    [
        (nn.Linear(1, 1), nn.Identity(), "relu", "'add'"),
        (nn.Linear(1, 1), torch.add, "relu", "'relu'"),
        (nn.Linear(1, 1), torch.add, nn.ReLU(), "'conv'"),
    ],
)
def test_conv_add_relu_names_the_first_wrong_argument(
    conv: object, add: object, relu: object, named: str
) -> None:
    """Arguments are checked in the order add, relu, conv: the error names the first wrong one."""
    with pytest.raises(ConfigTypeError, match=f"argument {named}"):
        nni.ConvAddReLU2d(conv, add, relu)  # type: ignore[arg-type]


def test_conv_add_survives_pickle() -> None:
    fused = nni.ConvAddReLU2d(nn.Conv2d(2, 2, 1), torch.add, nn.ReLU())
    x = torch.randn(1, 2, 3, 3)
    assert torch.equal(pickle.loads(pickle.dumps(fused))(x, x), fused(x, x))


class _LeafTracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_leaf_module(m) or super().is_leaf_module(m, module_qualified_name)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fused = nni.ConvReLU2d(nn.Conv2d(2, 2, 1), nn.ReLU())
        self.add = nni.ConvAdd2d(nn.Conv2d(2, 2, 1), torch.add)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add(self.fused(x), x)


def test_fx_keeps_fused_modules_as_single_leaf_nodes() -> None:
    model = _Model().eval()
    graph = _LeafTracer().trace(model)
    gm = fx.GraphModule(model, graph)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert targets == ["fused", "add"]
    x = torch.randn(1, 2, 3, 3)
    assert torch.equal(gm(x), model(x))


def test_plain_fx_trace_sees_through_fused_modules() -> None:
    model = _Model().eval()
    gm = fx.symbolic_trace(model)
    x = torch.randn(1, 2, 3, 3)
    assert torch.equal(gm(x), model(x))


def test_is_leaf_module_is_false_for_torch_containers() -> None:
    assert not is_leaf_module(nn.Sequential(nn.ReLU()))
    assert is_leaf_module(nni.BNReLU2d(nn.BatchNorm2d(1), nn.ReLU()))


def test_fused_modules_share_a_base_class() -> None:
    fused, _, _ = _build(nni.LinearReLU)
    assert isinstance(fused, nni.FusedModule)
    assert isinstance(fused, nn.Sequential)


def test_conv_add_relu_accepts_functional_relu() -> None:
    fused = nni.ConvAddReLU2d(nn.Conv2d(1, 1, 1), torch.add, torch.nn.functional.relu)  # type: ignore[arg-type]
    assert type(fused.relu) is nn.ReLU


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_fused_module_takes_its_parts_by_name_as_well_as_by_position(cls: type) -> None:
    module, parts, x = _build(cls)
    names = [arg for arg, _ in cls.PARTS]
    by_name = cls(parts[0], **dict(zip(names[1:], parts[1:], strict=True)))
    assert torch.equal(by_name.eval()(x), module.eval()(x))


def test_a_missing_or_unknown_part_names_the_parts_the_module_takes() -> None:
    with pytest.raises(TypeError, match="ConvBnReLU2d takes its parts conv, bn, relu"):
        nni.ConvBnReLU2d(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3))
    with pytest.raises(TypeError, match=r"got 1 by position and \['rleu'\] by name"):
        nni.ConvReLU2d(nn.Conv2d(2, 3, 3), rleu=nn.ReLU())
