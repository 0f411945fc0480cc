"""The model zoo: real model shapes for the flow tests, the oracle tests and the benchmarks.

Every model is symbolically traceable by ``torch.fx``, built under a fixed
seed, and sized by its arguments: the defaults are the small test sizes, and
``bench/models.py`` builds the benchmark sizes from the same classes (one
place for model code).

Models: :class:`MLP`; :class:`ResNetLike` (conv-bn-relu bottlenecks, residual
add, max/avg pool, flatten, linear); :class:`MobileNetV2Like` (depthwise,
relu6, hardswish); :class:`FunctionalNet` (``F.linear``/``F.conv2d`` with
weights as parameters, ``torch.add``, ``torch.cat``, ``reshape``);
:class:`BertLike` (embedding, linear, matmul, softmax, layer_norm, gelu,
dropout, an additive large-negative mask built from an int ``attention_mask``
input, ``view`` with shape arguments derived from ``x.size()``);
:class:`FixedQParamsNet` (sigmoid and tanh, whose qparams are fixed);
:class:`SmallCNN` (8x8 images, for QAT training).

Example:
    >>> entry = ZOO["mlp"]
    >>> model = entry.build()
    >>> model(*entry.inputs(0)).shape
    torch.Size([4, 10])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MLP",
    "ZOO",
    "BertLike",
    "FixedQParamsNet",
    "FunctionalNet",
    "MobileNetV2Like",
    "ResNetLike",
    "SmallCNN",
    "ZooEntry",
    "bert_inputs",
    "seeded",
]


def seeded(build: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """Build a model under a fixed seed, in eval mode, with BN statistics that are not trivial.

    Example:
        >>> seeded(lambda: nn.Linear(2, 2)).weight.shape
        torch.Size([2, 2])
    """
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


class MLP(nn.Module):
    """Linear -> ReLU layers, then a linear classifier.

    Example:
        >>> MLP(depth=1)(torch.zeros(2, 16)).shape
        torch.Size([2, 10])
    """

    def __init__(self, features: int = 16, hidden: int = 32, depth: int = 2, classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        width = features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False)
    return [conv, nn.BatchNorm2d(cout)]


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 -> 3x3 -> 1x1 conv-bn(-relu), residual add, relu.

    Example:
        >>> Bottleneck(16, 4, 1)(torch.zeros(1, 16, 4, 4)).shape
        torch.Size([1, 16, 4, 4])
    """

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1, self.bn1 = _conv_bn(cin, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride)
        self.conv3, self.bn3 = _conv_bn(width, cout, 1)
        self.relu = nn.ReLU()
        self.downsample = (
            nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNetLike(nn.Module):
    """ResNet-50's layout at any depth and width: ``blocks=(3, 4, 6, 3), width=64`` is ResNet-50.

    Example:
        >>> ResNetLike()(torch.zeros(1, 3, 16, 16)).shape
        torch.Size([1, 10])
    """

    def __init__(self, blocks: tuple[int, ...] = (1, 1), width: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, width, 7, 2), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        stages: list[nn.Module] = []
        cin = width
        for index, count in enumerate(blocks):
            stage_width = width * 2**index
            for block in range(count):
                stride = 2 if index > 0 and block == 0 else 1
                stages.append(Bottleneck(cin, stage_width, stride))
                cin = stage_width * Bottleneck.expansion
        self.stages = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.pool(self.stem(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project, residual add when shapes match.

    Example:
        >>> InvertedResidual(8, 8, 1, 2)(torch.zeros(1, 8, 4, 4)).shape
        torch.Size([1, 8, 4, 4])
    """

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.block = nn.Sequential(
            *_conv_bn(cin, hidden, 1),
            nn.ReLU6(),
            *_conv_bn(hidden, hidden, 3, stride, groups=hidden),
            nn.ReLU6(),
            *_conv_bn(hidden, cout, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetV2Like(nn.Module):
    """Stem, inverted residuals (depthwise, relu6), hardswish head, avg pool, dropout, linear.

    Example:
        >>> MobileNetV2Like()(torch.zeros(1, 3, 16, 16)).shape
        torch.Size([1, 10])
    """

    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, width, 3, 2), nn.ReLU6())
        self.blocks = nn.Sequential(
            InvertedResidual(width, width, 1, 1),
            InvertedResidual(width, 2 * width, 2, 4),
            InvertedResidual(2 * width, 2 * width, 1, 4),
        )
        self.head = nn.Sequential(*_conv_bn(2 * width, 4 * width, 1), nn.Hardswish())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.head(self.blocks(self.stem(x))))
        return self.classifier(self.dropout(x.flatten(1)))


class FunctionalNet(nn.Module):
    """Weights held as parameters and applied with ``F.conv2d``/``F.linear``; add, cat, reshape.

    Example:
        >>> FunctionalNet()(torch.zeros(2, 3, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, channels: int = 4, size: int = 8, classes: int = 10):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(channels, 3, 3, 3) * 0.3)
        self.b1 = nn.Parameter(torch.randn(channels) * 0.1)
        self.w2 = nn.Parameter(torch.randn(channels, 3, 3, 3) * 0.3)
        self.b2 = nn.Parameter(torch.randn(channels) * 0.1)
        features = 2 * channels * size * size
        self.fc_w = nn.Parameter(torch.randn(classes, features) / math.sqrt(features))
        self.fc_b = nn.Parameter(torch.randn(classes) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = F.relu(F.conv2d(x, self.w1, self.b1, padding=1))
        right = F.conv2d(x, self.w2, self.b2, padding=1)
        both = torch.cat([torch.add(left, right), left], dim=1)
        return F.linear(both.reshape(x.size(0), -1), self.fc_w, self.fc_b)


class SelfAttention(nn.Module):
    """Multi-head attention written the way Hugging Face's BERT writes it.

    The head split takes its shape from ``x.size()[:-1] + (heads, head_dim)``:
    a ``torch.Size`` built by ``operator.add`` in the traced graph, which an
    observer must never see (torch.ao observes it and crashes in calibration).
    ``size_shapes=False`` passes the sizes one by one instead, which torch.ao
    survives, so the oracle can compare the rest of the block.

    Example:
        >>> SelfAttention(8, 2)(torch.zeros(1, 3, 8), torch.zeros(1, 1, 1, 3)).shape
        torch.Size([1, 3, 8])
    """

    def __init__(self, hidden: int, heads: int, dropout: float = 0.1, size_shapes: bool = True):
        super().__init__()
        self.size_shapes = size_shapes
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(hidden, hidden)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        if self.size_shapes:
            # BERT's spelling on purpose: `(*x.size()[:-1], ...)` would iterate a Proxy
            shape = x.size()[:-1] + (self.heads, self.head_dim)  # noqa: RUF005
            return x.view(shape).permute(0, 2, 1, 3)
        return x.view(x.size(0), x.size(1), self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = self.split_heads(self.query(x))
        k = self.split_heads(self.key(x))
        v = self.split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = self.dropout(F.softmax(scores + mask, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        if self.size_shapes:
            merged = context.size()[:-2] + (self.heads * self.head_dim,)  # noqa: RUF005
            return self.output(context.view(merged))
        return self.output(context.view(context.size(0), context.size(1), -1))


class EncoderLayer(nn.Module):
    """Attention, add & layer_norm, linear-gelu-linear feed-forward, add & layer_norm.

    Example:
        >>> EncoderLayer(8, 2, 16)(torch.zeros(1, 3, 8), torch.zeros(1, 1, 1, 3)).shape
        torch.Size([1, 3, 8])
    """

    def __init__(
        self, hidden: int, heads: int, ffn: int, dropout: float = 0.1, size_shapes: bool = True
    ) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads, dropout, size_shapes)
        self.norm1 = nn.LayerNorm(hidden)
        self.intermediate = nn.Linear(hidden, ffn)
        self.gelu = nn.GELU()
        self.ffn_out = nn.Linear(ffn, hidden)
        self.dropout = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.dropout(self.attention(x, mask)))
        ffn = self.ffn_out(self.gelu(self.intermediate(x)))
        return F.layer_norm(
            x + self.dropout(ffn), self.norm2.normalized_shape, self.norm2.weight, self.norm2.bias
        )


class BertLike(nn.Module):
    """A BERT encoder: token + position embeddings, ``layers`` encoder layers, a linear head.

    ``forward(input_ids, attention_mask)`` takes int64 token ids and an int mask
    (1 = token, 0 = padding) and turns the mask into an additive
    ``-10000`` mask, as BERT does (``masked=False`` adds zeros instead: a plain
    encoder, for comparisons where the mask's handling is not the subject).
    BERT-base is ``hidden=768, heads=12, ffn=3072, layers=12``.

    Example:
        >>> model = BertLike()
        >>> model(*bert_inputs(model.vocab, 0)).shape
        torch.Size([2, 12, 4])
    """

    def __init__(
        self,
        *,
        vocab: int = 50,
        hidden: int = 16,
        heads: int = 2,
        ffn: int = 32,
        layers: int = 2,
        max_len: int = 64,
        classes: int = 4,
        size_shapes: bool = True,
        masked: bool = True,
    ) -> None:
        super().__init__()
        self.vocab = vocab
        self.masked = masked
        self.words = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_len, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(0.1)
        self.layers = nn.ModuleList(
            EncoderLayer(hidden, heads, ffn, size_shapes=size_shapes) for _ in range(layers)
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # an int tensor computed in the graph: no observer may land on it
        positions = torch.arange(input_ids.size(1), device=input_ids.device).unsqueeze(0)
        x = self.dropout(self.norm(self.words(input_ids) + self.positions(positions)))
        if self.masked:
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        else:
            mask = torch.zeros_like(x[:, None, None, :, 0])
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(x)


def bert_inputs(
    vocab: int, seed: int, *, batch: int = 2, length: int = 12, padding: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and an int attention mask whose last ``padding`` positions are padding.

    Example:
        >>> ids, mask = bert_inputs(50, 0, padding=3)
        >>> mask[0].tolist()
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    """
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.int64)
    if padding:
        ids[:, length - padding :] = 0
        mask[:, length - padding :] = 0
    return ids, mask


class FixedQParamsNet(nn.Module):
    """Linear layers into sigmoid and tanh, whose output grids are fixed (1/256 and 2/256).

    Example:
        >>> FixedQParamsNet()(torch.zeros(2, 8)).shape
        torch.Size([2, 12])
    """

    def __init__(self, features: int = 8, hidden: int = 12):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.tanh = nn.Tanh()
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.fc2(self.tanh(self.fc1(x))))


class SmallCNN(nn.Module):
    """A classifier for 1x8x8 images (sklearn's digits): two conv-bn-relu, pool, linear.

    Example:
        >>> SmallCNN()(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

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


@dataclass(frozen=True)
class ZooEntry:
    """A zoo model: how to build it (seeded, eval mode) and how to draw a batch of inputs.

    Example:
        >>> ZOO["resnet"].inputs(0)[0].shape
        torch.Size([2, 3, 16, 16])
    """

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]


def _images(*shape: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    def draw(seed: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)),)

    return draw


def _bert_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    return bert_inputs(50, seed)


def _encoder() -> nn.Module:
    # what torch.ao survives: sizes passed one by one, and no additive mask, whose handling
    # fxquant changes on purpose (torch.ao observes it and loses the attention scores' range)
    return BertLike(size_shapes=False, masked=False)


ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in (
        ZooEntry("mlp", lambda: seeded(MLP), _images(4, 16)),
        ZooEntry("resnet", lambda: seeded(ResNetLike), _images(2, 3, 16, 16)),
        ZooEntry("mobilenet", lambda: seeded(MobileNetV2Like), _images(2, 3, 16, 16)),
        ZooEntry("functional", lambda: seeded(FunctionalNet), _images(2, 3, 8, 8)),
        ZooEntry("bert", lambda: seeded(BertLike), _bert_inputs),
        ZooEntry("encoder", lambda: seeded(_encoder), _bert_inputs),
        ZooEntry("fixed_qparams", lambda: seeded(FixedQParamsNet), _images(4, 8)),
    )
}
"""The models every oracle test runs, by name."""
