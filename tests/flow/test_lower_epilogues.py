"""Lowering epilogues: kernels take over the steps that alone follow (or feed) them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fxquant
import fxquant.numerics.observer
import pytest
import torch
from fxquant.config.backend import BackendPatternConfig
from fxquant.flow.convert import convert_fx, convert_to_reference_fx
from fxquant.nn import reference
from fxquant.patterns import linear_configs
from fxquant.registry import LoweringRule, hookimpl
from fxquant.registry.hookspecs import Dequantize, LoweringMatch, QParams, Quantize
from torch import fx, nn

from tests.flow.test_convert import INT8
from tests.flow.test_lower import QLinear

BACKEND = "testepilogue"


def _dequantize(q: torch.Tensor, p: QParams) -> torch.Tensor:
    return (q.double() - float(p.zero_point)) * float(p.scale)  # type: ignore[arg-type]


def _quantize(y: torch.Tensor, p: QParams) -> torch.Tensor:
    q = torch.round(y / float(p.scale)) + float(p.zero_point)  # type: ignore[arg-type]
    return q.clamp(p.quant_min, p.quant_max).to(p.dtype)


class Absorbing(QLinear):
    """The test linear kernel, taking the steps it can compute: (de)quantize steps, GELU."""

    offered: list[str]

    def __init__(self, match: LoweringMatch, accept: bool) -> None:
        super().__init__(match)
        self.accept, self.offered, self.steps = accept, [], []
        self.float_input: QParams | None = None

    def absorb(self, step: object) -> bool:
        self.offered.append(type(step).__name__)
        if not self.accept or not isinstance(step, (Dequantize, Quantize, nn.GELU)):
            return False
        self.steps.append(step)
        return True

    def absorb_input(self, step: object) -> bool:
        self.offered.append(f"input {type(step).__name__}")
        if self.accept and isinstance(step, Quantize):
            self.float_input = step.qparams
        return self.accept

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.float_input is not None:
            x = _quantize(x, self.float_input)
        y: Any = super().forward(x)
        for step in self.steps:
            if isinstance(step, Dequantize):
                y = _dequantize(y, step.qparams).float()
            elif isinstance(step, Quantize):
                y = _quantize(y, step.qparams)
            else:
                y = step(y)
        return y


class EpiloguePlugin:
    def __init__(self, accept: bool) -> None:
        self.accept = accept

    @hookimpl
    def fxquant_pattern_configs(self, backend: str) -> list[BackendPatternConfig] | None:
        return linear_configs([INT8]) if backend == BACKEND else None

    @hookimpl
    def fxquant_lowering_kernels(self, backend: str) -> list[LoweringRule] | None:
        if backend != BACKEND:
            return None
        build = lambda match: Absorbing(match, self.accept)  # noqa: E731
        return [LoweringRule(reference.Linear, build=build, name="qlinear")]


def _lowered(
    accept: bool, model: nn.Module | None = None
) -> Iterator[tuple[fx.GraphModule, fx.GraphModule, torch.Tensor]]:
    plugin = EpiloguePlugin(accept)
    fxquant.register_plugin(plugin, backend=BACKEND)
    try:
        torch.manual_seed(0)
        qconfig = fxquant.QConfig(
            activation=fxquant.observer.MinMaxObserver,
            weight=fxquant.observer.default_per_channel_weight_observer,
        )
        mapping = fxquant.QConfigMapping().set_object_type(nn.Linear, qconfig)
        if model is None:
            model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(), nn.Linear(16, 4))
        model.eval()
        x = torch.randn(6, 8)
        config = fxquant.get_backend_config(BACKEND)
        prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
        prepared(x)
        reference_model = convert_to_reference_fx(prepared)
        yield convert_fx(prepared), reference_model, x
    finally:
        fxquant.unregister_plugin(plugin)


class _Named(nn.Module):
    """The fixture's model, its modules named."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act, self.drop, self.out = (
            nn.Linear(8, 16), nn.GELU(), nn.Dropout(), nn.Linear(16, 4)
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(self.act(self.fc(x))))


@pytest.fixture
def accepting() -> Iterator[tuple[fx.GraphModule, fx.GraphModule, torch.Tensor]]:
    yield from _lowered(accept=True)


@pytest.fixture
def declining() -> Iterator[tuple[fx.GraphModule, fx.GraphModule, torch.Tensor]]:
    yield from _lowered(accept=False)


def _steps(gm: fx.GraphModule) -> list[str]:
    return [
        getattr(n.target, "__name__", str(n.target))
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_module")
    ]


def test_a_kernel_is_offered_its_dequantize_the_float_op_and_the_requantize_in_order(
    accepting: Any,
) -> None:
    lowered, reference_model, x = accepting
    first, second = lowered.get_submodule("0"), lowered.get_submodule("3")
    # then the second kernel, which it declines; its own input last
    assert first.offered == ["Dequantize", "GELU", "Quantize", "Absorbing", "input Quantize"]
    assert second.offered == ["Dequantize"]  # its input comes from a kernel
    assert _steps(lowered) == ["0", "3"]  # the dropout (eval) vanished, every step absorbed
    step = float(next(n for n in reference_model.graph.nodes if n.target == "3").next.args[1])
    with torch.no_grad():
        assert (lowered(x) - reference_model(x)).abs().max() <= step * 1.001


def test_a_declining_kernel_keeps_the_steps_around_it(declining: Any) -> None:
    lowered, reference_model, x = declining
    first = lowered.get_submodule("0")
    assert first.offered == ["Dequantize", "input Quantize"]
    steps = _steps(lowered)
    assert steps.count("dequantize_per_tensor.default") == 2
    assert "GELU" in [type(m).__name__ for m in lowered.modules()]
    with torch.no_grad():
        torch.testing.assert_close(lowered(x), reference_model(x), atol=0.05, rtol=0)


def test_lowering_drops_the_modules_it_stopped_calling() -> None:
    lowered_models = _lowered(accept=True, model=_Named())
    lowered, reference_model, _ = next(lowered_models)
    try:
        # the GELU the first kernel absorbed and the eval-mode dropout go with their calls,
        # and so do the reference Linears the kernels replaced; the reference model keeps all
        assert [name for name, _ in lowered.named_children()] == ["fc", "out"]
        assert not any(isinstance(m, reference.Linear) for m in lowered.modules())
        named = [name for name, _ in reference_model.named_children()]
        assert named == ["fc", "act", "drop", "out"]
    finally:
        lowered_models.close()
