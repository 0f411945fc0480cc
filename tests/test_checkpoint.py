"""Checkpoints: corrupt, truncated and changed files are refused by name (#18 item 8)."""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Any

import fxquant
import pytest
import torch
from fxquant.errors import CheckpointError
from fxquant.tools.checkpoint import load_checkpoint, save_checkpoint
from hypothesis import given, settings
from hypothesis import strategies as st


def _prepared(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    prepared = fxquant.prepare_fx(
        model.eval(), fxquant.get_default_qconfig_mapping("reference"), (torch.randn(1, 4),)
    )
    prepared(torch.randn(16, 4))
    return prepared


@functools.cache
def _saved() -> tuple[bytes, dict[str, Any]]:
    model = _prepared()
    buffer = io.BytesIO()
    save_checkpoint(model, buffer)
    return buffer.getvalue(), {k: v.clone() for k, v in model.state_dict().items()}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_round_trips_into_a_fresh_prepared_model(tmp_path: Path) -> None:
    path = tmp_path / "calib.pt"
    model = _prepared()
    save_checkpoint(model, path)
    fresh = _prepared(seed=1)
    load_checkpoint(path, fresh)
    x = torch.randn(3, 4)
    assert torch.equal(fresh(x), model(x))
    assert _same(fresh.state_dict(), model.state_dict())


@settings(max_examples=60, deadline=None)
@given(position=st.integers(min_value=0), bit=st.integers(0, 7))
def test_a_flipped_bit_is_refused_or_changes_nothing(position: int, bit: int) -> None:
    data, state = _saved()
    flipped = bytearray(data)
    flipped[position % len(data)] ^= 1 << bit
    try:
        loaded = load_checkpoint(io.BytesIO(bytes(flipped)))
    except CheckpointError as error:
        message = str(error)
    else:  # a byte no reader looks at (zip padding, a CRC torch ignores): same content
        assert _same(loaded, state)
        return
    assert message.startswith("load_checkpoint(<BytesIO>): ")


def test_a_flipped_byte_inside_a_tensor_names_the_entry(tmp_path: Path) -> None:
    data, _ = _saved()
    weight = _prepared().state_dict()["2.weight"]
    raw = weight.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    start = data.index(raw)
    flipped = bytearray(data)
    flipped[start + 5] ^= 0x10
    path = tmp_path / "flipped.pt"
    path.write_bytes(bytes(flipped))
    plain = torch.load(path, weights_only=True)["state_dict"]["2.weight"]  # torch: no word
    assert not torch.equal(plain, weight)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == (
        f"load_checkpoint({str(path)!r}): entry '2.weight' does not match its SHA-256: the file "
        "changed after it was saved (a flipped byte, a partial copy); restore it from a good copy"
    )


@pytest.mark.parametrize("keep", [0, 10, 100, 0.5, 0.9])
def test_a_truncated_file_is_refused_naming_the_file(tmp_path: Path, keep: float) -> None:
    data, _ = _saved()
    path = tmp_path / "truncated.pt"
    path.write_bytes(data[: int(keep * len(data)) if isinstance(keep, float) else keep])
    with pytest.raises(CheckpointError, match=rf"^load_checkpoint\('{tmp_path}/truncated\.pt'\): "):
        load_checkpoint(path)


def test_a_plain_state_dict_file_is_refused_with_the_way_to_write_one() -> None:
    buffer = io.BytesIO()
    torch.save(_prepared().state_dict(), buffer)
    buffer.seek(0)
    with pytest.raises(CheckpointError, match="a state dict without checksums, not an fxquant"):
        load_checkpoint(buffer)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_bad_scale_is_refused_on_save_and_on_load(bad: float) -> None:
    state = dict(_prepared().state_dict())
    state["observer.scale"] = torch.tensor([0.1, bad])
    with pytest.raises(
        CheckpointError, match=r"'observer\.scale' holds .*expected finite scales > 0"
    ):
        save_checkpoint(state, io.BytesIO())


def test_a_checkpoint_that_does_not_fit_the_model_leaves_it_untouched() -> None:
    data, _ = _saved()
    other = fxquant.prepare_fx(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval(),
        fxquant.get_default_qconfig_mapping("reference"),
        (torch.randn(1, 4),),
    )
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"'2.weight' has shape \(2, 8\), the model expects"):
        load_checkpoint(io.BytesIO(data), other)
    assert _same(other.state_dict(), before)
