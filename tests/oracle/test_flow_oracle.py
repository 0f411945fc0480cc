"""The FX flow against torch.ao's, on the model zoo (issue 4, "Numerics and coverage").

Both flows get the same BackendConfig patterns (torch.ao's native config; fxquant's
``reference`` backend restricted to the patterns the native one has, since it
adds a few such as ``torch.matmul``), the same QConfig built from each
library's own observers, and the same calibration batches. Their reference
models must agree within one quantization step of the output and quantize the
same ops (and parameters, to the same dtypes), with per-tensor and per-channel
weights; QAT (fake quantization through training steps, then convert) and
dynamic quantization are compared the same way. The transformer compared is
the zoo's ``encoder``: BERT with its view sizes passed one by one and no
additive mask. The full BERT-like model is
fxquant's alone: torch.ao crashes calibrating it (an observer on ``view``'s
``torch.Size`` argument) and lets the -10000 mask stretch the attention scores'
range (~8 dB lost on a padded batch), which fxquant must not.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.config import defaults
from fxquant.flow import convert_to_reference_fx, prepare_fx, prepare_qat_fx
from fxquant.numerics import observer as fxobs
from torch import fx, nn

from tests import oracle
from tests.flow.zoo import ZOO, BertLike, bert_inputs, seeded

CALIBRATION_BATCHES = 4
ORACLE_MODELS = sorted(name for name in ZOO if name != "bert")
# the same name in torch.ao.quantization and fxquant.config.defaults: per-tensor and per-channel
QCONFIGS = ["default_qconfig", "default_per_channel_qconfig"]
QUANTIZE = {"quantize_per_tensor", "quantize_per_channel"}
# shape queries read a tensor's metadata, not its values: which copy they read is no decision
SHAPE_QUERIES = {"size", "getattr", "dim"}


# ---- how each flow is run ---------------------------------------------------------------------


def _fxquant_qconfig_mapping(qconfig: str = "default_qconfig") -> fxquant.QConfigMapping:
    def fixed(observer: Any) -> fxquant.QConfig:
        return fxquant.QConfig(activation=observer, weight=fxobs.default_weight_observer)

    return (
        fxquant.QConfigMapping()
        .set_global(getattr(defaults, qconfig))
        .set_object_type(torch.sigmoid, fixed(fxobs.default_fixed_qparams_range_0to1_observer))
        .set_object_type(nn.Tanh, fixed(fxobs.default_fixed_qparams_range_neg1to1_observer))
    )


def _ao_qconfig_mapping(ao: Any, qconfig: str = "default_qconfig") -> Any:
    from torch.ao.quantization import observer as aobs

    def fixed(observer: Any) -> Any:
        return ao.QConfig(activation=observer, weight=ao.default_weight_observer)

    return (
        ao.QConfigMapping()
        .set_global(getattr(ao, qconfig))
        .set_object_type(torch.sigmoid, fixed(aobs.default_fixed_qparams_range_0to1_observer))
        .set_object_type(nn.Tanh, fixed(aobs.default_fixed_qparams_range_neg1to1_observer))
    )


def _pattern_key(pattern: Any) -> Any:
    """A pattern with library classes named by kind and name, so both libraries' keys compare."""
    if isinstance(pattern, tuple):
        return tuple(_pattern_key(part) for part in pattern)
    if isinstance(pattern, type):
        module = pattern.__module__
        kind = ("intrinsic." if "intrinsic" in module else "") + (
            "qat." if ".qat" in module else ""
        )
        return kind + pattern.__name__
    return pattern  # functions and method names are the same objects in both libraries


def _pattern_of(config: Any) -> Any:
    return config.pattern if config.pattern is not None else config._pattern_complex_format


@functools.cache
def _native_patterns() -> frozenset[Any]:
    oracle.load()
    from torch.ao.quantization.backend_config import get_native_backend_config

    with oracle.quiet():
        return frozenset(_pattern_key(_pattern_of(c)) for c in get_native_backend_config().configs)


def _fxquant_native_config() -> fxquant.BackendConfig:
    """fxquant's ``reference`` backend without the patterns torch.ao's native config lacks."""
    native = _native_patterns()
    reference = fxquant.get_backend_config("reference")
    kept = [c for c in reference.configs if _pattern_key(_pattern_of(c)) in native]
    return fxquant.BackendConfig("reference_native").set_backend_pattern_configs(kept)


def _calibrate(prepared: nn.Module, name: str) -> None:
    with torch.no_grad():
        for seed in range(CALIBRATION_BATCHES):
            prepared(*ZOO[name].inputs(seed))


def _output_scale(prepared: fx.GraphModule) -> float:
    """The scale of the observer that feeds the model's output (one quantization step)."""
    (output,) = (n for n in prepared.graph.nodes if n.op == "output")
    producer = output.args[0]
    observer = prepared.get_submodule(producer.target)
    scale, _ = observer.calculate_qparams()
    return float(scale.max())


