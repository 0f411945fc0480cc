"""The invariant matrix's cells: model x backend x user move, drawn by a seeded sampler (#30).

A cell is one model of the zoo (``tests/zoo/runner.py``), one installed backend and one
user move; each cell is checked on every output form the backend has: ``convert_fx``,
``convert_to_reference_fx`` and the backend's deployment (x86's compiled deployment only
in the full matrix: inductor's compile takes minutes). The moves:

- ``default``: the backend's default mapping and config;
- ``module_none``: the default with one module (the last Linear or Conv) set to ``None``;
- ``object_type``: the default with Linear (or Conv2d) given per-tensor weights;
- ``no_backend_config``: the default mapping, no ``backend_config`` (torch.ao's script);
- ``strict``: ``strict=True`` in prepare and convert;
- ``qat``: ``prepare_qat_fx``, two training steps (``checks.train``: torchvision's QAT
  reference recipe, BatchNorm statistics frozen), then convert;
- ``state_dict``: the converted model's state_dict saved and loaded into a freshly
  prepared and converted model;
- ``threads``: three threads quantizing at once, against the serial result.

:func:`sample` draws cells with a seed (the fast slice of ``nox -s tests``); :func:`every`
lists them all (``nox -s matrix``). :func:`known_break` names a finding the matrix made and
left open for a cell, so the test marks it ``xfail(strict=True)``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = [
    "FAST_MODELS",
    "FINDINGS",
    "MOVES",
    "Cell",
    "every",
    "known_break",
    "sample",
]

MOVES = (
    "default",
    "module_none",
    "object_type",
    "no_backend_config",
    "strict",
    "qat",
    "state_dict",
    "threads",
)

FAST_MODELS = (
    "resnet",
    "mobilenet_v3",
    "shufflenet_v2",
    "convnext",
    "vit",
    "nn_transformer_encoder",
    "lstm_tagger",
    "bert",
    "gpt2",
    "distilbert",
    "tv_mobilenet_v2",
    "tv_mobilenet_v3_small",
    "tv_squeezenet",
    "tv_efficientnet_b0",
    "tv_vit",
    "tv_convnext",
)
"""Models small enough for the fast slice: a cell in a second or two."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One model, one backend, one user move; ``compiled``: check x86's compiled deployment."""

    model: str
    backend: str
    move: str
    compiled: bool = False

    def __post_init__(self) -> None:
        if self.move not in MOVES:
            msg = f"move={self.move!r}: expected one of {', '.join(MOVES)}"
            raise ValueError(msg)

    @property
    def id(self) -> str:
        """The pytest id and the table's row key: ``resnet-x86-default``."""
        return f"{self.model}-{self.backend}-{self.move}" + ("-compiled" if self.compiled else "")


def every(models: list[str], backends: list[str], *, compiled: bool = True) -> list[Cell]:
    """Every cell of ``models`` x ``backends`` x :data:`MOVES`; the compiled x86 deployment
    checked on the default move (the one users deploy), where ``compiled``."""
    return [
        Cell(model, backend, move, compiled and backend == "x86" and move == "default")
        for model in models
        for backend in backends
        for move in MOVES
    ]


def sample(models: list[str], backends: list[str], count: int, seed: int) -> list[Cell]:
    """``count`` cells drawn without replacement, every move at least once where count allows.

    Example:
        >>> [c.id for c in sample(["resnet"], ["x86"], 2, seed=0)]
        ['resnet-x86-default', 'resnet-x86-module_none']
    """
    rng = random.Random(seed)
    pool = every(models, backends, compiled=False)
    rng.shuffle(pool)
    chosen: list[Cell] = []
    for move in MOVES:  # one of each move first, then the rest at random
        chosen.extend([c for c in pool if c.move == move][:1])
    chosen.extend(c for c in pool if c not in chosen)
    return sorted(chosen[:count], key=lambda c: (c.model, c.backend, MOVES.index(c.move)))


def known_break(cell: Cell) -> str | None:
    """Why this cell is known to fail (a finding the matrix made and left open), or None."""
    return FINDINGS.get(cell.id)


FINDINGS: dict[str, str] = {}
"""Cells the matrix found failing for reasons outside issue 30's breaks, not fixed yet."""
