"""Defects ``fxquant check x86`` found in the oneDNN kernels, each pinned by a test (#13)."""

from __future__ import annotations

import pytest
import torch
from fxquant.tools import testing
from fxquant_onednn.modules import Fp16Linear
from torch import nn


def test_fp16_linear_loads_a_state_dict_and_repacks_its_new_weight() -> None:
    # it raised TypeError: its _load_from_state_dict was _Packed's, whose super() needs a _Packed
    kernel = Fp16Linear(torch.ones(2, 3), None)
    x = torch.ones(1, 3)
    assert torch.equal(kernel(x), torch.full((1, 2), 3.0))  # packs the ones
    kernel.load_state_dict({"weight": torch.full((2, 3), 2.0, dtype=torch.float16)})
    assert torch.equal(kernel(x), torch.full((1, 2), 6.0))  # not the stale packed ones


@pytest.mark.parametrize(
    "pool",
    [nn.MaxPool1d(2), nn.MaxPool3d((1, 2, 2))],
    ids=lambda pool: type(pool).__name__,
)
def test_1d_and_3d_max_pools_run_and_equal_the_reference(pool: nn.Module) -> None:
    # torch has no uint8 max_pool1d/3d: the lowered model raised NotImplementedError
    shape = (2, 4, 8) if "1d" in type(pool).__name__ else (2, 4, 2, 6, 6)
    case = testing.Case("pool", lambda i, o: pool, lambda b, c, s: [shape])
    for backend in ("onednn", "x86"):
        lowered, reference, inputs = testing.quantize_case(backend, case, (2, 4, 4, 6))
        assert "lowered" in testing.lowering_statuses(lowered).values()
        assert torch.equal(lowered(*inputs), reference(*inputs))