@functools.cache
def _ao_reference(name: str, qconfig: str) -> tuple[fx.GraphModule, float]:
    ao = oracle.load()
    from torch.ao.quantization.backend_config import get_native_backend_config
    from torch.ao.quantization.quantize_fx import convert_to_reference_fx as ao_convert
    from torch.ao.quantization.quantize_fx import prepare_fx as ao_prepare

    entry = ZOO[name]
    with oracle.quiet():
        config = get_native_backend_config()
        prepared = ao_prepare(
            entry.build(), _ao_qconfig_mapping(ao, qconfig), entry.inputs(0), backend_config=config
        )
        _calibrate(prepared, name)
        scale = _output_scale(prepared)
        return ao_convert(prepared, backend_config=config), scale


@functools.cache
def _fxquant_reference(name: str, qconfig: str) -> fx.GraphModule:
    entry = ZOO[name]
    config = _fxquant_native_config()
    prepared = prepare_fx(
        entry.build(), _fxquant_qconfig_mapping(qconfig), entry.inputs(0), backend_config=config
    )
    _calibrate(prepared, name)
    return convert_to_reference_fx(prepared, backend_config=config)


@pytest.fixture(scope="module", autouse=True)
def _drop_cached_models() -> Iterator[None]:
    yield
    for cached in (_ao_reference, _fxquant_reference, _native_patterns):
        cached.cache_clear()
    oracle.release()


# ---- what "the same nodes are quantized" means ------------------------------------------------


def _op_name(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__
    if node.op == "call_function":
        # torch.ops.fxquant.quantize_per_tensor.default -> "quantize_per_tensor"
        return str(getattr(node.target, "__name__", node.target)).split(".")[0]
    return str(node.target)


def _is_quantize(gm: fx.GraphModule, node: fx.Node) -> bool:
    return node.op == "call_function" and _op_name(gm, node) in QUANTIZE


def _is_dequantize(gm: fx.GraphModule, node: fx.Node) -> bool:
    return node.op in {"call_function", "call_method"} and _op_name(gm, node).startswith(
        "dequantize"
    )


def _quantized_dtype(gm: fx.GraphModule, quantize: fx.Node) -> str:
    """The integer dtype a quantize step produces, in plain words: quint8 and uint8 -> "uint8"."""
    dtypes = [a for a in (*quantize.args, *quantize.kwargs.values()) if isinstance(a, torch.dtype)]
    return str(dtypes[-1]).removeprefix("torch.").removeprefix("q") if dtypes else "?"


def quantized_ops(gm: fx.GraphModule) -> Counter[str]:
    """Per op: how many of its nodes output into a quantize step (and to which dtype) and read
    from a dequantize step; per parameter read by the graph: the dtype it is quantized to.

    torch.ao writes ``torch.quantize_per_tensor`` and ``.dequantize()``; fxquant
    writes ``torch.ops.fxquant.*``: both are counted by the op they surround.
    """
    counts: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if _is_quantize(gm, node) and node.args[0].op == "get_attr":
            counts[f"{node.args[0].target} -> quantize {_quantized_dtype(gm, node)}"] += 1
        if node.op not in {"call_module", "call_function", "call_method"}:
            continue
        if _is_quantize(gm, node) or _is_dequantize(gm, node):
            continue
        name = _op_name(gm, node)
        if name in SHAPE_QUERIES:
            continue
        for dtype in sorted({_quantized_dtype(gm, u) for u in node.users if _is_quantize(gm, u)}):
            counts[f"{name} -> quantize {dtype}"] += 1
        if any(_is_dequantize(gm, arg) for arg in node.all_input_nodes):
            counts[f"dequantize -> {name}"] += 1
    return counts


# ---- the comparisons --------------------------------------------------------------------------


@pytest.mark.parametrize("qconfig", QCONFIGS)
@pytest.mark.parametrize("name", ORACLE_MODELS)
def test_reference_model_output_is_within_one_quantization_step_of_torch_ao(
    name: str, qconfig: str
) -> None:
    ao_model, scale = _ao_reference(name, qconfig)
    model = _fxquant_reference(name, qconfig)
    inputs = ZOO[name].inputs(100)
    with torch.no_grad(), oracle.quiet():
        expected = ao_model(*inputs)
    with torch.no_grad():
        actual = model(*inputs)
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=scale + 1e-6)


@pytest.mark.parametrize("qconfig", QCONFIGS)
@pytest.mark.parametrize("name", ORACLE_MODELS)
def test_reference_model_quantizes_the_same_ops_as_torch_ao(name: str, qconfig: str) -> None:
    ao_model, _ = _ao_reference(name, qconfig)
    expected = quantized_ops(ao_model)
    assert expected, "the oracle quantized nothing: the comparison would be empty"
    assert quantized_ops(_fxquant_reference(name, qconfig)) == expected


