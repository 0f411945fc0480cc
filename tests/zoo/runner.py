"""The zoo registry and its runner: each model on each backend, prepared, converted, deployed,
scored by SQNR against float next to torch.ao's on the same recipe (issue 20).

The recipe, per model and backend: ``fxquant.get_default_qconfig_mapping(backend)`` and
``get_backend_config(backend)``, ``prepare_fx`` on the model's first batch, calibration on
3 batches, ``convert_fx``, then the backend's deployment where it has one (executorch: the
``.pte`` in ExecuTorch's runtime; tensorrt: the Q/DQ ONNX model in onnxruntime), scored on
8 held-out batches (:data:`HELD_OUT`, drawn apart from the calibration batches; the same
batches for torch.ao) by :func:`pooled_sqnr`: one SQNR over their outputs concatenated, the
converted model reused for every batch. torch.ao runs the same recipe with its own defaults
(its mapping and backend config for the same name, its quantized engine set) on the CPU
backends; transformers models
reach it as transformers' graph with constant shapes (:func:`tests.zoo.hf.concrete_graph`),
since it cannot trace them.

A failure is recorded, never raised: its type, its message, and whether it is one of
fxquant's errors (``clear``), which the targets ask for: the node and the reason, not an
unrelated exception from deep in a toolchain.

Example:
    >>> sorted(ZOO)[:3], len(ZOO)
    (['albert', 'bert', 'convnext'], 46)
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from tests.flow.zoo import seeded
from tests.zoo import hf, sequence, torchvision_models, vision

__all__ = [
    "BACKENDS",
    "CPU_BACKENDS",
    "HELD_OUT",
    "SCORING",
    "ZOO",
    "Result",
    "ZooModel",
    "pooled_sqnr",
    "run",
    "score",
    "sqnr",
]

BACKENDS = ("x86", "onednn", "fbgemm", "qnnpack", "executorch", "tensorrt")
CPU_BACKENDS = ("x86", "onednn", "fbgemm", "qnnpack")
DEPLOYED = ("executorch", "tensorrt")  # the others run the ``convert_fx`` model in PyTorch
EXAMPLE = 0  # the batch ``prepare_fx`` traces with (and executorch exports with)
CALIBRATION = (1, 2, 3)
HELD_OUT = tuple(range(99, 107))
"""The evaluation batches' seeds: 8, none of them a calibration or the example batch."""
SCORING = "pooled SQNR over 8 held-out batches (seeds 99-106)"
"""How :attr:`Result.sqnr` is computed; the zoo's table names it (rows without it: one batch)."""
assert not set(HELD_OUT) & {EXAMPLE, *CALIBRATION}, "evaluation data must stay held out"


@dataclass(frozen=True)
class ZooModel:
    """A zoo architecture: how to build it (seeded, eval) and draw its inputs.

    ``names`` are the forward parameters the inputs bind to (transformers' tracer needs them).
    """

    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]
    names: tuple[str, ...] = ("x",)
    what: str = ""


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def images(seed: int) -> tuple[torch.Tensor, ...]:
    """2 x 3 x 32 x 32 images."""
    return (torch.randn(2, 3, 32, 32, generator=_generator(seed)),)


def sequences(seed: int) -> tuple[torch.Tensor, ...]:
    """2 x 16 x 64 float sequences."""
    return (torch.randn(2, 16, 64, generator=_generator(seed)),)


