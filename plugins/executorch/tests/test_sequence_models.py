"""PyTorch's stock sequence modules as ``.pte`` programs (#20): ``nn.TransformerEncoder``
(batch_first, masks) and an LSTM tagger export, run in ExecuTorch's runtime, and match the
reference model. Small sizes: ExecuTorch's lowering is most of each test's time."""

from __future__ import annotations

import math

import pytest
import torch
from fxquant.tools import testing
from fxquant_executorch import to_executorch
from torch import nn

BACKEND = "executorch"


def sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    noise = (expected - got).double().pow(2).sum()
    return (
        math.inf if noise == 0 else float(10 * torch.log10(expected.double().pow(2).sum() / noise))
    )


class MaskedEncoder(nn.Module):
    """One batch_first post-norm layer with a causal mask and a key padding mask."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(6))
        padding = torch.zeros(2, 6)
        padding[1, 4:] = float("-inf")  # the second sequence is 4 tokens long
        self.register_buffer("padding", padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x, mask=self.mask, src_key_padding_mask=self.padding)


class Tagger(nn.Module):
    """Embedding, one bidirectional LSTM layer, a linear layer per token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 8, 1, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.fc(out)


# torch.export notes that nn.LSTM re-assigns its _flat_weights list while exported (torch's
# own module, nothing the user can register): a warning, not a failure
@pytest.mark.filterwarnings("ignore:The tensor attributes self.lstm._flat_weights:UserWarning")
@pytest.mark.parametrize(
    ("build", "draw"),
    [
        (MaskedEncoder, lambda g: torch.randn(2, 6, 16, generator=g)),
        (Tagger, lambda g: torch.randint(0, 20, (2, 3), generator=g)),
    ],
    ids=["transformer_encoder", "lstm_tagger"],
)
def test_a_stock_sequence_model_exports_runs_and_matches_the_reference(build, draw) -> None:
    torch.manual_seed(0)
    model = build().eval()
    inputs = [[draw(torch.Generator().manual_seed(seed))] for seed in range(3)]
    converted, reference = testing.quantize_model(BACKEND, model, inputs)
    x = draw(torch.Generator().manual_seed(99))
    program = to_executorch(converted, (x,))
    statuses = {e.node: e.status for e in program.report.entries()}
    assert statuses.get("fc", statuses.get("encoder_layers_0_linear1")) == "lowered"
    with torch.no_grad():
        expected, from_reference = model(x), reference(x)
    got = program(x)
    # the Linear inputs are quantized per token at run time (XNNPACK picks its own qparams):
    # as close to float as the reference model, not equal to it
    error = float((got - expected).abs().max())
    assert error <= 2 * float((from_reference - expected).abs().max()) + 1e-6
    assert sqnr(expected, got) >= sqnr(expected, from_reference) - 1.0 >= 25.0
