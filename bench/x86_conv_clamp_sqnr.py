"""x86's conv + activation observed after the activation: SQNR before and after, against pt2e.

Issue 31: x86's patterns quantized a relu6 / hardtanh on its own, sharing the conv's
qparams observed before the clamp (a uint8 zero point near 128 after every MobileNetV2
conv), and a hardswish / SiLU after the conv's own quantize step; ``ConvUnary2d`` now
observes conv (+ bn) + relu6 / hardtanh / hardswish / SiLU after the activation, as
torchao's X86InductorQuantizer does. Per model, one table row:

    before    x86's patterns without the ConvUnary2d fusions (a clamp shares the conv's
              qparams), x86's default mapping, ``convert_to_reference_fx``
    after     x86 as it ships, the same mapping and calibration
    lowered   ``convert_fx`` of "after" (oneDNN kernels, eager)
    pt2e      torchao pt2e, ``X86InductorQuantizer`` defaults, ``convert_pt2e``'s model run
              eagerly (the numerics its inductor compile keeps)

SQNR of each against the float model, ``10 log10(|float|^2 / |float - side|^2)``, on
``--eval`` held-out batches; every side calibrated on the same ``--calibration`` batches.
Models: torchvision's (random weights, seeded; 224 x 224) and the benchmark's MobileNetV2
(bench/models.py). Also the output zero point of the first conv + relu6, before and after.

    python bench/x86_conv_clamp_sqnr.py [--models mobilenet_v2,bench_mobilenet_v2,...]
        [--calibration 4] [--eval 2] [--batch 2] [--output x86_conv_clamp_sqnr.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx, nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.fspath(ROOT))
RESULTS = ROOT / "bench" / "results"
TORCHVISION = ("mobilenet_v2", "mobilenet_v3_large", "resnet50", "efficientnet_b0")


def build(name: str) -> nn.Module:
    """``name``: a torchvision classifier with random weights and BatchNorm statistics of
    random images (:func:`settle_batch_norms`), or ``bench_mobilenet_v2`` as the bench runs it."""
    torch.manual_seed(0)
    if name == "bench_mobilenet_v2":
        from models import mobilenet_v2

        return mobilenet_v2().build().eval()
    from tests.zoo.torchvision_models import load

    return settle_batch_norms(getattr(load().models, name)())


def settle_batch_norms(model: nn.Module, batches: int = 3) -> nn.Module:
    """``model`` in eval mode with each BatchNorm's running statistics those of random images.

    torchvision's initialisation with fresh statistics (mean 0, variance 1) lets the
    activations vanish or blow up through the depth (random MobileNetV2 outputs ~1e-9), so
    every quantized side would score 0 dB; a trained model's BatchNorms normalise them.
    """
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # the cumulative average over the batches
    gen = torch.Generator().manual_seed(2)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(4, 3, 224, 224, generator=gen))
    return model.eval()


def before_config() -> Any:
    """x86's backend config without the ConvUnary2d patterns (how x86 quantized before)."""
    import fxquant
    from fxquant_onednn.patterns import ConvUnary2d

    configs = [
        c
        for c in fxquant.get_backend_config("x86").configs
        if c.fused_module is not ConvUnary2d and c.pattern is not ConvUnary2d
    ]
    return fxquant.BackendConfig("x86").set_backend_pattern_configs(configs)


def sqnr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    noise = (expected - actual).double().pow(2).sum().clamp_min(1e-30)
    return round(float(10 * torch.log10(expected.double().pow(2).sum() / noise)), 2)


def first_clamp_zero_point(reference: fx.GraphModule) -> int | None:
    """The zero point of the quantize step after the first relu6 / ConvUnary2d (relu6), or None."""
    modules = dict(reference.named_modules())
    for node in reference.graph.nodes:
        module = modules.get(str(node.target)) if node.op == "call_module" else None
        clamp = isinstance(module, nn.ReLU6) or isinstance(getattr(module, "act", None), nn.ReLU6)
        if clamp and any("quantize_per_tensor" in str(u.target) for u in node.users):
            user = next(u for u in node.users if "quantize_per_tensor" in str(u.target))
            return int(user.args[2])
    return None


