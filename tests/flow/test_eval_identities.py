"""torchvision's stochastic depth in an eval-mode model is the identity the flow drops.

``torchvision.ops.stochastic_depth`` is a wrapped call the tracer keeps whole; an eval trace
records ``stochastic_depth(x, p, mode, False)``, which returns ``x``. explain reported it
``no_pattern`` on every backend, and on x86 it stood between EfficientNet's last conv + BN
and the residual add, so the two did not fuse (``ConvAdd2d``) and the add ran float between
a dequantize and a quantize step. A QAT trace passes the module's ``training`` flag instead:
the prepared model still drops residual branches in training mode.
"""

from __future__ import annotations

import copy

import fxquant
import pytest
import torch
from torch import nn

from tests.zoo import torchvision_models

CPU_BACKENDS = ("x86", "onednn", "fbgemm", "qnnpack", "reference")


class Residual(nn.Module):
    """EfficientNet's MBConv tail: conv + BN, torchvision's StochasticDepth, the residual add."""

    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        ops = torchvision_models.require().ops
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop: nn.Module | None = ops.StochasticDepth(p, "row")
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        if self.drop is not None:
            y = self.drop(y)
        return self.head(y + x)


def _model() -> Residual:
    torch.manual_seed(0)
    model = Residual()
    model.bn.running_mean.uniform_(-0.2, 0.2)
    model.bn.running_var.uniform_(0.5, 1.5)
    return model.eval()


def _converted(model: nn.Module, backend: str) -> torch.fx.GraphModule:
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    x = torch.randn(2, 8, 8, 8, generator=torch.Generator().manual_seed(1))
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    with torch.no_grad():
        for seed in (2, 3):
            prepared(torch.randn(2, 8, 8, 8, generator=torch.Generator().manual_seed(seed)))
    return fxquant.convert_fx(prepared, backend_config=config)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_an_eval_stochastic_depth_quantizes_as_if_it_were_not_there(backend: str) -> None:
    model = _model()
    without = copy.deepcopy(model)
    without.drop = None
    converted, reference = _converted(model, backend), _converted(without, backend)
    x = torch.randn(4, 8, 8, 8, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        assert torch.equal(converted(x), reference(x))
    entries = fxquant.explain(converted, show=False).entries()
    assert not [e for e in entries if "stochastic_depth" in e.node], "reported as skipped"


def test_on_x86_the_conv_before_a_stochastic_depth_takes_the_residual_add() -> None:
    converted = _converted(_model(), "x86")
    float_ops = [n.target for n in converted.graph.nodes if n.op == "call_function"]
    assert not any(getattr(op, "__name__", "") in ("add", "stochastic_depth") for op in float_ops)
    assert "ConvAdd2d" in {e.pattern for e in fxquant.explain(converted, show=False).entries()}


def test_a_qat_model_keeps_dropping_residual_branches_in_training_mode() -> None:
    model = _model().train()
    model.drop = torchvision_models.require().ops.StochasticDepth(0.5, "row")
    mapping = fxquant.get_default_qconfig_mapping("x86", is_qat=True)
    x = torch.randn(8, 8, 8, 8, generator=torch.Generator().manual_seed(1))
    config = fxquant.get_backend_config("x86")
    prepared = fxquant.prepare_qat_fx(model, mapping, (x,), backend_config=config)
    torch.manual_seed(0)
    with torch.no_grad():
        outputs = [prepared(x) for _ in range(4)]
        assert any(not torch.equal(outputs[0], o) for o in outputs[1:]), "no branch dropped"
        converted = fxquant.convert_fx(prepared.eval(), backend_config=config)
        assert torch.equal(converted(x), converted(x)), "the converted model still drops"