def tokens(vocab: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """2 x 16 token ids below ``vocab``."""

    def draw(seed: int) -> tuple[torch.Tensor, ...]:
        return (torch.randint(0, vocab, (2, 16), generator=_generator(seed)),)

    return draw


def _vision(name: str, cls: type[nn.Module], what: str) -> ZooModel:
    return ZooModel(name, "vision", lambda: seeded(cls), images, what=what)


def audio(seed: int) -> tuple[torch.Tensor, ...]:
    """2 x 400 audio samples."""
    return (torch.randn(2, 400, generator=_generator(seed)),)


def _hf(name: str, what: str) -> ZooModel:
    build = hf.BUILDERS[name]
    if name in ("hf_vit", "hf_swin", "hf_convnext"):
        return ZooModel(
            name, "transformers", lambda: seeded(build), images, ("pixel_values",), what
        )
    if name == "wav2vec2":
        return ZooModel(name, "transformers", lambda: seeded(build), audio, ("input_values",), what)
    return ZooModel(
        name, "transformers", lambda: seeded(build), tokens(hf.VOCAB), ("input_ids",), what
    )


def _torchvision(name: str, what: str) -> ZooModel:
    build = {**torchvision_models.BUILDERS, **torchvision_models.SEGMENTATION}[name]
    return ZooModel(name, "torchvision", lambda: seeded(build), images, what=what)


_TORCHVISION = {
    "tv_resnet18": "resnet18",
    "tv_resnet50": "resnet50, bottlenecks",
    "tv_mobilenet_v2": "mobilenet_v2, width 0.5",
    "tv_mobilenet_v3_small": "mobilenet_v3_small",
    "tv_mobilenet_v3_large": "mobilenet_v3_large, width 0.5",
    "tv_efficientnet_b0": "efficientnet_b0, Dropout(inplace=True) head",
    "tv_regnet_y_400mf": "regnet_y_400mf",
    "tv_shufflenet_v2": "shufflenet_v2_x0_5",
    "tv_squeezenet": "squeezenet1_1",
    "tv_densenet121": "densenet121",
    "tv_googlenet": "googlenet, no aux heads",
    "tv_convnext": "ConvNeXt class, 2 stages of 1 block",
    "tv_vit": "VisionTransformer class, 2 layers, patch 8",
    "tv_swin": "SwinTransformer class (swin_t's blocks), 2 stages",
    "tv_deeplabv3_mobilenet_v3": "deeplabv3_mobilenet_v3_large, 5 classes",
    "tv_lraspp_mobilenet_v3": "lraspp_mobilenet_v3_large, 5 classes",
    "tv_fcn_resnet50": "fcn_resnet50, 5 classes",
}
"""torchvision's models in the zoo (tests/zoo/torchvision_models.py builds them)."""


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        _vision("resnet", vision.ResNet, "basic blocks, residual add"),
        _vision("resnext", vision.ResNeXt, "grouped 3x3 bottlenecks"),
        _vision("mobilenet_v2", vision.MobileNetV2, "ReLU6 inverted residuals"),
        _vision("mobilenet_v3", vision.MobileNetV3, "hardswish, squeeze-excite"),
        _vision("efficientnet", vision.EfficientNet, "SiLU, SE, stochastic depth"),
        _vision("regnet", vision.RegNet, "group width 8, SE"),
        _vision("densenet", vision.DenseNet, "dense cat"),
        _vision("googlenet", vision.GoogLeNet, "inception branches"),
        _vision("shufflenet_v2", vision.ShuffleNetV2, "chunk, channel shuffle"),
        _vision("squeezenet", vision.SqueezeNet, "fire modules"),
        _vision("convnext", vision.ConvNeXt, "LayerNorm channels-last, dw 7x7, GELU"),
        _vision("vit", vision.ViT, "patches, unbind qkv attention"),
        _vision("swin", vision.SwinLike, "window attention, roll"),
        ZooModel(
            "nn_transformer_encoder",
            "torch.nn",
            lambda: seeded(sequence.TransformerEncoder),
            sequences,
            what="nn.TransformerEncoder, batch_first",
        ),
        ZooModel(
            "nn_transformer_decoder",
            "torch.nn",
            lambda: seeded(sequence.TransformerDecoder),
            sequences,
            what="nn.TransformerDecoder, causal, norm_first",
        ),
        ZooModel(
            "nn_transformer",
            "torch.nn",
            lambda: seeded(sequence.Transformer),
            sequences,
            what="nn.Transformer, sequence-first",
        ),
        ZooModel(
            "lstm_tagger",
            "torch.nn",
            lambda: seeded(sequence.LSTMTagger),
            tokens(100),
            what="embedding, bi-LSTM, linear",
        ),
        _hf("bert", "BertModel"),
        _hf("distilbert", "DistilBertModel"),
        _hf("roberta", "RobertaModel"),
        _hf("albert", "AlbertModel"),
        _hf("electra", "ElectraModel"),
        _hf("gpt2", "GPT2Model, causal mask"),
        _hf("t5_encoder", "T5EncoderModel"),
        _hf("hf_vit", "ViTModel"),
        _hf("mobilebert", "MobileBertModel"),
        _hf("hf_swin", "SwinModel, shifted windows"),
        _hf("hf_convnext", "ConvNextModel"),
        _hf("wav2vec2", "Wav2Vec2Model, conv feature encoder, audio in"),
        *(_torchvision(name, what) for name, what in _TORCHVISION.items()),
    )
}
"""Every zoo model, by name."""


@dataclass
class Result:
    """One model on one backend: fxquant's outcome and torch.ao's on the same recipe.

    ``sqnr``/``ao_sqnr`` are the pooled SQNRs over the held-out batches (:data:`SCORING`);
    ``sqnrs``/``ao_sqnrs`` each batch's own, for reference.
    """

    model: str
    backend: str
    ok: bool = False
    sqnr: float | None = None
    reason: str = ""
    error: str = ""
    clear: bool = True
    statuses: dict[str, int] = field(default_factory=dict)
    ao_sqnr: float | None = None
    ao_reason: str = ""
    seconds: float = 0.0
    scoring: str = SCORING
    sqnrs: list[float] = field(default_factory=list)
    ao_sqnrs: list[float] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The JSON form."""
        return asdict(self)


def sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when equal).

    Example:
        >>> round(sqnr(torch.ones(4), torch.full((4,), 1.1)), 1)
        20.0
    """
    expected, got = expected.detach().double(), got.detach().double()
    noise = (expected - got).pow(2).sum()
    if noise == 0:
        return math.inf
    return float(10 * torch.log10(expected.pow(2).sum() / noise))


