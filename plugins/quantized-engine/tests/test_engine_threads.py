"""Kernels of two engines in threads at once: each runs on its own engine, and the
engine the user set is never lost (#18 item 7)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from fxquant_quantized_engine import EngineScope
from fxquant_quantized_engine.engine import _engine_id, acquire_engine, release_engine

ENGINES = ("fbgemm", "qnnpack")


def _model(engine: str) -> tuple[Any, torch.Tensor]:
    import fxquant

    class AddRelu(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.a(x) + self.b(x))  # add: its kernel reads the engine

    torch.manual_seed(0)
    x = torch.randn(4, 8)
    prepared = fxquant.prepare_fx(
        AddRelu().eval(),
        fxquant.get_default_qconfig_mapping(engine),
        (x,),
        backend_config=fxquant.get_backend_config(engine),
    )
    prepared(x)
    return fxquant.convert_fx(prepared), x


def test_two_engines_in_threads_give_single_thread_results_and_keep_the_users_engine() -> None:
    models = {engine: _model(engine) for engine in ENGINES}
    with torch.no_grad():
        expected = {e: m(x) for e, (m, x) in models.items()}
    before = torch.backends.quantized.engine
    start = threading.Barrier(len(ENGINES) * 2)
    wrong: list[str] = []

    def run(engine: str) -> None:
        model, x = models[engine]
        start.wait()
        with torch.no_grad():
            for _ in range(150):
                if not torch.equal(model(x), expected[engine]):
                    wrong.append(engine)

    threads = [threading.Thread(target=run, args=(e,)) for e in ENGINES * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert torch.backends.quantized.engine == before


@pytest.mark.parametrize("outer", ENGINES)
def test_nested_scopes_of_two_engines_in_one_thread_do_not_wait_for_themselves(
    outer: str,
) -> None:
    inner = "qnnpack" if outer == "fbgemm" else "fbgemm"
    before = torch.backends.quantized.engine
    with EngineScope(outer):
        with EngineScope(inner):
            assert torch.backends.quantized.engine == inner
        assert torch.backends.quantized.engine == outer
    assert torch.backends.quantized.engine == before


def test_an_engine_the_user_sets_while_a_kernel_runs_is_kept() -> None:
    before = torch.backends.quantized.engine
    user = "qnnpack" if before != "qnnpack" else "fbgemm"
    kernel = "fbgemm" if user == "qnnpack" else "qnnpack"
    try:
        acquire_engine(_engine_id(kernel))
        torch.backends.quantized.engine = user  # another thread of the user's, meanwhile
        release_engine()
        assert torch.backends.quantized.engine == user
    finally:
        torch.backends.quantized.engine = before
