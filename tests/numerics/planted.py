"""A model with planted sensitive layers, for the debugger and fallback tests (issue 23).

``fc2`` and ``fc4`` each get a weight column of outliers (60) that meets an input
channel which is always 0 (the previous layer's row for it is zeroed), so the float
model does not feel them, but an 8-bit weight does: its step (60/127 per row) rounds
every other weight of the row to 0. Kept float, each computes its float value again.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 16
SENSITIVE = ("fc2", "fc4")


class Planted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, WIDTH)
        self.fc2 = nn.Linear(WIDTH, WIDTH)
        self.fc3 = nn.Linear(WIDTH, WIDTH)
        self.fc4 = nn.Linear(WIDTH, WIDTH)
        self.fc5 = nn.Linear(WIDTH, 4)
        with torch.no_grad():
            for before, sensitive in ((self.fc1, self.fc2), (self.fc3, self.fc4)):
                before.weight[0].zero_()
                before.bias[0] = -1.0  # after the ReLU, channel 0 is always 0
                sensitive.weight[:, 0] = 60.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        x = torch.relu(self.fc3(x))
        x = torch.relu(self.fc4(x))
        return self.fc5(x)


def batches(count: int = 4, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(32, 8, generator=generator) for _ in range(count)]


DOMINANT, DECOY = "big", "small"


class Dominant(nn.Module):
    """One Linear causes most of the output's error, another has the worst local error.

    ``big`` reads an input with an outlier channel (30x): its input quantization step
    crushes the other channels, and its output is the model's. ``small`` reads an input
    with a worse outlier (1000x) through a zero weight column, so it sees only crushed
    channels (local SQNR near 0 dB), but its weights are 1e-3 of ``big``'s: the output
    hardly feels it. Ranking by local error points at ``small``; keeping it float gains
    nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.big = nn.Linear(WIDTH, WIDTH)
        self.small = nn.Linear(WIDTH, WIDTH)
        with torch.no_grad():
            self.small.weight.mul_(1e-3)
            self.small.bias.mul_(1e-3)
            self.small.weight[:, 0] = 0.0  # reads only the channels the outlier crushes

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.big(x) + self.small(z)


def outlier_batches(
    count: int = 4, seed: int = 0, outlier: float = 30.0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inputs of :class:`Dominant`: channel 0 of ``x`` times ``outlier``, of ``z`` 1000x."""
    generator = torch.Generator().manual_seed(seed)
    found = []
    for _ in range(count):
        x = torch.randn(32, WIDTH, generator=generator)
        z = torch.randn(32, WIDTH, generator=generator)
        x[:, 0] *= outlier
        z[:, 0] *= 1000.0
        found.append((x, z))
    return found
