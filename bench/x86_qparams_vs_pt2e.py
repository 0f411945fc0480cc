"""Where fxquant's x86 recipe and pt2e's differ on one model: activation and weight qparams.

Issue 31: the benchmark MobileNetV2 at b8 scored 0.06-0.10 dB under pt2e. Both sides are
calibrated on the same batch; this prints each side's SQNR against float, then every
activation quantize step in graph order (scale, zero point: fxquant's reference model
against ``convert_pt2e``'s), and per quantized conv/linear the largest relative
difference of the per-channel weight scales and each side's weight error
``|dequantize(quantize(w)) - w| / |w|`` (pt2e's weight matched by shape and order).

    python bench/x86_qparams_vs_pt2e.py [--model mobilenet_v2] [--batch 8]
"""

from __future__ import annotations

import argparse
import copy
import logging
import warnings

import bench_compiled_x86 as compiled_bench
import fxquant
import torch
from torch import fx


def _quantize_steps(model: fx.GraphModule) -> list[tuple[float, int]]:
    steps = []
    for node in model.graph.nodes:
        name = str(node.target)
        if node.op != "call_function" or "quantize_per_tensor" not in name or "dequant" in name:
            continue
        scale, zero_point = node.args[1], node.args[2]
        if isinstance(scale, fx.Node):
            scale, zero_point = (
                getattr(model, str(scale.target)),
                getattr(model, str(zero_point.target)),
            )
        steps.append((float(scale), int(zero_point)))
    return steps


def _pt2e(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    exported = torch.export.export(copy.deepcopy(model), inputs).module()
    quantizer = xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config()
    )
    prepared = prepare_pt2e(exported, quantizer)  # type: ignore[arg-type]
    with torch.no_grad():
        prepared(*inputs)
    return convert_pt2e(prepared)


def _pt2e_weights(model: fx.GraphModule) -> list[tuple[torch.Tensor, torch.Tensor]]:
    weights = []
    for node in model.graph.nodes:
        if node.op == "call_function" and "dequantize_per_channel" in str(node.target):
            integers, scale = (getattr(model, str(a.target)) for a in node.args[:2])
            weights.append((integers, scale))
    return weights


def _weight_error(weight: torch.Tensor, integers: torch.Tensor, scale: torch.Tensor) -> float:
    shape = (-1,) + (1,) * (weight.dim() - 1)
    return float((integers.float() * scale.view(shape) - weight).norm() / weight.norm())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.getLogger("torchao").setLevel(logging.ERROR)
    spec = compiled_bench.BUILDERS[args.model](quick=False, batch=args.batch)
    model, inputs = spec.build().eval(), spec.inputs()
    config = fxquant.get_backend_config("x86")
    mapping = fxquant.get_default_qconfig_mapping("x86")
    prepared = fxquant.prepare_fx(copy.deepcopy(model), mapping, inputs, backend_config=config)
    with torch.no_grad():
        prepared(*inputs)
        reference, pt2e = fxquant.convert_to_reference_fx(prepared), _pt2e(model, inputs)
        expected = model(*inputs)
        print(f"SQNR fxquant {compiled_bench.sqnr(expected, reference(*inputs)):.3f} dB, "
              f"pt2e {compiled_bench.sqnr(expected, pt2e(*inputs)):.3f} dB")  # fmt: skip
    ours, theirs = _quantize_steps(reference), _quantize_steps(pt2e)
    same = sum(
        1
        for a, b in zip(ours, theirs, strict=False)
        if a[1] == b[1] and abs(a[0] - b[0]) <= 1e-6 * b[0]
    )
    print(f"activation quantize steps: fxquant {len(ours)}, pt2e {len(theirs)}; "
          f"the first {min(len(ours), len(theirs))} pairwise equal (to 1e-6): {same}")  # fmt: skip
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a[1] != b[1] or abs(a[0] - b[0]) > 1e-6 * b[0]:
            print(f"  step {index}: fxquant {a}, pt2e {b}")
    modules = [(n, m) for n, m in reference.named_modules() if hasattr(m, "weight_scale")]
    for (name, module), (integers, scale) in zip(modules, _pt2e_weights(pt2e), strict=False):
        weight = module.weight.detach()
        if integers.shape != weight.shape:
            print(f"  {name}: pt2e's weight {tuple(integers.shape)} is another layer's: stop")
            break
        shape = (-1,) + (1,) * (weight.dim() - 1)
        ours_int = torch.round(weight / module.weight_scale.view(shape)).clamp(-128, 127)
        ratio = float((scale / module.weight_scale).max())
        print(f"  {name} {tuple(weight.shape)}: pt2e / fxquant weight scale up to {ratio:.3f}; "
              f"weight error fxquant {_weight_error(weight, ours_int, module.weight_scale):.5f} "
              f"pt2e {_weight_error(weight, integers, scale):.5f}")  # fmt: skip


if __name__ == "__main__":
    main()
