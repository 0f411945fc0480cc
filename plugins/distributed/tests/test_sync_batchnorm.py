"""SyncBatchNorm on CPU (gloo), inside fused QAT modules, and one DDP QAT step: issue 14.

One process: without a group it is BatchNorm; conversion reaches the BN inside
fused QAT modules, shares tensors, and round-trips; convert_fx folds it.
Two processes: forward and backward equal BatchNorm on the concatenated batch,
and one DDP step of a QAT model (SyncBatchNorm + global-batch observers) equals
one process's step on the whole batch, while the plain DDP step does not.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import fxquant
import pytest
import torch
from distributed_models import SmallCNN, seeded
from distributed_ranks import run_ranks
from fxquant.errors import ConfigTypeError
from fxquant.nn.intrinsic import qat as nniqat
from fxquant_distributed import SyncBatchNorm, convert_sync_batchnorm, revert_sync_batchnorm
from fxquant_distributed.collectives import GroupRef
from torch import nn

SHAPES = {nn.BatchNorm1d: (6, 4), nn.BatchNorm2d: (6, 4, 3, 3), nn.BatchNorm3d: (6, 4, 2, 2, 2)}


@pytest.mark.parametrize("batch_norm", sorted(SHAPES, key=lambda cls: cls.__name__))
def test_without_a_process_group_it_is_the_batch_norm_it_stands_for(
    batch_norm: type[nn.modules.batchnorm._BatchNorm],
) -> None:
    torch.manual_seed(0)
    plain = batch_norm(4, momentum=None)
    sync = convert_sync_batchnorm(copy.deepcopy(plain))
    assert isinstance(sync, SyncBatchNorm)
    for _ in range(3):
        x = torch.randn(SHAPES[batch_norm])
        assert torch.equal(sync(x), plain(x))
    assert torch.equal(sync.running_var, plain.running_var)
    assert torch.equal(sync.eval()(x), plain.eval()(x))
    with pytest.raises(ValueError, match="expected"):
        sync(torch.randn(2))  # the input check of the class it stands for


def qat_model() -> torch.fx.GraphModule:
    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
    return fxquant.prepare_qat_fx(
        seeded(SmallCNN).train(),
        mapping,
        (torch.randn(2, 1, 8, 8),),
        backend_config=fxquant.get_backend_config("reference"),
    )


def test_conversion_reaches_the_batch_norm_inside_fused_qat_modules_and_shares_its_tensors() -> (
    None
):
    prepared = qat_model()
    fused = [m for m in prepared.modules() if isinstance(m, nniqat.ConvBnReLU2d)]
    assert len(fused) == 2
    before = {id(t) for t in [*prepared.parameters(), *prepared.buffers()]}

    converted = convert_sync_batchnorm(prepared)

    assert converted is prepared  # in place, like torch's convert_sync_batchnorm
    assert all(type(module.bn) is SyncBatchNorm for module in fused)
    assert {id(t) for t in [*prepared.parameters(), *prepared.buffers()]} == before
    prepared.apply(nniqat.freeze_bn_stats)
    assert not any(module.bn.training for module in fused)
    revert_sync_batchnorm(prepared)
    assert all(type(module.bn) is nn.BatchNorm2d for module in fused)
    assert {id(t) for t in [*prepared.parameters(), *prepared.buffers()]} == before


def test_convert_fx_folds_sync_batch_norm_like_batch_norm() -> None:
    torch.manual_seed(0)
    prepared = qat_model()
    for _ in range(3):
        prepared(torch.randn(8, 1, 8, 8))
    plain = fxquant.convert_fx(copy.deepcopy(prepared).eval())
    synced = fxquant.convert_fx(convert_sync_batchnorm(copy.deepcopy(prepared)).eval())
    reverted = fxquant.convert_fx(
        revert_sync_batchnorm(convert_sync_batchnorm(copy.deepcopy(prepared))).eval()
    )
    x = torch.randn(16, 1, 8, 8)
    assert torch.equal(synced(x), plain(x))
    assert torch.equal(reverted(x), plain(x))


def test_torchs_sync_batch_norm_inside_fused_qat_modules_folds_too() -> None:
    """On GPUs torch's own SyncBatchNorm may train the fused modules; convert_fx folds it."""
    torch.manual_seed(0)
    prepared = qat_model()
    for _ in range(3):
        prepared(torch.randn(8, 1, 8, 8))
    plain = fxquant.convert_fx(copy.deepcopy(prepared).eval())
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(prepared))
    assert sum(type(m) is nn.SyncBatchNorm for m in synced.modules()) == 2
    x = torch.randn(16, 1, 8, 8)
    assert torch.equal(fxquant.convert_fx(synced.eval())(x), plain(x))


def test_batch_norm_type_must_be_a_batch_norm_class() -> None:
    with pytest.raises(ConfigTypeError, match=r"batch_norm_type must be .* got <class"):
        SyncBatchNorm(3, batch_norm_type=nn.LayerNorm)  # type: ignore[arg-type]


