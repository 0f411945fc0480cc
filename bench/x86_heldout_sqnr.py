"""fxquant's x86 recipe against pt2e's on held-out images: per-image paired SQNR (issue 31).

The benchmark row scores SQNR on the 8 images it times, which are also the calibration
batch: on a random-weight MobileNetV2 a 0.1 dB gap there is noise-sized. Here both
sides are calibrated on the same ``--calib`` batches (the first is the timed row's batch
of 8, seed 0) and scored on ``--images`` other images (seeds from 1000 on, never
calibrated on): fxquant's reference model (``convert_to_reference_fx``, the numerics its
compiled deployment keeps) and pt2e's ``convert_pt2e`` model (X86InductorQuantizer's
defaults, run eagerly: the numerics its compile keeps). Per image: SQNR of each side's
output against the float model's, and the paired difference fxquant - pt2e; printed: the
mean difference with its 95% interval (normal approximation), the median, the quartiles,
the share of images where fxquant is ahead, and each side's SQNR over the whole set.

``--model-seeds 1,2,...``: the same on MobileNetV2s of other random weights (the model's
seed; 0 is the benchmark's): per image the gap averages out the images, but on one model
the weights' rounding errors are one fixed draw, so whether a gap is systematic shows
only across models. Printed per model and over the models (mean of the per-model mean
gaps, its 95% interval, the share of models where fxquant is ahead).

``--swap-weights``: a third side, fxquant's reference model with each quantized layer's
weights replaced by pt2e's integer weights and scales (matched by shape and order): if
it lands on pt2e's SQNR, the weights explain the gap (the activation steps are pt2e's
already: bench/x86_qparams_vs_pt2e.py).

    python bench/x86_heldout_sqnr.py [--model mobilenet_v2] [--images 128] [--calib 1]
        [--swap-weights] [--model-seeds 0,1,2,3] [--output x86_heldout_sqnr.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import statistics
import warnings
from typing import Any

import bench_compiled_x86 as compiled_bench
import fxquant
import harness
import torch
from bench_x86_precisions import RESULTS
from harness import isa_flags, load
from models import MobileNetV2, main_output, seeded
from torch import fx
from x86_qparams_vs_pt2e import _pt2e_weights

BATCH = 8


def images(seed: int, size: int = 224) -> torch.Tensor:
    """A batch of 8 random images, seeded (seed 0 is the timed benchmark row's batch)."""
    return torch.randn(BATCH, 3, size, size, generator=torch.Generator().manual_seed(seed))


def both_sides(model: torch.nn.Module, calib: list[torch.Tensor]) -> tuple[Any, Any]:
    """fxquant's x86 reference model and pt2e's converted model, calibrated on ``calib``."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    inputs = (calib[0],)
    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, inputs, backend_config=config)
    exported = torch.export.export(copy.deepcopy(model), inputs).module()
    quantizer = xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config()
    )
    theirs = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    with torch.no_grad():
        for batch in calib:
            prepared(batch)
            theirs(batch)
    return fxquant.convert_to_reference_fx(prepared), convert_pt2e(theirs)


def with_pt2e_weights(reference: fx.GraphModule, pt2e: fx.GraphModule) -> fx.GraphModule:
    """A copy of fxquant's reference model whose quantized layers carry pt2e's weights
    (integers times scales, so fxquant's own weight step reproduces them exactly)."""
    swapped = copy.deepcopy(reference)
    modules = [m for _, m in swapped.named_modules() if hasattr(m, "weight_scale")]
    for module, (integers, scale) in zip(modules, _pt2e_weights(pt2e), strict=False):
        if integers.shape != module.weight.shape:
            break
        shape = (-1,) + (1,) * (integers.dim() - 1)
        module.weight.data = integers.float() * scale.view(shape)
        module.weight_scale.copy_(scale)
        module.weight_zero_point.zero_()
    return swapped


def per_image_sqnr(expected: torch.Tensor, actual: torch.Tensor) -> list[float]:
    return [compiled_bench.sqnr(e, a) for e, a in zip(expected, actual, strict=True)]


def summary(diffs: list[float]) -> dict[str, float]:
    """Mean paired difference with its 95% interval, median, quartiles, share ahead."""
    mean, spread = statistics.fmean(diffs), statistics.stdev(diffs)
    half = 1.96 * spread / math.sqrt(len(diffs))
    quartiles = statistics.quantiles(diffs, n=4)
    return {
        "mean": round(mean, 4),
        "ci95": [round(mean - half, 4), round(mean + half, 4)],
        "stdev": round(spread, 4),
        "median": round(statistics.median(diffs), 4),
        "q1": round(quartiles[0], 4),
        "q3": round(quartiles[2], 4),
        "share_ahead": round(sum(d > 0 for d in diffs) / len(diffs), 3),
    }


def score(model: torch.nn.Module, sides: dict[str, Any], count: int) -> dict[str, Any]:
    """Per image, each side's SQNR on ``count`` held-out images; and over the whole set."""
    per: dict[str, list[float]] = {name: [] for name in sides}
    noise = dict.fromkeys(sides, 0.0)
    signal = 0.0
    with torch.no_grad():
        for seed in range(1000, 1000 + math.ceil(count / BATCH)):
            batch = images(seed)
            expected = main_output(model(batch)).float()
            signal += float(expected.pow(2).sum())
            for name, side in sides.items():
                actual = main_output(side(batch)).float()
                per[name] += per_image_sqnr(expected, actual)
                noise[name] += float((expected - actual).pow(2).sum())
    whole = {name: round(10 * math.log10(signal / noise[name]), 3) for name in sides}
    return {"per_image": per, "whole_set_db": whole}


def build(name: str, seed: int) -> torch.nn.Module:
    """The benchmark's ``name`` model; another seed's random weights for MobileNetV2."""
    if seed == 0:
        return compiled_bench.BUILDERS[name](quick=False, batch=BATCH).build().eval()
    if name != "mobilenet_v2":
        msg = f"--model-seeds other than 0 need --model mobilenet_v2, got --model {name!r}"
        raise ValueError(msg)
    return seeded(lambda: MobileNetV2(width=1.0, classes=1000), seed=seed).eval()


def one_model(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Any]:
    """Both sides calibrated on the same batches, scored per image on the held-out set."""
    reference, pt2e = both_sides(model, [images(seed) for seed in range(args.calib)])
    sides = {"fxquant": reference, "pt2e": pt2e}
    if args.swap_weights:
        sides["fxquant_pt2e_weights"] = with_pt2e_weights(reference, pt2e)
    result = score(model, sides, args.images)
    per = result["per_image"]
    for name in (n for n in sides if n != "pt2e"):
        diffs = [a - b for a, b in zip(per[name], per["pt2e"], strict=True)]
        result[f"{name}_minus_pt2e"] = summary(diffs)
        print(f"  {name} - pt2e per image (dB, {len(diffs)} images): {summary(diffs)}")
    for name in sides:
        print(f"  {name}: mean per-image {statistics.fmean(per[name]):.3f} dB, "
              f"whole set {result['whole_set_db'][name]} dB", flush=True)  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--images", type=int, default=128, help="held-out images (x8)")
    parser.add_argument("--calib", type=int, default=1, help="calibration batches of 8")
    parser.add_argument("--swap-weights", action="store_true")
    parser.add_argument("--model-seeds", default="0", help="comma-separated model seeds")
    parser.add_argument("--output", default="x86_heldout_sqnr.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.getLogger("torchao").setLevel(logging.ERROR)
    print("ISA: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in isa_flags().items()))
    print(f"before: {load()}", flush=True)
    results = {}
    for seed in (int(s) for s in args.model_seeds.split(",")):
        print(f"{args.model} seed {seed} ({load()})", flush=True)
        results[seed] = one_model(build(args.model, seed), args)
    gaps = [r["fxquant_minus_pt2e"]["mean"] for r in results.values()]
    across = summary(gaps) if len(gaps) > 1 else {}
    print(f"fxquant - pt2e over {len(gaps)} models (per-model mean gaps {gaps}): {across}")
    info = harness.machine(("fxquant", "torchao"), isa=isa_flags(), load_after=load())
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / args.output
    record = {"machine": info, "args": vars(args), "models": results, "across_models": across}
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"after: {load()}; wrote {path}")


if __name__ == "__main__":
    main()
