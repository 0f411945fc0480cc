"""Vision architectures written here, small and random (issue 20's zoo).

Each class follows its paper's block structure at toy widths, so the ops that
matter to quantization appear as in the real networks: residual adds, grouped
and depthwise convs, hardswish and squeeze-excite, SiLU and stochastic depth,
channel concatenation, channel shuffle by ``chunk``, LayerNorm on channels-last
with a depthwise 7x7 and GELU, patch embeddings with attention, and window
attention with ``unbind``. Inputs are 2 x 3 x 32 x 32 images.

Example:
    >>> model = ResNet().eval()
    >>> model(torch.zeros(1, 3, 32, 32)).shape
    torch.Size([1, 10])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ConvNeXt",
    "DenseNet",
    "EfficientNet",
    "GoogLeNet",
    "MobileNetV2",
    "MobileNetV3",
    "RegNet",
    "ResNeXt",
    "ResNet",
    "ShuffleNetV2",
    "SqueezeNet",
    "SwinLike",
    "ViT",
]

CLASSES = 10


def conv_bn(
    cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1
) -> nn.Sequential:
    """Conv (no bias) and BatchNorm, the pair every CNN here folds."""
    conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout))


def conv_bn_act(
    cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, act: type = nn.ReLU
) -> nn.Sequential:
    """Conv, BatchNorm and an activation."""
    return nn.Sequential(*conv_bn(cin, cout, kernel, stride, groups), act())


class Head(nn.Module):
    """Global average pool, flatten, linear classifier."""

    def __init__(self, cin: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(x), 1))


# --- ResNet / ResNeXt ------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """ResNet-18's block; with ``groups`` > 1 and a bottleneck width, ResNeXt's."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int = 1):
        super().__init__()
        mid = cout if groups == 1 else cout // 2
        self.a = conv_bn_act(cin, mid, 1 if groups > 1 else 3, 1 if groups > 1 else stride)
        self.b = conv_bn_act(mid, mid, 3, stride, groups) if groups > 1 else nn.Identity()
        self.c = conv_bn(mid, cout, 1 if groups > 1 else 3)
        self.skip = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.c(self.b(self.a(x))) + self.skip(x))


