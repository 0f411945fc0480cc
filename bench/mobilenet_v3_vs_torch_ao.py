"""fxquant against torch.ao's FX flow on torchvision's MobileNetV3 family (issue 30).

    OMP_NUM_THREADS=1 python bench/mobilenet_v3_vs_torch_ao.py [--models mobilenet_v3_large]
        [--backends x86,fbgemm] [--size 224]

Each torchvision model (random weights, BatchNorm statistics of random images, as
``bench/x86_conv_clamp_sqnr.py`` builds them) is quantized by fxquant (the backend's
default mapping, ``convert_fx``) and by torch.ao (the same backend's default mapping and
backend config, its engine set), both calibrated on the same batches and scored by SQNR
against float on the same held-out batches. Where fxquant is under torch.ao, its
per-node ``compare`` against its reference model shows the nodes that lose the most.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.fspath(ROOT))
sys.path.insert(0, os.fspath(ROOT / "bench"))

from x86_conv_clamp_sqnr import settle_batch_norms, sqnr  # noqa: E402

MODELS = ("mobilenet_v3_large", "mobilenet_v3_small", "deeplabv3_mobilenet_v3_large")


def build(name: str) -> nn.Module:
    from tests.zoo.torchvision_models import load

    torch.manual_seed(0)
    models = load().models
    if name.startswith("deeplabv3"):
        model = getattr(models.segmentation, name)(weights=None, weights_backbone=None)
        model.aux_classifier = None
    else:
        model = getattr(models, name)(weights=None)
    return settle_batch_norms(model)


def output(value: Any) -> torch.Tensor:
    return value["out"] if isinstance(value, dict) else value


def fxquant_side(model: nn.Module, backend: str, calibration: list[torch.Tensor]) -> nn.Module:
    import fxquant

    config = fxquant.get_backend_config(backend)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    prepared = fxquant.prepare_fx(
        copy.deepcopy(model), mapping, (calibration[0],), backend_config=config
    )
    with torch.no_grad():
        for batch in calibration:
            prepared(batch)
    return fxquant.convert_fx(prepared, backend_config=config)


def torch_ao_side(model: nn.Module, backend: str, calibration: list[torch.Tensor]) -> nn.Module:
    from tests import oracle

    ao = oracle.load()
    from torch.ao.quantization import quantize_fx

    from tests.zoo.runner import _ao_backend_config

    with oracle.quiet():
        prepared = quantize_fx.prepare_fx(
            copy.deepcopy(model),
            ao.get_default_qconfig_mapping(backend),
            (calibration[0],),
            backend_config=_ao_backend_config(ao, backend),
        )
        with torch.no_grad():
            for batch in calibration:
                prepared(batch)
        return quantize_fx.convert_fx(prepared)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backends", default="x86,fbgemm")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calibration", type=int, default=4)
    parser.add_argument("--eval", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print("| model | backend | fxquant dB | torch.ao dB | fxquant - torch.ao |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        model = build(name)
        gen = torch.Generator().manual_seed(1)
        images = [
            torch.randn(2, 3, args.size, args.size, generator=gen)
            for _ in range(args.calibration + args.eval)
        ]
        calibration, held_out = images[: args.calibration], images[args.calibration :]
        with torch.no_grad():
            expected = torch.cat([output(model(x)) for x in held_out])
        for backend in args.backends.split(","):
            ours = fxquant_side(model, backend, calibration)
            theirs = torch_ao_side(model, backend, calibration)
            torch.backends.quantized.engine = backend
            with torch.no_grad():
                got = sqnr(expected, torch.cat([output(ours(x)) for x in held_out]))
                ao_got = sqnr(expected, torch.cat([output(theirs(x)) for x in held_out]))
            print(f"| {name} | {backend} | {got} | {ao_got} | {got - ao_got:+.2f} |", flush=True)


if __name__ == "__main__":
    main()
