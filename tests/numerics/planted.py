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