def pooled_sqnr(expected: list[torch.Tensor], got: list[torch.Tensor]) -> tuple[float, list[float]]:
    """One SQNR over every batch's output concatenated, and each batch's own.

    The pooled figure is the ratio of the total signal energy to the total noise energy: the
    SQNR of one big batch, so a batch with a large error counts by its error's size, where a
    mean of per-batch dB figures would average a logarithm and let good batches hide it.

    Example:
        >>> pooled, each = pooled_sqnr([torch.ones(4)] * 2, [torch.full((4,), 1.1)] * 2)
        >>> round(pooled, 1), [round(v, 1) for v in each]
        (20.0, [20.0, 20.0])
    """
    flat = torch.cat([e.detach().double().flatten() for e in expected])
    pooled = sqnr(flat, torch.cat([g.detach().double().flatten() for g in got]))
    return pooled, [sqnr(e, g) for e, g in zip(expected, got, strict=True)]


def score(
    model: ZooModel, float_model: nn.Module, quantized: Callable[..., Any]
) -> tuple[float, list[float]]:
    """``quantized`` against ``float_model`` on every held-out batch: :func:`pooled_sqnr`'s."""
    expected, got = [], []
    with torch.no_grad():
        for seed in HELD_OUT:
            x = model.inputs(seed)
            expected.append(main_output(float_model(*x)))
            got.append(main_output(quantized(*x)))
    return pooled_sqnr(expected, got)


def main_output(output: Any) -> torch.Tensor:
    """The tensor a model's output is scored on: itself, ``last_hidden_state`` or the first."""
    if isinstance(output, torch.Tensor):
        return output.float()
    if isinstance(output, Mapping):
        if "last_hidden_state" in output:
            return main_output(output["last_hidden_state"])
        return main_output(next(iter(output.values())))
    if isinstance(output, (tuple, list)):
        return main_output(output[0])
    msg = f"output of type {type(output).__name__!r} holds no tensor to score"
    raise TypeError(msg)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Toolchain warnings (deprecations, tracer notes) silenced inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _describe(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:400]}"


def _fxquant(model: ZooModel, float_model: nn.Module, backend: str, result: Result) -> None:
    import fxquant
    from fxquant.registry import get_deployment

    example = model.inputs(EXAMPLE)
    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    prepared = fxquant.prepare_fx(
        copy.deepcopy(float_model), mapping, example, backend_config=config
    )
    with torch.no_grad():
        for seed in CALIBRATION:
            prepared(*model.inputs(seed))
    converted = fxquant.convert_fx(prepared, backend_config=config)
    deployment = get_deployment(backend) if backend in DEPLOYED else None
    deployed = deployment.deploy(converted, example) if deployment is not None else converted
    report = getattr(deployed, "report", None) or fxquant.explain(converted, show=False)
    for entry in report.entries():
        result.statuses[str(entry.status)] = result.statuses.get(str(entry.status), 0) + 1
    result.sqnr, result.sqnrs = score(model, float_model, deployed)
    result.ok = True


def _ao_backend_config(ao: Any, backend: str) -> Any:
    import importlib

    module = importlib.import_module(f"torch.ao.quantization.backend_config.{backend}")
    return getattr(module, f"get_{backend}_backend_config")()


def _torch_ao(model: ZooModel, float_model: nn.Module, backend: str) -> tuple[float, list[float]]:
    from tests import oracle

    ao = oracle.load()
    from torch.ao.quantization import quantize_fx

    example = model.inputs(EXAMPLE)
    subject: nn.Module = copy.deepcopy(float_model)
    if model.family == "transformers":
        subject = hf.concrete_graph(subject, example, list(model.names))
    try:
        with oracle.quiet():
            prepared = quantize_fx.prepare_fx(
                subject,
                ao.get_default_qconfig_mapping(backend),
                example,
                backend_config=_ao_backend_config(ao, backend),
            )
            with torch.no_grad():
                for seed in CALIBRATION:
                    prepared(*model.inputs(seed))
            converted = quantize_fx.convert_fx(prepared)
            previous = torch.backends.quantized.engine
            torch.backends.quantized.engine = backend
            try:
                return score(model, float_model, converted)
            finally:
                torch.backends.quantized.engine = previous
    finally:
        oracle.release()


def run(name: str, backend: str, *, oracle: bool = True) -> Result:
    """``name`` on ``backend``: fxquant's SQNR (or its failure), and torch.ao's on CPU backends.

    Never raises for a model's failure: the result holds it.
    """
    from fxquant.errors import FxquantError

    model = ZOO[name]
    result = Result(name, backend)
    start = time.perf_counter()
    float_model = model.build()
    with quiet():
        try:
            _fxquant(model, float_model, backend, result)
        except Exception as error:  # recorded: the zoo reports every failure
            result.reason = _describe(error)
            result.error = type(error).__name__
            result.clear = isinstance(error, FxquantError)
        if oracle and backend in CPU_BACKENDS:
            try:
                result.ao_sqnr, result.ao_sqnrs = _torch_ao(model, float_model, backend)
            except Exception as error:  # torch.ao's own failures are part of the table
                result.ao_reason = _describe(error)
    result.seconds = time.perf_counter() - start
    return result
