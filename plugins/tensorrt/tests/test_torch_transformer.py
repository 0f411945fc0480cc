"""torch's own nn.TransformerEncoder, int8 through the ONNX export in onnxruntime (#20)."""

from __future__ import annotations

import fxquant
import torch
from fxquant_tensorrt import deploy
from torch import nn


def sqnr_db(signal: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (signal - approximation).pow(2).mean()
    return float(10 * torch.log10(signal.pow(2).mean() / noise))


def test_torch_transformer_encoder_deploys_with_its_linears_int8() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 6, 32)
    prepared = fxquant.prepare_fx(
        encoder,
        fxquant.get_default_qconfig_mapping("tensorrt"),
        (x,),
        backend_config=fxquant.get_backend_config("tensorrt"),
    )
    with torch.no_grad():
        for _ in range(3):
            prepared(torch.randn(2, 6, 32))
        converted = fxquant.convert_fx(prepared)
        expected = encoder(x)
    deployed = deploy(converted, (x,))(x)
    deployed = deployed[0] if isinstance(deployed, (list, tuple)) else deployed
    assert sqnr_db(expected, torch.as_tensor(deployed)) > 28.0
    linears = [
        e for e in fxquant.explain(converted).entries() if e.pattern and "Linear" in e.pattern
    ]
    assert len(linears) == 8  # in_proj, out_proj, linear1 (+relu), linear2 per layer
