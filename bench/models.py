"""Benchmark-size models, built from the test zoo's classes (tests/flow/zoo.py: one place for
model code).

ResNet-50 is ``ResNetLike(blocks=(3, 4, 6, 3), width=64)``; "4x the blocks" is
``(12, 16, 24, 12)``; BERT-base is ``BertLike(hidden=768, heads=12,
ffn=3072, layers=12)``. The BERT passes its view shapes one size at a time
(``size_shapes=False``): torch.ao crashes calibrating the ``x.size()[:-1] +
(...)`` form, and the benchmark runs the same model through both flows.

Example:
    >>> spec = bench_models(quick=True)["resnet50"]
    >>> spec.build()(*spec.inputs()).shape
    torch.Size([1, 1000])
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx, nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/bench_flow.py`: the zoo lives in tests/
    sys.path.insert(0, str(ROOT))

from tests.flow.zoo import (  # noqa: E402
    MLP,
    BertLike,
    InvertedResidual,
    ResNetLike,
    bert_inputs,
    seeded,
)
from tests.zoo import hf as zoo_hf  # noqa: E402

__all__ = [
    "BenchModel",
    "MobileNetV2",
    "bench_models",
    "bert_base",
    "calibration_models",
    "concrete_graph",
    "hf_bert",
    "main_output",
    "mlp",
    "mobilenet_v2",
    "resnet_at_depth",
]

RESNET50_BLOCKS = (3, 4, 6, 3)


@dataclass(frozen=True)
class BenchModel:
    """A benchmark model: a seeded builder (eval mode) and its example inputs.

    Example:
        >>> BenchModel("m", lambda: nn.Linear(2, 2), lambda: (torch.zeros(1, 2),)).name
        'm'
    """

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]


def _images(batch: int, size: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    def inputs() -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(0)
        return (torch.randn(batch, 3, size, size, generator=generator),)

    return inputs


def resnet_at_depth(
    multiplier: int, *, quick: bool = False, image: int | None = None, batch: int = 1
) -> BenchModel:
    """ResNet-50's layout with ``multiplier`` times its blocks (quick: width 16, 64x64 images).

    Example:
        >>> resnet_at_depth(2, quick=True).name
        'resnet50_x2'
    """
    blocks = tuple(multiplier * count for count in RESNET50_BLOCKS)
    width, size = (16, 64) if quick else (64, 224)
    size = image or size
    name = "resnet50" if multiplier == 1 else f"resnet50_x{multiplier}"

    def build() -> nn.Module:
        return seeded(lambda: ResNetLike(blocks=blocks, width=width, classes=1000))

    return BenchModel(name, build, _images(batch, size))


def bert_base(*, quick: bool = False, length: int | None = None, batch: int = 1) -> BenchModel:
    """A 12-layer BERT-base-like encoder, sequence length 128 (quick: hidden 192, length 32).

    Example:
        >>> bert_base(quick=True, batch=8).inputs()[0].shape
        torch.Size([8, 32])
    """
    hidden, ffn, default_length = (192, 768, 32) if quick else (768, 3072, 128)
    length = length or default_length
    vocab = 30522

    def build() -> nn.Module:
        return seeded(
            lambda: BertLike(
                vocab=vocab,
                hidden=hidden,
                heads=12,
                ffn=ffn,
                layers=12,
                max_len=512,
                classes=2,
                size_shapes=False,
            )
        )

    def inputs() -> tuple[torch.Tensor, ...]:
        return bert_inputs(vocab, 0, batch=batch, length=length, padding=length // 8)

    return BenchModel("bert_base", build, inputs)


def hf_bert(*, quick: bool = False, batch: int = 1, length: int = 128) -> BenchModel:
    """transformers' ``BertModel`` with BERT-base's config and random weights (no download).

    Inputs: token ids and an int attention mask whose last eighth is padding.
    Quick: 2 layers, hidden 192, 32 tokens. Needs ``transformers`` (the test extra).

    Example:
        >>> spec = hf_bert(quick=True)
        >>> spec.build()(*spec.inputs()).last_hidden_state.shape
        torch.Size([1, 32, 192])
    """
    import transformers

    layers, hidden, heads, ffn = (2, 192, 12, 768) if quick else (12, 768, 12, 3072)
    length = 32 if quick else length
    config = transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
    )

    def build() -> nn.Module:
        return seeded(lambda: transformers.BertModel(config))

    def inputs() -> tuple[torch.Tensor, ...]:
        return bert_inputs(config.vocab_size, 0, batch=batch, length=length, padding=length // 8)

    return BenchModel("hf_bert", build, inputs)


def main_output(output: object) -> torch.Tensor:
    """The tensor to compare: a transformers model's ``last_hidden_state``, else the output.

    Example:
        >>> main_output({"last_hidden_state": torch.ones(1)})
        tensor([1.])
    """
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):  # transformers' ModelOutput is a dict, also when traced
        return output["last_hidden_state"]
    msg = f"no tensor to compare in {type(output).__name__}"
    raise TypeError(msg)


def concrete_graph(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    """``model`` traced by transformers' tracer, its shapes, dtypes and finfo made constants.

    torch.ao's ``prepare_fx`` traces what it is given again with a plain fx tracer,
    which fails on transformers' own graph (a buffer sliced by a traced length,
    ``torch.finfo`` of a traced dtype). Every node whose value at ``inputs`` is not a
    tensor (a size, a dtype, a finfo, a number) becomes that constant, so the graph
    traces again; it then only runs at the shapes of ``inputs``, which is all a
    benchmark at one shape needs.

    Example:
        >>> spec = hf_bert(quick=True)
        >>> model, inputs = spec.build(), spec.inputs()
        >>> gm = concrete_graph(model, inputs)
        >>> torch.equal(gm(*inputs)["last_hidden_state"], model(*inputs).last_hidden_state)
        True
    """
    names = ["input_ids", "attention_mask"][: len(inputs)]
    return zoo_hf.concrete_graph(model, inputs, names)


# MobileNetV2's inverted residual settings: (expansion, channels, repeats, first stride)
MOBILENET_V2_SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class MobileNetV2(nn.Module):
    """MobileNetV2's full layout (17 inverted residuals) from the zoo's block, scaled by ``width``.

    The zoo's ``MobileNetV2Like`` has three blocks (a test size); this is the benchmark size:
    a 3x3 stem, the seven stages of :data:`MOBILENET_V2_SETTINGS`, a 1x1 head with hardswish,
    average pool, dropout and a linear classifier.

    Example:
        >>> MobileNetV2(width=0.25, classes=10).eval()(torch.zeros(1, 3, 32, 32)).shape
        torch.Size([1, 10])
    """

    def __init__(self, width: float = 1.0, classes: int = 1000) -> None:
        super().__init__()
        cin = max(8, int(32 * width))
        head = max(32, int(1280 * width))
        self.stem = nn.Sequential(
            nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU6()
        )
        blocks: list[nn.Module] = []
        for expand, channels, repeats, stride in MOBILENET_V2_SETTINGS:
            cout = max(8, int(channels * width))
            for index in range(repeats):
                blocks.append(InvertedResidual(cin, cout, stride if index == 0 else 1, expand))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.Conv2d(cin, head, 1, bias=False), nn.BatchNorm2d(head), nn.Hardswish()
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(head, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.head(self.blocks(self.stem(x))))
        return self.classifier(self.dropout(x.flatten(1)))


def mobilenet_v2(*, quick: bool = False, batch: int = 1) -> BenchModel:
    """MobileNetV2 at 224x224 (quick: width 0.25, 64x64 images), batch ``batch``.

    Example:
        >>> mobilenet_v2(quick=True, batch=8).inputs()[0].shape
        torch.Size([8, 3, 64, 64])
    """
    width, size = (0.25, 64) if quick else (1.0, 224)

    def build() -> nn.Module:
        return seeded(lambda: MobileNetV2(width=width, classes=1000))

    return BenchModel("mobilenet_v2", build, _images(batch, size))


def mlp(*, quick: bool = False, batch: int = 32) -> BenchModel:
    """An MLP: 512 features, three 1024-wide linear-relu layers, 10 classes (quick: 64/128).

    Example:
        >>> mlp(quick=True).inputs()[0].shape
        torch.Size([32, 64])
    """
    features, hidden = (64, 128) if quick else (512, 1024)

    def build() -> nn.Module:
        return seeded(lambda: MLP(features=features, hidden=hidden, depth=3, classes=10))

    def inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, features, generator=torch.Generator().manual_seed(0)),)

    return BenchModel("mlp", build, inputs)


def bench_models(*, quick: bool = False) -> dict[str, BenchModel]:
    """The three models of issue 4's targets, by name.

    Example:
        >>> sorted(bench_models(quick=True))
        ['bert_base', 'resnet50', 'resnet50_x4']
    """
    models = (
        resnet_at_depth(1, quick=quick),
        bert_base(quick=quick),
        resnet_at_depth(4, quick=quick),
    )
    return {model.name: model for model in models}


def calibration_models(*, quick: bool = False) -> dict[str, BenchModel]:
    """The CNN and BERT at their full input size and at a small one (batch 1, 64x64 images,
    16 tokens), where the observers' per-call cost weighs most against the float work.

    Example:
        >>> sorted(calibration_models(quick=True))
        ['bert_base', 'bert_base@16', 'resnet50', 'resnet50@64']
    """
    return {
        "resnet50": resnet_at_depth(1, quick=quick),
        "resnet50@64": resnet_at_depth(1, quick=quick, image=64),
        "bert_base": bert_base(quick=quick),
        "bert_base@16": bert_base(quick=quick, length=16),
    }