QAT_MODELS = ["functional", "mlp", "mobilenet", "resnet"]


def _qat_step(model: nn.Module, name: str, seed: int) -> torch.Tensor:
    """One training step (forward, backward, SGD) with dropout's randomness pinned by ``seed``."""
    torch.manual_seed(seed)
    out = model(*ZOO[name].inputs(seed))
    out.square().mean().backward()
    with torch.no_grad():
        for param in model.parameters():
            if param.grad is not None:
                param -= 0.01 * param.grad
                param.grad = None
    return out.detach()


@pytest.mark.parametrize("name", QAT_MODELS)
def test_qat_model_trains_and_converts_like_torch_ao(name: str) -> None:
    """Same fake quantization in training (conv-bn kept trainable) and the same reference model."""
    ao = oracle.load()
    from torch.ao.quantization.backend_config import get_native_backend_config
    from torch.ao.quantization.quantize_fx import convert_to_reference_fx as ao_convert
    from torch.ao.quantization.quantize_fx import prepare_qat_fx as ao_prepare_qat

    entry = ZOO[name]
    config = _fxquant_native_config()
    mapping = fxquant.QConfigMapping().set_global(defaults.default_qat_qconfig)
    model = prepare_qat_fx(entry.build().train(), mapping, entry.inputs(0), backend_config=config)
    with oracle.quiet():
        ao_mapping = ao.QConfigMapping().set_global(ao.default_qat_qconfig)
        ao_config = get_native_backend_config()
        ao_model = ao_prepare_qat(
            entry.build().train(), ao_mapping, entry.inputs(0), backend_config=ao_config
        )
        for seed in range(3):
            expected = _qat_step(ao_model, name, seed)
            actual = _qat_step(model, name, seed)
            scale = _output_scale(ao_model)
            torch.testing.assert_close(actual, expected, rtol=0.0, atol=scale + 1e-6)
        ao_reference = ao_convert(ao_model.eval(), backend_config=ao_config)
        inputs = entry.inputs(100)
        with torch.no_grad():
            expected = ao_reference(*inputs)
    with torch.no_grad():
        actual = convert_to_reference_fx(model.eval(), backend_config=config)(*inputs)
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=scale + 1e-6)
    oracle.release()


DYNAMIC_MODELS = ["encoder", "fixed_qparams", "functional"]
WEIGHT_OBSERVERS = ["default_weight_observer", "default_per_channel_weight_observer"]


@pytest.mark.parametrize("weight", WEIGHT_OBSERVERS)
@pytest.mark.parametrize("name", DYNAMIC_MODELS)
def test_dynamic_quantization_matches_torch_ao(name: str, weight: str) -> None:
    """Linear layers (modules and F.linear) with int8 weights and per-batch activation qparams.

    torch.ao's reference model ignores the dynamic observer's range and picks reduce_range
    from the quantized engine (fbgemm/x86: 0..127); fxquant reads the observer, so the
    fxquant qconfig states the range torch.ao will use.
    """
    ao = oracle.load()
    from torch.ao.quantization import observer as aobs
    from torch.ao.quantization.backend_config import get_native_backend_config
    from torch.ao.quantization.quantize_fx import convert_to_reference_fx as ao_convert
    from torch.ao.quantization.quantize_fx import prepare_fx as ao_prepare

    reduce_range = torch.backends.quantized.engine in {"fbgemm", "x86"}
    activation = fxobs.PlaceholderObserver.with_args(
        dtype=torch.uint8, quant_min=0, quant_max=127 if reduce_range else 255, is_dynamic=True
    )
    qconfig = fxquant.QConfig(activation=activation, weight=getattr(fxobs, weight))
    entry, config = ZOO[name], _fxquant_native_config()
    mapping = fxquant.QConfigMapping()
    ao_qconfig = ao.QConfig(
        activation=aobs.default_dynamic_quant_observer, weight=getattr(aobs, weight)
    )
    ao_mapping = ao.QConfigMapping()
    for op in (nn.Linear, F.linear):
        mapping.set_object_type(op, qconfig)
        ao_mapping.set_object_type(op, ao_qconfig)
    model = prepare_fx(entry.build(), mapping, entry.inputs(0), backend_config=config)
    model(*entry.inputs(0))
    inputs = entry.inputs(5)
    with oracle.quiet(), torch.no_grad():
        ao_config = get_native_backend_config()
        ao_model = ao_prepare(entry.build(), ao_mapping, entry.inputs(0), backend_config=ao_config)
        ao_model(*entry.inputs(0))
        ao_reference = ao_convert(ao_model, backend_config=ao_config)
        expected, expected_ops = ao_reference(*inputs), quantized_ops(ao_reference)
    reference = convert_to_reference_fx(model, backend_config=config)
    with torch.no_grad():
        torch.testing.assert_close(reference(*inputs), expected, rtol=0.0, atol=1e-6)
    ops = quantized_ops(reference)
    for op in ("Linear", "linear"):
        assert ops[f"dequantize -> {op}"] == expected_ops[f"dequantize -> {op}"], op
    oracle.release()


