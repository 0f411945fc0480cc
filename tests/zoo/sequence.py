"""PyTorch's stock sequence modules as users write them (issue 20's zoo).

``nn.TransformerEncoder`` (batch_first, with a key padding mask), ``nn.TransformerDecoder``
(causal mask, norm_first), the whole ``nn.Transformer`` (sequence-first), and an LSTM
tagger (embedding, bidirectional ``nn.LSTM``, linear). Inputs are small float sequences
(2 x 16 x 64) or token ids.

Example:
    >>> TransformerEncoder().eval()(torch.zeros(2, 16, 64)).shape
    torch.Size([2, 16, 64])
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LSTMTagger", "Transformer", "TransformerDecoder", "TransformerEncoder"]

DIM, HEADS, FFN = 64, 4, 128


class TransformerEncoder(nn.Module):
    """``nn.TransformerEncoder`` of two batch_first post-norm layers."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(DIM, HEADS, FFN, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class TransformerDecoder(nn.Module):
    """``nn.TransformerDecoder`` of two batch_first pre-norm layers over a memory, causal mask."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerDecoderLayer(
            DIM, HEADS, FFN, dropout=0.1, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, 2)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        memory = x.flip(1)
        return self.decoder(x, memory, tgt_mask=self.mask)


class Transformer(nn.Module):
    """``nn.Transformer`` (one encoder and one decoder layer, sequence-first, GELU)."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.Transformer(
            DIM, HEADS, 1, 1, FFN, dropout=0.1, activation="gelu", batch_first=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        src = x.transpose(0, 1)
        return self.transformer(src, src[:8]).transpose(0, 1)


class LSTMTagger(nn.Module):
    """A sequence tagger: embedding, bidirectional two-layer ``nn.LSTM``, linear per token."""

    def __init__(self, vocab: int = 100, dim: int = 32, hidden: int = 48, tags: int = 12):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, 2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, tags)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.fc(out)