def test_copies_share_the_group_and_pickling_an_explicit_group_says_what_to_do() -> None:
    group = object()  # stands for a ProcessGroup, which cannot be copied or pickled
    bn = SyncBatchNorm(3, group=group)
    assert copy.deepcopy(bn).group is group
    with pytest.raises(TypeError, match=r"save its state_dict\(\)"):
        pickle.dumps(bn)
    assert pickle.loads(pickle.dumps(GroupRef(None))).group is None


def _moments(rank: int, world_size: int) -> dict[str, Any]:
    """SyncBatchNorm on uneven shards against BatchNorm on the concatenated batch."""
    found = {}
    for batch_norm, shape in SHAPES.items():
        torch.manual_seed(0)  # the same global batch, weights and output weights on both ranks
        whole = torch.randn(shape[0] + 3, *shape[1:]) * 3 + 1
        mix = torch.randn_like(whole)
        plain = batch_norm(shape[1])
        nn.init.normal_(plain.weight)
        nn.init.normal_(plain.bias)
        sync = convert_sync_batchnorm(copy.deepcopy(plain))
        rows = slice(0, 5) if rank == 0 else slice(5, None)  # 5 rows here, 4 there

        x = whole.clone().requires_grad_()
        expected = plain(x)
        (expected * mix).sum().backward()
        mine = whole[rows].clone().requires_grad_()
        out = sync(mine)
        (out * mix[rows]).sum().backward()
        found[batch_norm.__name__] = {
            "out": (out.detach(), expected.detach()[rows]),
            "grad_input": (mine.grad, x.grad[rows]),
            "grad_weight": (sync.weight.grad, plain.weight.grad),
            "running_var": (sync.running_var, plain.running_var),
            "running_mean": (sync.running_mean, plain.running_mean),
        }
    return found


def _ddp_step(rank: int, world_size: int) -> dict[str, Any]:
    """One DDP QAT step (SyncBatchNorm, global-batch observers) and the same step alone."""
    from fxquant_distributed import observe_global_batch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    prepared = qat_model()
    images = torch.rand(2, 16, 1, 8, 8)  # two steps of a global batch of 16
    labels = torch.randint(0, 10, (2, 16))

    def train(model: nn.Module, share: slice) -> nn.Module:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            loss = nn.functional.cross_entropy(model(images[step, share]), labels[step, share])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return model

    alone = train(copy.deepcopy(prepared), slice(None)).state_dict()
    mine = slice(8 * rank, 8 * (rank + 1))
    synced = DistributedDataParallel(convert_sync_batchnorm(copy.deepcopy(prepared)))
    with observe_global_batch(synced):
        train(synced, mine)
    plain = train(DistributedDataParallel(copy.deepcopy(prepared)), mine)
    return {
        "alone": alone,
        "synced": revert_sync_batchnorm(synced.module).state_dict(),
        "plain": plain.module.state_dict(),
    }


def _both(rank: int, world_size: int) -> dict[str, Any]:
    return {"moments": _moments(rank, world_size), "ddp": _ddp_step(rank, world_size)}


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_ranks(_both)


@pytest.mark.slow
@pytest.mark.parametrize("batch_norm", ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d"])
def test_on_two_ranks_forward_and_backward_equal_batch_norm_on_the_whole_batch(
    ranks: list[dict[str, Any]], batch_norm: str
) -> None:
    for rank in ranks:
        found = rank["moments"][batch_norm]
        for name in ("out", "grad_input", "running_mean", "running_var"):
            got, want = found[name]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)
    # the parameters' gradient: the ranks' parts add up to the whole batch's
    total = ranks[0]["moments"][batch_norm]["grad_weight"][0]
    total = total + ranks[1]["moments"][batch_norm]["grad_weight"][0]
    torch.testing.assert_close(total, ranks[0]["moments"][batch_norm]["grad_weight"][1])


def _max_difference(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(
        float((got[key].double() - want[key].double()).abs().max()) if got[key].numel() else 0.0
        for key in want
        if want[key].dtype.is_floating_point
    )


@pytest.mark.slow
def test_a_ddp_qat_step_on_two_ranks_equals_one_process_on_the_whole_batch(
    ranks: list[dict[str, Any]],
) -> None:
    for rank in ranks:
        alone, synced = rank["ddp"]["alone"], rank["ddp"]["synced"]
        assert synced.keys() == alone.keys()
        for key, value in alone.items():
            torch.testing.assert_close(synced[key], value, rtol=1e-4, atol=1e-5, msg=key)
    first, second = (rank["ddp"]["synced"] for rank in ranks)
    for key, value in first.items():
        assert torch.equal(value, second[key]), key  # identical on both ranks, bit for bit


@pytest.mark.slow
def test_plain_ddp_leaves_batch_norm_and_observers_per_rank(ranks: list[dict[str, Any]]) -> None:
    """The control: without SyncBatchNorm and global batches the ranks drift apart."""
    first, second = (rank["ddp"]["plain"] for rank in ranks)
    apart = [key for key in first if not torch.equal(first[key], second[key])]
    assert any(key.endswith("activation_post_process.min_val") for key in apart), apart
    assert _max_difference(first, ranks[0]["ddp"]["alone"]) > 1e-3
