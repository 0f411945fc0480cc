"""The flow from several threads at once gives what it gives serially (a service quantizing
uploaded models).

torch.fx patches ``nn.Module.__call__`` and ``__getattr__`` for the whole process while it
traces: a thread that calibrated or converted while another traced ran its modules through
the tracer and failed with ``NameError: module is not installed as a submodule`` (38 of 40
jobs on a TransformerEncoder, 4 threads). Each job here builds its model, runs it eagerly,
prepares, calibrates, converts both ways and runs the results, as a service does.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fxquant
import pytest
import torch
from torch import fx, nn

from tests.backends.conftest import installed_first_party

pytestmark = pytest.mark.skipif(
    "x86" not in installed_first_party(), reason="backend 'x86' is not installed"
)

Job = tuple[torch.Tensor, torch.Tensor]


def _cnn() -> tuple[nn.Module, tuple[Any, ...]]:
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2, inplace=True), nn.Linear(8, 4),
    )  # fmt: skip
    return model, (torch.randn(2, 3, 8, 8),)


def _encoder() -> tuple[nn.Module, tuple[Any, ...]]:
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (torch.randn(2, 5, 16),)


class _Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _lstm() -> tuple[nn.Module, tuple[Any, ...]]:
    return _Recurrent(), (torch.randn(2, 6, 8),)


def _bert() -> tuple[nn.Module, tuple[Any, ...]]:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("fxquant_transformers")
    config = transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32,
    )  # fmt: skip
    return transformers.BertModel(config), (torch.randint(0, 128, (2, 12)),)


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[Any, ...]]]] = {
    "cnn": _cnn,
    "encoder": _encoder,
    "lstm": _lstm,
    "bert": _bert,
}


def _output(out: Any) -> torch.Tensor:
    if isinstance(out, dict):  # a transformers model's output (or its traced dict)
        return next(iter(out.values()))
    return out if isinstance(out, torch.Tensor) else out[0]


def _upload(name: str, seed: int) -> tuple[nn.Module, tuple[Any, ...]]:
    # built in the main thread: torch's random generator is one for the process
    torch.manual_seed(seed)
    model, inputs = MODELS[name]()
    return model.eval(), inputs


def _job(model: nn.Module, inputs: tuple[Any, ...]) -> Job:
    """One upload: run it eagerly, prepare, calibrate, convert both ways, run both."""
    model(*inputs)
    backend = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepared = fxquant.prepare_fx(model, mapping, inputs, backend_config=backend)
    prepared(*inputs)
    reference = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
    lowered = fxquant.convert_fx(prepared)
    assert isinstance(lowered, fx.GraphModule)
    with torch.no_grad():
        return _output(reference(*inputs)), _output(lowered(*inputs))


def _run(uploads: list[tuple[nn.Module, tuple[Any, ...]]], threads: int) -> list[Job]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda upload: _job(*upload), uploads))


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Any:
    # results bit for bit: one intra-op thread, whatever the test process set
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("names", [["cnn", "encoder", "lstm"], ["bert", "encoder"]])
def test_threads_quantize_as_the_serial_run_does(names: list[str]) -> None:
    jobs = [(name, seed) for seed in range(3) for name in names]
    uploads = [_upload(*job) for job in jobs]
    serial = [_job(*upload) for upload in uploads]
    for _ in range(2):  # a race shows in some runs only
        threaded = _run(uploads, threads=4)
        for (name, seed), want, got in zip(jobs, serial, threaded, strict=True):
            for expected, actual in zip(want, got, strict=True):
                assert torch.equal(expected, actual), (name, seed)


def test_a_thread_calling_a_model_while_another_traces_runs_it_eagerly() -> None:
    # the tracing thread holds the flow's lock; the other thread's calls never wait for it
    from fxquant.flow.trace import TRACING_LOCK, QuantizationTracer

    model, (x,) = _encoder()
    model.eval()
    expected = model(x)
    got: list[torch.Tensor] = []

    class Slow(nn.Module):
        def forward(self, y: torch.Tensor) -> torch.Tensor:
            other = threading.Thread(target=lambda: got.append(model(x)))
            other.start()
            other.join()
            return y + 1

    with TRACING_LOCK:
        QuantizationTracer().trace(Slow())
    assert len(got) == 1
    torch.testing.assert_close(got[0], expected, rtol=0, atol=0)


def test_a_transformers_model_running_while_its_class_is_traced_keeps_its_outputs() -> None:
    # ViT's forward is wrapped by transformers (output capture); the trace needs the unwrapped
    # one, which a thread running another ViT at that moment must not get
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("fxquant_transformers")
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8,
    )  # fmt: skip
    torch.manual_seed(0)
    traced, other = transformers.ViTModel(config).eval(), transformers.ViTModel(config).eval()
    x = torch.randn(2, 3, 32, 32)
    seen: list[Any] = []

    def run_the_other(module: nn.Module, args: Any) -> None:
        if not seen:  # while the flow traces `traced`: another thread calls `other`
            worker = threading.Thread(
                target=lambda: seen.append(other(x, output_hidden_states=True))
            )
            worker.start()
            worker.join()

    traced.encoder.register_forward_pre_hook(run_the_other)
    mapping = fxquant.get_default_qconfig_mapping("x86")
    config_x86 = fxquant.get_backend_config("x86")
    fxquant.prepare_fx(traced, mapping, (x,), backend_config=config_x86)
    assert len(seen) == 1
    assert seen[0].hidden_states is not None
    assert len(seen[0].hidden_states) == 2
