"""Shared helpers of the executorch plugin's tests: quantize a model the way users do."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import fxquant
import pytest
import torch
from fxquant.tools import testing
from torch import fx, nn

BACKEND = "executorch"
ZOO = Path(__file__).resolve().parents[3] / "tests" / "flow" / "zoo.py"


def _quantize(
    model: nn.Module,
    inputs: Sequence[torch.Tensor],
    mapping: fxquant.QConfigMapping | None = None,
    *,
    is_qat: bool = False,
) -> fx.GraphModule:
    """``model`` prepared with the backend's config (and default mapping), calibrated, converted."""
    config = fxquant.get_backend_config(BACKEND)
    if mapping is None:
        mapping = fxquant.get_default_qconfig_mapping(BACKEND, is_qat=is_qat)
    prepare = fxquant.prepare_qat_fx if is_qat else fxquant.prepare_fx
    prepared = prepare(copy.deepcopy(model), mapping, tuple(inputs), backend_config=config)
    with torch.no_grad():
        for seed in range(3):
            generator = torch.Generator().manual_seed(seed)
            prepared(*(torch.randn(x.shape, generator=generator) for x in inputs))
        prepared(*inputs)
    return fxquant.convert_fx(prepared)


def _linear_input_step(reference: fx.GraphModule, name: str, inputs: Sequence[object]) -> float:
    """How far one step of the per-token int8 input of Linear ``name`` moves its output.

    The default mapping's Linear layers return float (dynamic int8 per token, #23):
    XNNPACK and the reference model round each row of the input alike but for ties,
    so a float output is held to what one input step moves it.
    """
    from fxquant.numerics import qdq

    seen: list[torch.Tensor] = []
    module = reference.get_submodule(name)
    handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    with torch.no_grad():
        reference(*inputs)
    handle.remove()
    scales, _ = qdq.choose_qparams_per_token_asymmetric(seen[0])
    weight = module.get_weight().detach()  # type: ignore[operator]  # a reference Linear
    return float(scales.max()) * float(weight.abs().sum(1).max())


@pytest.fixture
def linear_input_step() -> Callable[..., float]:
    """``linear_input_step(reference, name, inputs)``: one input step of a per-token Linear."""
    return _linear_input_step


@pytest.fixture
def quantize() -> Callable[..., fx.GraphModule]:
    """``quantize(model, inputs, mapping=None, *, is_qat=False)``: prepare, calibrate, convert."""
    return _quantize


@pytest.fixture(autouse=True)
def one_thread() -> None:
    """The test machine has 2 shared cores: one thread keeps timings and numerics steady."""
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def zoo() -> ModuleType:
    """The repository's model zoo (``tests/flow/zoo.py``), loaded by path."""
    if not ZOO.exists():
        pytest.skip(f"the model zoo {ZOO} is not here (plugin installed outside the repository)")
    return testing.load_module_from_path(ZOO, "fxquant_repo_zoo")
