"""Sharded calibration and QAT under DistributedDataParallel with fxquant, on CPU processes.

    torchrun --standalone --nproc_per_node 2 docs/examples/distributed_quantization.py

Every rank builds the same model. Post-training: each rank calibrates its
shard of the calibration batches, ``sync_observers`` merges the observers, and
every rank converts the same model. QAT: the prepared model is fine-tuned under
DDP with BatchNorm and observers over the global batch, then converted on every
rank. Rank 0 prints the accuracies and whether all ranks hold the same models
(plugins/distributed/tests/test_example.py runs this file with torchrun).
"""

from __future__ import annotations

import argparse
import copy

import fxquant
import fxquant_distributed as fxdist
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def make_data(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten random 8x8 prototypes plus noise: a small task that needs training."""
    generator = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(10, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 10, (count,), generator=generator)
    noise = 0.3 * torch.randn(count, 1, 8, 8, generator=generator)
    return (prototypes[labels] + noise).clamp(0, 1), labels


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(images).argmax(1) == labels).float().mean()) * 100


def same_on_every_rank(model: nn.Module, images: torch.Tensor) -> bool:
    """True on every rank when every rank's model gives rank 0's outputs, bit for bit."""
    with torch.no_grad():
        outputs = model(images)
    gathered = [torch.empty_like(outputs) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, outputs)
    return all(torch.equal(found, gathered[0]) for found in gathered)


def calibrate_shards(model: nn.Module, images: torch.Tensor) -> nn.Module:
    """Post-training: this rank's shard of the batches, then the observers merged."""
    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = fxquant.prepare_fx(copy.deepcopy(model).eval(), mapping, (images[:1],))
    with torch.no_grad():
        for batch in images.split(64)[dist.get_rank() :: dist.get_world_size()]:
            prepared(batch)
    fxdist.sync_observers(prepared)
    return fxquant.convert_fx(prepared)


def fine_tune(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, steps: int
) -> nn.Module:
    """QAT under DDP: BatchNorm and observers over the global batch; converted after."""
    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
    prepared = fxquant.prepare_qat_fx(copy.deepcopy(model).train(), mapping, (images[:2],))
    ddp = DistributedDataParallel(fxdist.convert_sync_batchnorm(prepared))
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(dist.get_rank())  # each rank its own batches
    with fxdist.observe_global_batch(ddp):
        for _ in range(steps):
            chosen = torch.randint(0, len(images), (32,), generator=generator)
            loss = nn.functional.cross_entropy(ddp(images[chosen]), labels[chosen])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return fxquant.convert_fx(fxdist.revert_sync_batchnorm(ddp.module).eval())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="QAT steps per rank")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    torch.manual_seed(0)  # the same model on every rank
    model = make_model()
    images, labels = make_data(2048, seed=1)
    test_images, test_labels = make_data(512, seed=2)

    ptq = calibrate_shards(model, images)
    qat = fine_tune(model, images, labels, args.steps)

    ptq_same = same_on_every_rank(ptq, test_images)
    qat_same = same_on_every_rank(qat, test_images)
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        print(f"sharded calibration: the same int8 model on all {world} ranks: {ptq_same}")
        print(f"QAT: int8 accuracy {accuracy(qat, test_images, test_labels):.1f}%")
        print(f"QAT: the same int8 model on all {world} ranks: {qat_same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
