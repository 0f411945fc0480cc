"""``x.size()`` and ``x.shape`` read a shape, never a value: no backend lowers or skips them
(issue 30: strict ``convert_fx`` refused HF ConvNeXt and BERT over a ``size`` whose lowering
rule declined without a reason)."""

from __future__ import annotations

import fxquant
import pytest
import torch
from torch import nn


class ShapeReads(nn.Module):
    """A batch size read from the float input, a channel count from a conv's int8 output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.size(0)
        y = self.conv(x)
        channels = y.shape[1]
        return self.fc(y.mean((2, 3)).reshape(batch, channels))


@pytest.mark.parametrize("backend", ["x86", "fbgemm", "qnnpack", "onednn"])
def test_strict_convert_lists_no_shape_read(backend: str) -> None:
    if backend not in fxquant.list_backends():
        pytest.skip(f"backend {backend!r} is not installed")
    torch.manual_seed(0)
    model, x = ShapeReads().eval(), torch.randn(2, 3, 8, 8)
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config, strict=True)
    prepared(x)
    lowered = fxquant.convert_fx(prepared, backend_config=config, strict=True)
    reads = [e for e in fxquant.explain(lowered, show=False).entries() if e.node == "size"]
    assert [e.status for e in reads] == ["float"]
    if reads[0].pattern is not None:  # a backend listing ``size`` (torch.ao's do) says why
        assert reads[0].reason is not None
        assert "reads the tensor's shape" in reads[0].reason.words
    # the lowered model still reads the shapes: the same outputs as its reference model
    reference = fxquant.convert_to_reference_fx(prepared, backend_config=config)
    assert lowered(x).shape == reference(x).shape == (2, 4)
