"""What a non-zero input zero point costs oneDNN's int8 conv (issue 19, MobileNetV2's miss).

x86's default mapping quantizes a relu6 / hardtanh with its input's qparams (shared,
as torch.ao's x86 config does): the conv after a MobileNetV2 ``conv -> relu6`` then
reads uint8 activations whose zero point is that of the conv output before the clamp
(100-150 here), where torchao's ``X86InductorQuantizer`` observes after the clamp
(zero point 0). oneDNN compensates a non-zero source zero point with extra work on
every call. This times ``onednn.qconv_pointwise`` on MobileNetV2-like shapes with the
input zero point 0 and 128, interleaved (1 thread, per-call CPU time, median of 7
alternating rounds), everything else the same.

    python bench/profile_conv_zero_point.py [--batch 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

_ONEDNN = torch.ops.onednn
# (in, out, kernel, groups, size): MobileNetV2's expand, depthwise and project convs
SHAPES = (
    (96, 576, 1, 1, 14),
    (576, 576, 3, 576, 14),
    (576, 96, 1, 1, 14),
    (144, 24, 1, 1, 56),
    (32, 32, 3, 32, 112),
)


def conv_seconds(shape: tuple[int, ...], batch: int, rounds: int = 7) -> dict[int, float]:
    """Per-call CPU seconds of one int8 conv at input zero point 0 and 128."""
    cin, cout, k, groups, size = shape
    generator = torch.Generator().manual_seed(0)
    weight = torch.randint(-100, 100, (cout, cin // groups, k, k), generator=generator)
    weight = weight.to(torch.int8)
    scales = torch.rand(cout, generator=generator) * 0.01 + 0.001
    x = torch.randint(0, 255, (batch, cin, size, size), generator=generator).to(torch.uint8)
    x = x.contiguous(memory_format=torch.channels_last)
    geometry = ([1, 1], [k // 2] * 2, [1, 1], groups)
    zero = torch.zeros(cout, dtype=torch.int64)

    def call(zp: int, packed: torch.Tensor) -> torch.Tensor:
        return _ONEDNN.qconv_pointwise(  # type: ignore[no-any-return]
            x, 0.02, zp, packed, scales, zero, None, *geometry, 0.05, 10, None, "none", [], ""
        )

    packs = {
        zp: _ONEDNN.qconv_prepack(weight, scales, 0.02, zp, *geometry, list(x.shape))
        for zp in (0, 128)
    }
    once = time.process_time()
    for zp, packed in packs.items():
        call(zp, packed)
    repeats = max(1, int(0.1 / max(time.process_time() - once, 1e-5)))
    samples: dict[int, list[float]] = {0: [], 128: []}
    for index in range(rounds):
        for zp in (0, 128) if index % 2 == 0 else (128, 0):
            start = time.process_time()
            for _ in range(repeats):
                call(zp, packs[zp])
            samples[zp].append((time.process_time() - start) / repeats)
    return {zp: statistics.median(values) for zp, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| conv (in -> out, kernel, groups, size) | zp 0 us | zp 128 us | zp 128 / zp 0 |")
    print("| --- | --- | --- | --- |")
    for shape in SHAPES:
        seconds = conv_seconds(shape, args.batch)
        cin, cout, k, groups, size = shape
        label = f"{cin} -> {cout}, {k}x{k}, g{groups}, {size}x{size}, b{args.batch}"
        zero, shifted = seconds[0] * 1e6, seconds[128] * 1e6
        print(f"| {label} | {zero:.1f} | {shifted:.1f} | {shifted / zero:.3f} |")


if __name__ == "__main__":
    main()
