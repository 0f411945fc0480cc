"""QAT of the digits CNN under DistributedDataParallel on two processes (gloo, CPU): issue 14.

The float CNN is trained once here (as in tests/backends/test_digits_accuracy.py);
each rank then fine-tunes the ``prepare_qat_fx`` model on its own batches of 32
(a global batch of 64) for 100 steps, with ``convert_sync_batchnorm`` (BN over the
global batch) and ``observe_global_batch`` (the same observer updates on both
ranks), and converts it with ``convert_fx``. Both ranks must hold the same
fake-quantize qparams and convert to the same model, whose int8 accuracy is
within one point of float's.
"""

from __future__ import annotations

from typing import Any

import fxquant
import pytest
import torch
from distributed_models import SmallCNN, seeded
from distributed_ranks import run_ranks
from fxquant.tools import testing
from torch import nn

pytestmark = pytest.mark.slow  # trains the float model, then two processes fine-tune it

STEPS = 100
BATCH = 32  # per rank


def _qparams(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every fake-quantize module's scale, zero point and observer statistics."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, fxquant.fake_quantize.FakeQuantize):
            found[f"{name}.scale"] = module.scale.clone()
            found[f"{name}.zero_point"] = module.zero_point.clone()
            found[f"{name}.min_val"] = module.activation_post_process.min_val.clone()
            found[f"{name}.max_val"] = module.activation_post_process.max_val.clone()
    return found


def _fine_tune(rank: int, world_size: int, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    import fxquant_distributed as fxdist
    from torch.nn.parallel import DistributedDataParallel

    data = testing.load_digits()
    model = SmallCNN()
    model.load_state_dict(state)
    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
    reference = fxquant.get_backend_config("reference")
    prepared = fxquant.prepare_qat_fx(
        model.train(), mapping, (data.train_x[:2],), backend_config=reference
    )
    ddp = DistributedDataParallel(fxdist.convert_sync_batchnorm(prepared))
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.001)
    generator = torch.Generator().manual_seed(0)  # the same global batches on every rank
    with fxdist.observe_global_batch(ddp):
        for _ in range(STEPS):
            chosen = torch.randint(0, len(data.train_x), (BATCH * world_size,), generator=generator)
            mine = chosen[rank * BATCH : (rank + 1) * BATCH]
            loss = nn.functional.cross_entropy(ddp(data.train_x[mine]), data.train_y[mine])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    trained = fxdist.revert_sync_batchnorm(ddp.module).eval()
    found: dict[str, Any] = {"qparams": _qparams(trained), "converted": {}}
    backends = [name for name in ("reference", "x86") if name in fxquant.list_backends()]
    for backend in backends:
        config = fxquant.get_backend_config(backend)
        converted = fxquant.convert_fx(trained, backend_config=config)
        with torch.no_grad():
            outputs = converted(data.test_x)
        found["converted"][backend] = {
            "code": converted.code,
            "outputs": outputs,
            "accuracy": testing.digits_accuracy(converted, data),
            "tensors": {k: v for k, v in converted.state_dict().items() if torch.is_tensor(v)},
        }
    return found


@pytest.fixture(scope="module")
def float_model() -> nn.Module:
    pytest.importorskip("sklearn.datasets")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return testing.train_digits_classifier(
            seeded(SmallCNN), testing.load_digits(), steps=400, lr=0.01
        )
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ranks(float_model: nn.Module) -> list[dict[str, Any]]:
    return run_ranks(_fine_tune, float_model.state_dict())


def test_both_ranks_hold_identical_fake_quantize_qparams(ranks: list[dict[str, Any]]) -> None:
    first, second = (rank["qparams"] for rank in ranks)
    assert len(first) >= 4 * 5  # inputs, two conv-bn-relu, linear, and the weights'
    assert first.keys() == second.keys()
    for key, value in first.items():
        assert torch.equal(value, second[key]), key


def test_both_ranks_convert_to_the_same_model(ranks: list[dict[str, Any]]) -> None:
    first, second = (rank["converted"] for rank in ranks)
    assert "reference" in first
    for backend, model in first.items():
        other = second[backend]
        assert model["code"] == other["code"], backend
        assert torch.equal(model["outputs"], other["outputs"]), backend
        assert model["tensors"].keys() == other["tensors"].keys()
        for key, value in model["tensors"].items():
            assert torch.equal(value, other["tensors"][key]), (backend, key)


def test_int8_accuracy_after_two_rank_qat_is_within_one_point_of_float(
    ranks: list[dict[str, Any]], float_model: nn.Module
) -> None:
    data = testing.load_digits()
    float_accuracy = testing.digits_accuracy(float_model, data)
    assert float_accuracy > 90, "the float model did not learn the task: the test proves nothing"
    for backend, model in ranks[0]["converted"].items():
        int8_accuracy = model["accuracy"]
        print(
            f"digits 2-rank QAT {backend}: float {float_accuracy:.2f}%, int8 {int8_accuracy:.2f}%"
        )
        assert abs(int8_accuracy - float_accuracy) <= 1.0, (backend, int8_accuracy)