def fxquant_sides(model: nn.Module, calibration: list[torch.Tensor]) -> dict[str, Any]:
    import fxquant

    mapping = fxquant.get_default_qconfig_mapping("x86")
    sides: dict[str, Any] = {}
    for side, config in (("before", before_config()), ("after", fxquant.get_backend_config("x86"))):
        prepared = fxquant.prepare_fx(
            copy.deepcopy(model), mapping, (calibration[0],), backend_config=config
        )
        with torch.no_grad():
            for batch in calibration:
                prepared(batch)
        sides[side] = fxquant.convert_to_reference_fx(copy.deepcopy(prepared))
        if side == "after":
            sides["lowered"] = fxquant.convert_fx(prepared)
    return sides


def pt2e_side(model: nn.Module, calibration: list[torch.Tensor]) -> Callable[..., Any]:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    exported = torch.export.export(copy.deepcopy(model), (calibration[0],)).module()
    quantizer = xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config()
    )
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    with torch.no_grad():
        for batch in calibration:
            prepared(batch)
    return convert_pt2e(prepared)  # type: ignore[no-any-return]


def row(name: str, args: argparse.Namespace) -> dict[str, Any]:
    start = time.perf_counter()
    model = build(name)
    gen = torch.Generator().manual_seed(1)
    images = [
        torch.randn(args.batch, 3, 224, 224, generator=gen)
        for _ in range(args.calibration + args.eval)
    ]
    calibration, held_out = images[: args.calibration], images[args.calibration :]
    sides: dict[str, Any] = fxquant_sides(model, calibration)
    result: dict[str, Any] = {
        "model": name,
        "zero_point_before": first_clamp_zero_point(sides["before"]),
        "zero_point_after": first_clamp_zero_point(sides["after"]),
    }
    try:
        sides["pt2e"] = pt2e_side(model, calibration)
    except Exception as error:  # a failing side is a row with its error
        result["pt2e_error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    with torch.no_grad():
        expected = torch.cat([model(x) for x in held_out])
        for side, run in sides.items():
            result[f"sqnr_{side}"] = sqnr(expected, torch.cat([run(x) for x in held_out]))
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def print_rows(rows: list[dict[str, Any]]) -> None:
    header = ["model", "before dB", "after dB", "after - before", "lowered dB", "pt2e dB"]
    header += ["after - pt2e", "first relu6 zero point before / after"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for r in rows:
        pt2e = r.get("sqnr_pt2e")
        cells = [
            r["model"],
            r["sqnr_before"],
            r["sqnr_after"],
            round(r["sqnr_after"] - r["sqnr_before"], 2),
            r["sqnr_lowered"],
            pt2e if pt2e is not None else r.get("pt2e_error", "-"),
            "-" if pt2e is None else round(r["sqnr_after"] - pt2e, 2),
            f"{r['zero_point_before']} / {r['zero_point_after']}",
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(("bench_mobilenet_v2", *TORCHVISION)))
    parser.add_argument("--calibration", type=int, default=4, help="calibration batches")
    parser.add_argument("--eval", type=int, default=2, help="held-out batches")
    parser.add_argument("--batch", type=int, default=2, help="images per batch")
    parser.add_argument("--output", default="x86_conv_clamp_sqnr.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", DeprecationWarning)
    warnings.simplefilter("ignore", FutureWarning)
    logging.getLogger("torchao").setLevel(logging.ERROR)
    RESULTS.mkdir(exist_ok=True)
    rows = []
    for name in args.models.split(","):
        print(f"{name} ...", flush=True)
        rows.append(row(name, args))
        print_rows(rows[-1:])
        (RESULTS / args.output).write_text(json.dumps(rows, indent=2) + "\n")
    print_rows(rows)


if __name__ == "__main__":
    main()