class ResNet(nn.Module):
    """ResNet: a stem, residual stages, a head (``groups`` > 1: ResNeXt's grouped 3x3)."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), groups: int = 1):
        super().__init__()
        self.stem = conv_bn_act(3, widths[0], 3, 1)
        self.pool = nn.MaxPool2d(3, 2, 1)
        blocks, cin = [], widths[0]
        for i, width in enumerate(widths):
            blocks.append(BasicBlock(cin, width, 1 if i == 0 else 2, groups))
            cin = width
        self.blocks = nn.Sequential(*blocks)
        self.head = Head(cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.pool(self.stem(x))))


class ResNeXt(ResNet):
    """ResNeXt: ResNet with 1x1 -> grouped 3x3 (8 groups) -> 1x1 blocks."""

    def __init__(self) -> None:
        super().__init__((32, 64, 128), groups=8)


# --- MobileNetV2 / V3, EfficientNet ---------------------------------------------------------


class SqueezeExcite(nn.Module):
    """Squeeze-excite: pool, reduce, activate, expand, gate (hardsigmoid or sigmoid), multiply."""

    def __init__(self, channels: int, act: type = nn.ReLU, gate: type = nn.Hardsigmoid):
        super().__init__()
        squeezed = max(8, channels // 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(squeezed, channels, 1)
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class StochasticDepth(nn.Module):
    """Drops the residual branch per sample while training; the identity in eval."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty(x.shape[0], 1, 1, 1, device=x.device).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class InvertedResidual(nn.Module):
    """MobileNetV2/V3 and EfficientNet's MBConv: expand, depthwise, (SE), project, (add)."""

    def __init__(
        self,
        cin: int,
        cout: int,
        stride: int,
        expand: int,
        *,
        act: type = nn.ReLU6,
        se: type | None = None,
        kernel: int = 3,
        drop: float = 0.0,
    ):
        super().__init__()
        mid = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn_act(cin, mid, 1, act=act))
        layers.append(conv_bn_act(mid, mid, kernel, stride, mid, act=act))
        if se is not None:
            layers.append(se(mid))
        layers.append(conv_bn(mid, cout, 1))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout
        self.drop = StochasticDepth(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return x + self.drop(out) if self.residual else out


class MobileNetV2(nn.Module):
    """MobileNetV2 at width 0.25: ReLU6 inverted residuals."""

    settings = ((1, 8, 1, 1), (6, 16, 2, 2), (6, 24, 2, 2), (6, 32, 2, 1))

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn_act(3, 8, 3, 2, act=nn.ReLU6)]
        cin = 8
        for expand, cout, repeats, stride in self.settings:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(conv_bn_act(cin, 64, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.head = Head(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MobileNetV3(nn.Module):
    """MobileNetV3-Small-like: hardswish, squeeze-excite with hardsigmoid, 5x5 depthwise."""

    def __init__(self) -> None:
        super().__init__()
        se = SqueezeExcite
        self.features = nn.Sequential(
            conv_bn_act(3, 16, 3, 2, act=nn.Hardswish),
            InvertedResidual(16, 16, 2, 1, act=nn.ReLU, se=se),
            InvertedResidual(16, 24, 2, 4, act=nn.ReLU),
            InvertedResidual(24, 24, 1, 3, act=nn.ReLU),
            InvertedResidual(24, 40, 2, 4, act=nn.Hardswish, se=se, kernel=5),
            InvertedResidual(40, 40, 1, 3, act=nn.Hardswish, se=se, kernel=5),
            conv_bn_act(40, 96, 1, act=nn.Hardswish),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(96, 128), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(128, CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class EfficientNet(nn.Module):
    """EfficientNet-B0-like: SiLU MBConv with SE (sigmoid gate) and stochastic depth."""

    def __init__(self) -> None:
        super().__init__()

        def se(c: int) -> nn.Module:
            return SqueezeExcite(c, nn.SiLU, nn.Sigmoid)

        blocks = [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 64, 1, 2, 3)]
        layers: list[nn.Module] = [conv_bn_act(3, 16, 3, 2, act=nn.SiLU)]
        cin, index, total = 16, 0, sum(b[2] for b in blocks)
        for expand, cout, repeats, stride, kernel in blocks:
            for i in range(repeats):
                drop = 0.2 * index / total
                layers.append(
                    InvertedResidual(
                        cin,
                        cout,
                        stride if i == 0 else 1,
                        expand,
                        act=nn.SiLU,
                        se=se,
                        kernel=kernel,
                        drop=drop,
                    )
                )
                cin, index = cout, index + 1
        layers.append(conv_bn_act(cin, 128, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.head = Head(128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# --- RegNet, DenseNet, GoogLeNet, ShuffleNetV2, SqueezeNet ---------------------------------------


class RegNet(nn.Module):
    """RegNetY-like: X blocks (1x1, grouped 3x3 of group width 8, 1x1) with SE, residual add."""

    def __init__(self, widths: tuple[int, ...] = (24, 48, 96)):
        super().__init__()
        self.stem = conv_bn_act(3, 16, 3, 2)
        blocks, cin = [], 16
        for width in widths:
            blocks.append(_RegNetBlock(cin, width, 2))
            blocks.append(_RegNetBlock(width, width, 1))
            cin = width
        self.blocks = nn.Sequential(*blocks)
        self.head = Head(cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class _RegNetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.a = conv_bn_act(cin, cout, 1)
        self.b = conv_bn_act(cout, cout, 3, stride, cout // 8)
        self.se = SqueezeExcite(cout, nn.ReLU, nn.Sigmoid)
        self.c = conv_bn(cout, cout, 1)
        self.skip = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.c(self.se(self.b(self.a(x)))) + self.skip(x))


class _DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU()
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(4 * growth), nn.ReLU()
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        x = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseNet(nn.Module):
    """DenseNet-121-like: pre-activation dense layers over ``torch.cat`` of every earlier output."""

    def __init__(self, growth: int = 8, layers: tuple[int, ...] = (3, 3)):
        super().__init__()
        self.stem = conv_bn_act(3, 16, 3, 1)
        self.blocks = nn.ModuleList()
        self.transitions = nn.ModuleList()
        cin = 16
        for i, count in enumerate(layers):
            self.blocks.append(
                nn.ModuleList(_DenseLayer(cin + j * growth, growth) for j in range(count))
            )
            cin += count * growth
            if i < len(layers) - 1:
                self.transitions.append(
                    nn.Sequential(
                        nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cin // 2, 1), nn.AvgPool2d(2)
                    )
                )
                cin //= 2
        self.final = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU())
        self.head = Head(cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, 1)
            if i < len(self.transitions):
                x = self.transitions[i](x)
        return self.head(self.final(x))


class _Inception(nn.Module):
    def __init__(self, cin: int, c1: int, c3: tuple[int, int], c5: tuple[int, int], cp: int):
        super().__init__()
        self.b1 = conv_bn_act(cin, c1, 1)
        self.b2 = nn.Sequential(conv_bn_act(cin, c3[0], 1), conv_bn_act(c3[0], c3[1], 3))
        self.b3 = nn.Sequential(conv_bn_act(cin, c5[0], 1), conv_bn_act(c5[0], c5[1], 3))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv_bn_act(cin, cp, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


class GoogLeNet(nn.Module):
    """GoogLeNet / Inception-v1-like: four-branch inception modules concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn_act(3, 32, 3, 1), nn.MaxPool2d(3, 2, 1))
        self.a = _Inception(32, 16, (16, 24), (8, 8), 8)
        self.b = _Inception(56, 24, (24, 32), (8, 16), 16)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.c = _Inception(88, 32, (24, 40), (8, 16), 16)
        self.dropout = nn.Dropout(0.2)
        self.head = Head(104)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b(self.a(self.stem(x)))
        return self.head(self.dropout(self.c(self.pool(x))))


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's shuffle: (b, g, c/g, h, w) transposed and flattened back."""
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    return torch.transpose(x, 1, 2).contiguous().view(b, c, h, w)


class _ShuffleBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(
                conv_bn(cin, cin, 3, stride, cin), conv_bn_act(cin, half, 1)
            )
        else:
            self.branch1 = nn.Identity()
        first = cin if stride > 1 else half
        self.branch2 = nn.Sequential(
            conv_bn_act(first, half, 1),
            conv_bn(half, half, 3, stride, half),
            conv_bn_act(half, half, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """ShuffleNetV2 x0.5-like: ``chunk`` into two halves, one transformed, cat, channel shuffle."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn_act(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1))
        self.stages = nn.Sequential(
            _ShuffleBlock(24, 48, 2),
            _ShuffleBlock(48, 48, 1),
            _ShuffleBlock(48, 96, 2),
            _ShuffleBlock(96, 96, 1),
        )
        self.conv = conv_bn_act(96, 128, 1)
        self.head = Head(128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(self.stages(self.stem(x))))


class _Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
        self.e1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
        self.e3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze(x)
        return torch.cat([self.e1(x), self.e3(x)], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1-like: fire modules (squeeze 1x1, expand 1x1 and 3x3, cat), conv classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            _Fire(32, 8, 32),
            _Fire(64, 8, 32),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            _Fire(64, 16, 48),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Conv2d(96, CLASSES, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


# --- ConvNeXt, ViT, Swin ---------------------------------------------------------------------


class _ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # channels-last
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class _LayerNorm2d(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps).permute(
            0, 3, 1, 2
        )


class ConvNeXt(nn.Module):
    """ConvNeXt-T-like: patchify stem, depthwise 7x7, LayerNorm on channels-last, GELU MLP."""

    def __init__(self, dims: tuple[int, ...] = (32, 64)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), _LayerNorm2d(dims[0], eps=1e-6))
        stages: list[nn.Module] = []
        for i, dim in enumerate(dims):
            if i:
                stages += [_LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            stages += [_ConvNeXtBlock(dim), _ConvNeXtBlock(dim)]
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.fc = nn.Linear(dims[-1], CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x)).mean([-2, -1])
        return self.fc(self.norm(x))


class _Attention(nn.Module):
    """Multi-head self-attention with a fused qkv projection split by ``unbind``."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        if bias is not None:
            attn = attn + bias
        attn = attn.softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A small ViT: 4x4 patches, class token, learned positions, pre-norm blocks."""

    def __init__(
        self, dim: int = 64, depth: int = 2, heads: int = 4, patch: int = 4, size: int = 32
    ):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        tokens = (size // patch) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*(_Block(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.fc(x[:, 0])


class _WindowBlock(nn.Module):
    """Swin's block: attention inside non-overlapping windows (optionally shifted by ``roll``)
    with a learned relative-position bias, then an MLP."""

    def __init__(self, dim: int, heads: int, window: int, shift: int):
        super().__init__()
        self.window, self.shift = window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads)
        self.bias = nn.Parameter(torch.randn(1, heads, window * window, window * window) * 0.02)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        win = self.window
        y = self.norm1(x)
        if self.shift:
            y = torch.roll(y, shifts=(-self.shift, -self.shift), dims=(1, 2))
        y = y.view(b, h // win, win, w // win, win, c).permute(0, 1, 3, 2, 4, 5)
        y = self.attn(y.reshape(-1, win * win, c), self.bias)
        y = y.view(b, h // win, w // win, win, win, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        if self.shift:
            y = torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))
        x = x + y
        return x + self.mlp(self.norm2(x))


class SwinLike(nn.Module):
    """Swin-T-like: patch embedding, window and shifted-window attention, patch merging."""

    def __init__(self, dim: int = 32, heads: int = 2, window: int = 4):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.norm0 = nn.LayerNorm(dim)
        self.stage1 = nn.Sequential(
            _WindowBlock(dim, heads, window, 0), _WindowBlock(dim, heads, window, 2)
        )
        self.merge_norm = nn.LayerNorm(4 * dim)
        self.merge = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.stage2 = nn.Sequential(_WindowBlock(2 * dim, 2 * heads, window, 0))
        self.norm = nn.LayerNorm(2 * dim)
        self.fc = nn.Linear(2 * dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm0(self.patch(x).permute(0, 2, 3, 1))  # b, h, w, c
        x = self.stage1(x)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        x = self.stage2(self.merge(self.merge_norm(x)))
        return self.fc(self.norm(x).mean(dim=(1, 2)))
