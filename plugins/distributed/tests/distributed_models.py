"""The small CNN the multi-process tests train and calibrate (as tests/flow/zoo.py's SmallCNN)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def seeded(build: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """Build a model under a fixed seed, in eval mode, with BN statistics that are not trivial."""
    torch.manual_seed(seed)
    model = build()
    # fresh BN layers fold to identity: give them statistics so folding is exercised
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
            nn.init.uniform_(module.weight, 0.5, 1.5)
            nn.init.uniform_(module.bias, -0.2, 0.2)
    return model.eval()


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False)
    return [conv, nn.BatchNorm2d(cout)]


class SmallCNN(nn.Module):
    """A classifier for 1x8x8 images (sklearn's digits): two conv-bn-relu, pool, linear."""

    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(1, width, 3)
        self.relu1 = nn.ReLU()
        self.conv2, self.bn2 = _conv_bn(width, 2 * width, 3, 2)
        self.relu2 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(8 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.pool(x), 1))
