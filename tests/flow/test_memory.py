"""Memory: the flow keeps no model alive, and convert's extra peak stays within 2x the weights.

torch.ao's flow keeps every model it has seen alive (a ``functools.cache`` on a
device helper); fxquant's must not. The peak is measured as the process's
resident-set high-water mark (``VmHWM`` in ``/proc/self/status``) after
resetting it (writing ``5`` to ``/proc/self/clear_refs``), minus the resident
set before the call: it counts every byte convert touches, tensor storage and
Python objects alike. Linux only; skipped elsewhere. The model is large enough
(12.6 MB of weights) that allocator noise is a few percent of the bound.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fxquant
import pytest
import torch
from fxquant.config.defaults import default_qconfig
from fxquant.flow import convert_fx, convert_to_reference_fx, prepare_fx, prepare_qat_fx
from torch import nn

from tests.flow.zoo import MLP, MobileNetV2Like, seeded

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _mapping() -> fxquant.QConfigMapping:
    return fxquant.QConfigMapping().set_global(default_qconfig)


def _dead(ref: weakref.ref[Any]) -> bool:
    gc.collect()
    return ref() is None


def test_float_and_prepared_models_die_when_the_user_drops_them() -> None:
    model = seeded(MobileNetV2Like)
    example = (torch.randn(2, 3, 16, 16),)
    prepared = prepare_fx(model, _mapping(), example)
    prepared(*example)
    converted = convert_to_reference_fx(prepared)
    converted(*example)
    float_ref, prepared_ref = weakref.ref(model), weakref.ref(prepared)
    del model, prepared
    assert _dead(float_ref), "the float model is still alive"
    assert _dead(prepared_ref), "the prepared model is still alive (the converted one holds it?)"
    converted_ref = weakref.ref(converted)
    del converted
    assert _dead(converted_ref), "the converted model is still alive"


def test_qat_and_convert_fx_keep_no_model_alive() -> None:
    model = seeded(MLP).train()
    example = (torch.randn(4, 16),)
    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
    prepared = prepare_qat_fx(model, mapping, example)
    prepared(*example)
    converted = convert_fx(prepared.eval())
    refs = [weakref.ref(m) for m in (model, prepared, converted)]
    del model, prepared, converted
    gc.collect()
    assert [r() is None for r in refs] == [True, True, True]


def test_a_failed_prepare_keeps_no_model_alive() -> None:
    """An error's traceback must not pin the model either, once the error is dropped."""

    class Untraceable(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x  # data-dependent control flow: not traceable

    model = Untraceable()
    ref = weakref.ref(model)
    with pytest.raises(Exception) as caught:  # noqa: PT011 - any error: the leak is the point
        prepare_fx(model, _mapping(), (torch.randn(2),))
    del model, caught
    assert _dead(ref)


# ---- peak memory ------------------------------------------------------------------------------


def _status(field: str) -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    msg = f"{field} not in {STATUS}"
    raise AssertionError(msg)


def extra_peak_bytes(call: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``call``; return its result and the resident-set peak above the level before it."""
    gc.collect()
    CLEAR_REFS.write_text("5")  # resets VmHWM to the current resident set
    before = _status("VmRSS:")
    result = call()
    return result, _status("VmHWM:") - before


def _can_reset_peak() -> bool:
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _can_reset_peak(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("step", ["convert_to_reference_fx", "convert_fx"])
def test_convert_extra_peak_memory_is_at_most_twice_the_weights(step: str) -> None:
    torch.set_num_threads(1)
    model = seeded(lambda: MLP(features=1024, hidden=1024, depth=3))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    example = (torch.randn(8, 1024),)
    # the flow's own copies: the reference backend (a backend's lowering packs weights too)
    reference = fxquant.get_backend_config("reference")
    prepared = prepare_fx(model, _mapping(), example, backend_config=reference)
    prepared(*example)
    convert = convert_to_reference_fx if step == "convert_to_reference_fx" else convert_fx
    converted, extra = extra_peak_bytes(lambda: convert(prepared))
    assert isinstance(converted, torch.fx.GraphModule)
    assert extra <= 2 * weights, f"extra peak {extra / weights:.2f}x the weights ({weights} B)"
