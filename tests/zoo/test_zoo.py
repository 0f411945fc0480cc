"""The zoo's fast subset (issue 20): one case per failure mode the zoo found and fixed.

The whole zoo (26 models x 6 backends, with torch.ao next to each CPU backend) takes about
an hour here: ``nox -s zoo`` runs it (bench/zoo.py) and writes the table of
docs/guide/zoo.md. These cases stay in ``nox -s tests``:

- ``chunk``'s tuple gets no observer, each piece does (ShuffleNetV2's channel split made
  every backend with a ``chunk`` pattern fail: ``'tuple' object has no attribute 'numel'``);
- a transformers model whose ``forward`` takes ``**kwargs`` (GPT-2, T5) is traced from
  ``input_ids`` alone, GPT-2's vmap-built causal mask computed by broadcasting and its
  ``Conv1D`` layers int8 as ``nn.Linear`` (tests/backends/test_gpt2.py has the details);
- the nn.Transformer family and an LSTM tagger go through x86;
- transformers' ViTModel, whose ``forward`` is wrapped by ``check_model_inputs``
  (``(*args, **kwargs)``), is traced through to the function it wraps;
- a CNN on x86, and the ResNet on fbgemm, at least torch.ao's SQNR (0.5 dB) on the same
  recipe, both scored on the same 8 held-out batches (one pooled SQNR), none of them a
  calibration batch.
"""

from __future__ import annotations

from operator import getitem

import fxquant
import pytest
import torch

from tests.backends.conftest import installed_first_party
from tests.zoo import torchvision_models
from tests.zoo.runner import CALIBRATION, EXAMPLE, HELD_OUT, ZOO, pooled_sqnr, run

TOLERANCE_DB = 0.5

pytestmark = pytest.mark.skipif(
    "x86" not in installed_first_party(), reason="backend 'x86' is not installed"
)


def _observers_of(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[torch.fx.Node]:
    return [
        u for u in node.users if u.op == "call_module" and "activation_post_process" in u.target
    ]


def test_chunk_pieces_are_observed_not_the_tuple() -> None:
    backend = "executorch"  # its config shares chunk's observer with its input
    if backend not in fxquant.list_backends():
        pytest.skip(f"backend {backend!r} is not installed")
    model = ZOO["shufflenet_v2"]
    prepared = fxquant.prepare_fx(
        model.build(),
        fxquant.get_default_qconfig_mapping(backend),
        model.inputs(0),
        backend_config=fxquant.get_backend_config(backend),
    )
    chunks = [n for n in prepared.graph.nodes if n.target == "chunk"]
    assert chunks
    for chunk in chunks:
        assert not _observers_of(prepared, chunk)
        assert all(u.target is getitem for u in chunk.users)
    prepared(*model.inputs(1))  # calibrates: no observer sees a tuple
    converted = fxquant.convert_fx(prepared)
    x = model.inputs(2)
    assert torch.allclose(converted(*x), model.build()(*x), atol=0.5)


def test_scoring_is_on_several_held_out_batches_pooled() -> None:
    assert len(HELD_OUT) == 8
    assert not set(HELD_OUT) & {EXAMPLE, *CALIBRATION}
    model = ZOO["resnet"]
    assert not any(
        torch.equal(model.inputs(a)[0], model.inputs(b)[0]) for a in HELD_OUT for b in CALIBRATION
    )
    # one bad batch among good ones: the pooled figure follows the noise energy (2.1x here)
    expected = [torch.ones(100)] * 8
    got = [torch.full((100,), 1.01)] * 7 + [torch.full((100,), 1.0 + 10**-1.5)]
    pooled, each = pooled_sqnr(expected, got)
    assert [round(v) for v in each] == [40] * 7 + [30]
    assert abs(pooled - 36.73) < 0.01  # a mean of the dB figures would say 38.75


def test_cnn_on_x86_is_at_least_torch_ao() -> None:
    result = run("squeezenet", "x86")
    assert result.ok, result.reason
    assert result.ao_sqnr is not None, result.ao_reason
    assert result.sqnr is not None
    assert len(result.sqnrs) == len(result.ao_sqnrs) == len(HELD_OUT)  # the same batches
    assert result.sqnr >= result.ao_sqnr - TOLERANCE_DB


def test_resnet_on_fbgemm_is_at_least_torch_ao_and_runs_its_kernels() -> None:
    # fbgemm's default without VNNI: 8-bit activations, 7-bit weights (exact on FBGEMM's
    # int16 pair sums); 7 bits on both sides gave 25.9 dB against torch.ao's 31.2
    if "fbgemm" not in fxquant.list_backends():
        pytest.skip("backend 'fbgemm' is not installed")
    result = run("resnet", "fbgemm")  # torch.ao's SQNR too (skips where torch.ao is gone)
    assert result.ok, result.reason
    assert result.ao_sqnr is not None, result.ao_reason
    assert result.sqnr is not None
    assert result.sqnr >= result.ao_sqnr - TOLERANCE_DB
    assert "reference" not in result.statuses  # every conv on FBGEMM's kernels, none declined


@pytest.mark.parametrize("name", ["nn_transformer_encoder", "lstm_tagger"])
def test_torch_sequence_modules_on_x86(name: str) -> None:
    result = run(name, "x86", oracle=False)
    assert result.ok, result.reason
    assert result.sqnr is not None
    assert result.sqnr >= 20


def test_gpt2_with_its_causal_mask_goes_through_x86() -> None:
    pytest.importorskip("transformers")
    result = run("gpt2", "x86", oracle=False)
    assert result.ok, result.reason
    assert result.statuses.get("lowered", 0) >= 8  # its Conv1D layers, as Linear
    assert result.sqnr is not None
    assert result.sqnr >= 20


def test_transformers_vit_is_traced_through_its_decorated_forward() -> None:
    pytest.importorskip("transformers")
    result = run("hf_vit", "x86", oracle=False)  # check_model_inputs' (*args, **kwargs) wrapper
    assert result.ok, result.reason
    assert result.sqnr is not None
    assert result.sqnr >= 20


def test_torchvision_imports_on_the_cpu_torch_and_its_models_run() -> None:
    tv = torchvision_models.require()  # its nms/qnms schemas defined first where missing
    assert tv.__version__.startswith("0.")
    builders = {**torchvision_models.BUILDERS, **torchvision_models.SEGMENTATION}
    x = torch.randn(1, 3, 32, 32)
    for name in ("tv_resnet18", "tv_vit", "tv_swin", "tv_lraspp_mobilenet_v3"):
        output = builders[name]()(x)
        output = output["out"] if isinstance(output, dict) else output
        assert output.abs().sum() > 0, name  # ViT's zero-initialized head re-drawn


@pytest.mark.parametrize("name", ["tv_mobilenet_v3_large", "tv_deeplabv3_mobilenet_v3"])
def test_torchvision_mobilenet_v3_on_x86_is_at_least_torch_ao(name: str) -> None:
    torchvision_models.require()
    result = run(name, "x86")
    assert result.ok, result.reason
    assert result.ao_sqnr is not None, result.ao_reason
    assert result.sqnr is not None
    assert result.sqnr >= result.ao_sqnr - TOLERANCE_DB


@pytest.mark.parametrize("name", ["hf_swin", "hf_convnext", "wav2vec2"])
def test_transformers_vision_and_audio_models_go_through_x86(name: str) -> None:
    pytest.importorskip("transformers")
    result = run(name, "x86", oracle=False)
    assert result.ok, result.reason
    assert result.sqnr is not None
    assert result.sqnr >= 20
