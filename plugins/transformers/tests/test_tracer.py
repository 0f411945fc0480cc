"""fxquant-transformers: ``import fxquant`` registers its tracer, and a transformers model is
captured with it; without it, the error names the distribution (#21). A tiny BertModel from a
config, random weights: nothing is downloaded."""

from __future__ import annotations

import importlib
import subprocess
import sys

import fxquant
import pytest
import torch
from fxquant import moved
from fxquant.errors import UntraceableModelError
from fxquant.flow import trace
from torch import nn

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.utils.fx")


def bert() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    return transformers.BertModel(config).eval()


def prepare(model: nn.Module, ids: torch.Tensor) -> nn.Module:
    mapping = fxquant.get_default_qconfig_mapping("reference")
    config = fxquant.get_backend_config("reference")
    return fxquant.prepare_fx(model, mapping, (ids,), backend_config=config)


def test_import_fxquant_registers_the_tracer_in_a_fresh_process() -> None:
    code = (
        "import sys, fxquant; from fxquant.flow.trace import MODEL_TRACERS; "
        "print('fxquant_transformers' in sys.modules, len(MODEL_TRACERS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "True 1"), out.stderr


def test_the_old_path_gives_this_package() -> None:
    import fxquant_transformers

    assert importlib.import_module("fxquant_transformers") is fxquant_transformers


def test_a_bert_model_is_captured_and_its_prepared_model_computes_as_the_float_one() -> None:
    model = bert()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    prepared = prepare(model, ids)
    with torch.no_grad():
        expected = model(ids).last_hidden_state
        got = prepared(ids)["last_hidden_state"]
    torch.testing.assert_close(got, expected)  # observers only watch
    assert any(n.op == "call_module" for n in prepared.graph.nodes)


def test_without_the_part_a_transformers_model_fails_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace, "MODEL_TRACERS", [])
    monkeypatch.delitem(sys.modules, "fxquant_transformers")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(UntraceableModelError, match="pip install fxquant-transformers"):
        prepare(bert(), ids)
    assert moved.tracer_hint(nn.Linear) == ""


def test_gpt2_conv1d_layers_trace_under_qat_and_convert_deterministically() -> None:
    # QAT traces in training mode, where each traced module's self.training is the flow's
    # mode flag: the Linear that replaces a GPT-2 Conv1D takes the module's mode from it
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, n_positions=16, vocab_size=50)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).train()
    ids = torch.randint(0, 50, (2, 8))
    prepared = fxquant.prepare_qat_fx(
        model,
        fxquant.get_default_qconfig_mapping("reference", is_qat=True),
        (ids,),
        backend_config=fxquant.get_backend_config("reference"),
    )
    prepared(ids)
    converted = fxquant.convert_fx(prepared.eval())
    first, second = converted(ids), converted(ids)
    assert torch.equal(first["last_hidden_state"], second["last_hidden_state"])
    assert not any(m.training for m in converted.modules())


BROKEN_DEPENDENCY = """
import importlib.abc, sys

class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "transformers.modeling_utils":
            raise ImportError("a broken optional dependency of transformers")

sys.meta_path.insert(0, Broken())
import fxquant, torch, transformers

model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
mapping = fxquant.get_default_qconfig_mapping("reference")
config = fxquant.get_backend_config("reference")
fxquant.prepare_fx(model, mapping, (torch.randn(2, 4),), backend_config=config)
print("traced")
"""


def test_a_plain_model_traces_while_transformers_cannot_import_its_models() -> None:
    # transformers' lazy attributes import their modules on first read; a dependency of theirs
    # that fails to import (here: torchvision built for another torch) is not the user's model
    out = subprocess.run(
        [sys.executable, "-c", BROKEN_DEPENDENCY], capture_output=True, text=True, check=False
    )
    assert (out.returncode, out.stdout.strip()) == (0, "traced"), out.stderr[-2000:]
