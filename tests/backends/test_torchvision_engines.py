"""torchvision's CNNs on the quint8 engines (fbgemm, qnnpack), as the invariant matrix runs them.

Each test is a cell of ``tests.invariants.matrix`` that failed on the quint8 engines:
the lowered model runs and agrees with its reference model within one step of each
quantized node's output (``fxquant.numerics.compare``), or explain names the node and why.
"""

from __future__ import annotations

import copy

import fxquant
import torch
from torch import nn

from tests.zoo import torchvision_models


def _prepared(engine: str, model: nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    config = fxquant.get_backend_config(engine)
    mapping = fxquant.get_default_qconfig_mapping(engine)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
    with torch.no_grad():
        prepared(x)
    return prepared


def test_torchvision_shufflenet_v2_lowers_on_fbgemm_at_one_32px_image() -> None:
    """Its ``conv5`` output is 1 x 1 there: the head's mean raised inside torch's kernel."""
    torchvision_models.require()
    torch.manual_seed(0)
    model, x = torchvision_models.BUILDERS["tv_shufflenet_v2"](), torch.randn(1, 3, 32, 32)
    prepared = _prepared("fbgemm", model, x)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    lowered = fxquant.convert_fx(prepared)
    with torch.no_grad():
        difference = float((lowered(x) - reference(x)).abs().max())
    last = [n for n in reference.graph.nodes if "dequantize" in str(n.target)][-1]
    assert difference <= float(last.args[1]) * 1.001 + 1e-6