def test_the_oracle_counts_ops_not_quantize_steps() -> None:
    """The op census sees through both libraries' spellings of quantize and dequantize."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    q = graph.call_function(torch.quantize_per_tensor, (x, 0.1, 0, torch.quint8))
    # the same step in fxquant's spelling, which names the dtype uint8
    dq = graph.call_method("dequantize", (q,))
    relu = graph.call_function(torch.relu, (dq,))
    q2 = graph.call_function(
        torch.ops.fxquant.quantize_per_tensor.default, (relu, 0.1, 0, 0, 255, torch.uint8)
    )
    graph.output(
        graph.call_function(
            torch.ops.fxquant.dequantize_per_tensor.default, (q2, 0.1, 0, 0, 255, torch.uint8)
        )
    )
    counts = quantized_ops(fx.GraphModule(nn.Module(), graph))
    assert counts == Counter({"relu -> quantize uint8": 1, "dequantize -> relu": 1})


# ---- BERT: what torch.ao cannot do ------------------------------------------------------------


def _sqnr(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    noise = (reference - approximation).norm().item()
    return 20 * math.log10(reference.norm().item() / max(noise, 1e-12))


Draw = Callable[[int], tuple[torch.Tensor, ...]]
PADDING = 4


def _padded(seed: int) -> tuple[torch.Tensor, ...]:
    return bert_inputs(50, seed, padding=PADDING)


def _unpadded(seed: int) -> tuple[torch.Tensor, ...]:
    """The same real tokens as :func:`_padded`, without the padding positions."""
    return tuple(t[:, :-PADDING] for t in _padded(seed))


def _quantized_bert(
    draw: Draw, check: Callable[[nn.Module], None] | None = None
) -> tuple[nn.Module, nn.Module]:
    float_model = seeded(BertLike)
    prepared = prepare_fx(float_model, _fxquant_qconfig_mapping(), draw(0))
    if check is not None:
        check(prepared)
    with torch.no_grad():
        for seed in range(CALIBRATION_BATCHES):
            prepared(*draw(seed))
    return float_model, convert_to_reference_fx(prepared)


def _observers_see_only_float_tensors(prepared: nn.Module) -> None:
    seen: list[str] = []

    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        value = args[0]
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            seen.append(f"{type(value).__name__}{getattr(value, 'dtype', '')}")

    for name, module in prepared.named_modules():
        if name.startswith("activation_post_process"):
            module.register_forward_pre_hook(record)
    with torch.no_grad():
        prepared(*_padded(1))
    assert seen == [], f"observers saw non-float values: {seen}"


def test_bert_calibrates_and_its_observers_see_only_float_tensors() -> None:
    """torch.ao observes the ``torch.Size`` built for ``view`` and crashes here ("detach")."""
    float_model, quantized = _quantized_bert(_unpadded, check=_observers_see_only_float_tensors)
    inputs = _unpadded(100)
    with torch.no_grad():
        assert _sqnr(float_model(*inputs), quantized(*inputs)) > 15.0


def test_bert_is_a_model_torch_ao_crashes_on(ao: Any) -> None:
    """Keeps the test above meaningful: the zoo's BERT still has the pattern torch.ao observes."""
    from torch.ao.quantization.quantize_fx import prepare_fx as ao_prepare

    with oracle.quiet():
        prepared = ao_prepare(
            seeded(BertLike), ao.QConfigMapping().set_global(ao.default_qconfig), _unpadded(0)
        )
        with pytest.raises(AttributeError, match=r"'torch\.Size' object has no attribute 'detach'"):
            prepared(*_unpadded(0))


def test_bert_padded_batch_quantizes_as_well_as_an_unpadded_one() -> None:
    """The additive -10000 mask must not stretch an observer's range over the attention scores.

    Both models see the same real tokens, one batch padded with masked positions, and are
    scored on the real tokens only (torch.ao's flow loses ~8 dB here on this model).
    """
    float_model, unpadded = _quantized_bert(_unpadded)
    _, padded = _quantized_bert(_padded)
    inputs, padded_inputs = _unpadded(100), _padded(100)
    with torch.no_grad():
        clean = _sqnr(float_model(*inputs), unpadded(*inputs))
        real = padded(*padded_inputs)[:, :-PADDING]  # padding positions carry no meaning
        masked = _sqnr(float_model(*inputs), real)
    assert masked >= clean - 2.0, f"padded {masked:.1f} dB vs unpadded {clean:.1f} dB"
