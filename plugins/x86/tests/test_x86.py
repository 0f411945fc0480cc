"""The x86 backend: torch's x86 patterns, oneDNN kernels, a transformer-friendly default mapping."""

from __future__ import annotations

import copy
import importlib
import operator
import warnings
from collections.abc import Iterator
from typing import Any

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.config.pattern import simple_to_complex, validate_complex
from fxquant.registry.manager import Registry
from fxquant.torch_ao_names import as_fxquant_class
from fxquant_x86 import patterns
from fxquant_x86.patterns import pattern_configs
from torch import fx, nn

BACKEND = "x86"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def quantize(model: nn.Module, batches: list[torch.Tensor], mapping: Any = None) -> fx.GraphModule:
    mapping = mapping or fxquant.get_default_qconfig_mapping(BACKEND)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_fx(model.eval(), mapping, (batches[0],), backend_config=config)
    with torch.no_grad():
        for batch in batches:
            prepared(batch)
    return fxquant.convert_fx(prepared)


def sqnr(reference: torch.Tensor, test: torch.Tensor) -> float:
    return float(20 * torch.log10(reference.norm() / (reference - test).norm()))


class EncoderLayer(nn.Module):
    """A BERT-like layer: attention, residual add + LayerNorm, GELU feed-forward."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        split = [
            f(x).reshape(batch, tokens, self.heads, width // self.heads).transpose(1, 2)
            for f in self.qkv
        ]
        scores = torch.matmul(split[0], split[1].transpose(-1, -2)) * (self.heads / width) ** 0.5
        context = torch.matmul(F.softmax(scores, dim=-1), split[2])
        x = self.norm1(x + self.out(context.transpose(1, 2).reshape(batch, tokens, width)))
        return self.norm2(x + self.down(F.gelu(self.up(x))))


def test_default_mapping_keeps_a_bert_like_encoder_above_30_db() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(EncoderLayer() for _ in range(4))).eval()
    batches = [torch.randn(2, 16, 64) for _ in range(4)]
    lowered = quantize(model, batches)
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        assert sqnr(model(x), lowered(x)) >= 30
    statuses = {e.node: e.status for e in fxquant.explain(lowered).entries()}
    ups = [status for node, status in statuses.items() if node.endswith("up")]
    norms = [status for node, status in statuses.items() if "norm" in node]
    assert ups == ["lowered"] * 4
    assert norms == ["float"] * 8


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + x)


def test_cnn_runs_onednn_conv_kernels_within_one_step_of_reference() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), Block(8), nn.MaxPool2d(2))
    x = torch.randn(2, 3, 8, 8)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_fx(
        model.eval(), fxquant.get_default_qconfig_mapping(BACKEND), (x,), backend_config=config
    )
    prepared(x)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    lowered = fxquant.convert_fx(prepared)
    kernels = {type(m).__name__ for m in lowered.modules()}
    assert "QConv" in kernels
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        difference = (lowered(x) - reference(x)).abs().max()
    last = [n for n in reference.graph.nodes if "dequantize" in str(n.target)][-1]
    assert difference <= float(last.args[1]) * 1.001


def test_residual_block_sums_the_add_inside_the_second_conv() -> None:
    # adds are float by default, but the mapping's ConvAddReLU2d entry quantizes the ones
    # a conv absorbs: oneDNN adds the residual in the conv's epilogue
    torch.manual_seed(0)
    x = torch.randn(1, 8, 6, 6)
    lowered = quantize(Block(8), [x])
    report = {e.node: e for e in fxquant.explain(lowered).entries()}
    assert report["conv1"].status == "lowered"
    assert report["conv2"].status == "lowered"
    assert "add" not in report  # fused into conv2
    assert lowered.conv2.accumulate is not None


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc(x) + x)


def test_transformer_residual_add_stays_float() -> None:
    # a BERT's residual adds cost ~12 dB in int8: only a conv's add is quantized
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    lowered = quantize(Residual(), [x])
    report = {e.node: e for e in fxquant.explain(lowered).entries()}
    assert report["fc"].status == "lowered"
    add = report["add"]
    assert (add.status, add.reason.code if add.reason else None) == ("float", "qconfig_none")


def _to_fxquant(op: Any) -> Any:
    """torch.ao's classes as fxquant's (or this plugin's) class of the same name."""
    return as_fxquant_class(op)


def test_every_pattern_of_torch_x86_config_is_supported() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("torch.ao.quantization")
        importlib.import_module("torch.ao.quantization.backend_config.utils")
        x86 = importlib.import_module("torch.ao.quantization.backend_config.x86")
        theirs = x86.get_x86_backend_config().configs
    keys = {
        validate_complex(_to_fxquant(c._pattern_complex_format))
        if c._pattern_complex_format is not None
        else simple_to_complex(_to_fxquant(c.pattern))
        for c in theirs
    }
    ours = {config.normalized_pattern for config in pattern_configs()}
    assert not [key for key in keys if key not in ours]
    assert len(ours) >= len(keys)


def test_default_mapping_keeps_residual_adds_and_layer_norm_float() -> None:
    mapping = fxquant.get_default_qconfig_mapping(BACKEND)
    assert mapping.qconfig_for("", operator.add) is None
    assert mapping.qconfig_for("", nn.LayerNorm) is None
    linear = mapping.qconfig_for("", nn.Linear)
    assert linear is not None
    assert linear.weight().qscheme == torch.per_channel_symmetric
    assert fxquant.get_default_qconfig_mapping(BACKEND, is_qat=True).global_qconfig is not None


class BnBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def test_qat_of_a_residual_block_with_batch_norm_trains_and_lowers() -> None:
    # the PTQ mapping fuses conv + bn + add; QAT cannot (the BN still trains): its add
    # stays float and conv + bn train as one QAT module
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), BnBlock()).train()
    x = torch.randn(4, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping(BACKEND, is_qat=True)
    config = fxquant.get_backend_config(BACKEND)
    prepared = fxquant.prepare_qat_fx(model, mapping, (x,), backend_config=config)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=0.01)
    for _ in range(3):
        loss = prepared(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    prepared.eval()
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    lowered = fxquant.convert_fx(prepared)
    with torch.no_grad():
        difference = (lowered(x) - reference(x)).abs().max().item()
    assert "QConv" in {type(m).__name__ for m in lowered.modules()}
    last = [n for n in reference.graph.nodes if "dequantize" in str(n.target)][-1]
    assert difference <= float(last.args[1]) * 1.001


def test_assembling_x86_builds_its_pattern_list_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pattern hook and the lowering hook answer from one build of the x86 patterns."""
    builds: list[None] = []
    build_conv = patterns.conv_configs

    def counted(*args: Any, **kwargs: Any) -> Any:
        builds.append(None)
        return build_conv(*args, **kwargs)

    monkeypatch.setattr(patterns, "conv_configs", counted)
    patterns._build.cache_clear()
    try:
        assembled = Registry().assembled(BACKEND)
    finally:
        patterns._build.cache_clear()  # rebuilt without the counter
    assert len(builds) == 1
    assert len(assembled.config.configs) == len(pattern_configs())
    assert len(assembled.lowering_rules) > 100
