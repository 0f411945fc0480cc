"""Checkpoints of a prepared or converted model's state, verified when they are loaded.

``torch.save(model.state_dict())`` files carry no check: a flipped byte in a tensor
loads without a word (17 of 20 such files did), and a truncated file fails with torch's
zip or pickle errors. :func:`save_checkpoint` writes the same state dict plus a
SHA-256 of every entry; :func:`load_checkpoint` reads it with ``weights_only=True``,
refuses a file whose bytes changed, and checks the quantization parameters (finite
scales > 0, integer zero points) and, given the model, every key and shape::

    save_checkpoint(prepared, "calib.pt")       {"fxquant_checkpoint": 1, "state_dict": ...,
                                                 "sha256": {key: digest}}
    load_checkpoint("calib.pt", fresh)          digests, qparams, keys/shapes -> load_state_dict
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import IO, Any

import torch

from fxquant.errors import CheckpointError

__all__ = ["FORMAT_VERSION", "load_checkpoint", "save_checkpoint"]

FORMAT_VERSION = 1
_MARK = "fxquant_checkpoint"

PathOrFile = str | os.PathLike[str] | IO[bytes]


def _name(file: object) -> str:
    if isinstance(file, (str, os.PathLike)):
        return repr(os.fspath(file))
    return (getattr(file, "name", None) and repr(file.name)) or f"<{type(file).__name__}>"  # type: ignore[attr-defined]  # files may have a name


def _digest(key: str, value: object) -> str:
    """SHA-256 of a state entry: its key, then its dtype, shape and bytes (or its repr).

    The key is hashed too: pickle writes each key string once and refers back to it, so
    a flipped byte in a key renames it in the state and the checksums alike.
    """
    sha = hashlib.sha256(f"{key}|".encode())
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.is_quantized:
            tensor = tensor.int_repr()
        sha.update(f"{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        flat = tensor.contiguous().reshape(-1)
        if flat.numel():
            sha.update(flat.view(torch.uint8).numpy().tobytes())
    else:
        sha.update(repr(value).encode())
    return sha.hexdigest()


def _check_qparams(state: Mapping[str, Any], where: str) -> None:
    """Scales finite and > 0, zero points integers (or finite floats for float qparams)."""
    for key, value in state.items():
        if not isinstance(value, torch.Tensor) or value.numel() == 0:
            continue
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "scale":
            bad = ~torch.isfinite(value.float()) | (value.float() <= 0)
            if bool(bad.any()):
                msg = (
                    f"{where}: {key!r} holds {value.flatten()[bad.flatten()][:3].tolist()}; "
                    "expected finite scales > 0 (calibrate again, or check the source)"
                )
                raise CheckpointError(msg)
        elif (
            leaf == "zero_point"
            and value.is_floating_point()
            and not bool(torch.isfinite(value).all())
        ):
            msg = f"{where}: {key!r} holds a non-finite zero point; expected finite values"
            raise CheckpointError(msg)


def save_checkpoint(model: torch.nn.Module | Mapping[str, Any], file: PathOrFile) -> None:
    """Save ``model``'s state dict (or a state dict) with a SHA-256 of every entry.

    Raises:
        CheckpointError: a scale is not finite and > 0 (nothing is written).

    Example:
        >>> import io
        >>> buffer = io.BytesIO()
        >>> save_checkpoint(torch.nn.Linear(2, 2), buffer)
        >>> _ = buffer.seek(0)
        >>> sorted(load_checkpoint(buffer))
        ['bias', 'weight']
    """
    state = dict(model.state_dict() if isinstance(model, torch.nn.Module) else model)
    _check_qparams(state, f"save_checkpoint({_name(file)})")
    payload = {
        _MARK: FORMAT_VERSION,
        "state_dict": state,
        "sha256": {key: _digest(key, value) for key, value in state.items()},
    }
    torch.save(payload, file)


def _read(file: PathOrFile, where: str) -> Any:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise  # a missing or unreadable file: Python's error already names it
    except Exception as error:  # torch's zip/pickle/seek errors for a truncated or corrupt file
        first = (str(error).splitlines() or [""])[0]
        msg = (
            f"{where}: the file is not a readable checkpoint: it is truncated or corrupt, or "
            f"not a torch.save file ({type(error).__name__}: {first}); "
            "expected a file written by fxquant.tools.checkpoint.save_checkpoint"
        )
        raise CheckpointError(msg) from error


def _verified_state(payload: Any, where: str) -> dict[str, Any]:
    if not isinstance(payload, dict) or _MARK not in payload:
        kind = "a state dict without checksums" if isinstance(payload, dict) else "no dict"
        msg = (
            f"{where}: the file holds {kind}, not an fxquant checkpoint; write it with "
            "fxquant.tools.checkpoint.save_checkpoint (torch.load reads plain state dicts)"
        )
        raise CheckpointError(msg)
    if payload[_MARK] != FORMAT_VERSION:
        msg = f"{where}: checkpoint format {payload[_MARK]!r}; this fxquant reads {FORMAT_VERSION}"
        raise CheckpointError(msg)
    state, digests = payload.get("state_dict"), payload.get("sha256")
    if not isinstance(state, dict) or not isinstance(digests, dict) or set(state) != set(digests):
        msg = f"{where}: the checkpoint's state and checksums do not match: the file is corrupt"
        raise CheckpointError(msg)
    for key, value in state.items():
        if _digest(key, value) != digests[key]:
            msg = (
                f"{where}: entry {key!r} does not match its SHA-256: the file changed after it "
                "was saved (a flipped byte, a partial copy); restore it from a good copy"
            )
            raise CheckpointError(msg)
    return state


def _check_against(model: torch.nn.Module, state: Mapping[str, Any], where: str) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        msg = (
            f"{where}: the checkpoint does not fit {type(model).__name__}: missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}; prepare the same architecture with the "
            "same mapping and backend before loading (and the same graph mode: explain's "
            "'mode:' line; a mode can follow the host, e.g. x86's attention_bf16 the CPU's "
            "bfloat16 arithmetic unless FXQUANT_X86_BF16 pins it)"
        )
        raise CheckpointError(msg)
    for key, value in state.items():
        target = expected[key]
        if not isinstance(value, torch.Tensor) or not isinstance(target, torch.Tensor):
            continue
        # observers' per-channel statistics start empty and take any length
        if target.numel() and tuple(value.shape) != tuple(target.shape):
            msg = (
                f"{where}: {key!r} has shape {tuple(value.shape)}, the model expects "
                f"{tuple(target.shape)}"
            )
            raise CheckpointError(msg)
        if value.dtype.is_floating_point != target.dtype.is_floating_point:
            msg = f"{where}: {key!r} has dtype {value.dtype}, the model expects {target.dtype}"
            raise CheckpointError(msg)


def load_checkpoint(file: PathOrFile, model: torch.nn.Module | None = None) -> dict[str, Any]:
    """Read a checkpoint of :func:`save_checkpoint`, verified; load it into ``model`` if given.

    Reads with ``weights_only=True`` (no code runs from the file), checks every
    entry's SHA-256, the quantization parameters and, with ``model``, that every key
    and shape fits before ``model.load_state_dict`` (so a refused file leaves
    ``model`` untouched).

    Raises:
        CheckpointError: naming the file and what was expected: a truncated or corrupt
            file, a changed byte, a non-finite or non-positive scale, a key or shape
            that does not fit ``model``.

    Example:
        >>> import io
        >>> buffer = io.BytesIO()
        >>> save_checkpoint(torch.nn.Linear(2, 2), buffer)
        >>> corrupt = io.BytesIO(buffer.getvalue()[:-100])
        >>> load_checkpoint(corrupt)
        Traceback (most recent call last):
        ...
        fxquant.errors.CheckpointError: load_checkpoint(<BytesIO>): the file is not a ...
    """
    where = f"load_checkpoint({_name(file)})"
    state = _verified_state(_read(file, where), where)
    _check_qparams(state, where)
    if model is not None:
        _check_against(model, state, where)
        model.load_state_dict(state)
    return state
