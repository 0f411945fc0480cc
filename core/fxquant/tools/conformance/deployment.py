"""Does a backend's deployment keep the deployed-object protocol (``fxquant.registry.Deployed``)?

One small model (the kit's ``linear`` case), quantized and converted with
``convert_fx``, goes through every member of the protocol; a row per step:

    deploy        Deployment.deploy takes convert_fx's model
    protocol      the result has __call__, report, explain, save and load
    call          its output is within one output step of the reference model's
    explain       deployed.explain() and fxquant.explain(deployed) give its report
    save_load     save(path) in a fresh folder, type(deployed).load(path): the same
                  outputs (within one step) and the same report

A step that fails skips the steps after it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fxquant.flow import explain
from fxquant.registry import Deployed, get_deployment
from fxquant.tools import testing
from fxquant.tools.conformance.results import CheckResult, CheckStatus

__all__ = ["PROTOCOL_MEMBERS", "protocol_rows"]

PROTOCOL_MEMBERS = ("__call__", "report", "explain", "save", "load")
"""What every deployed object has (``fxquant.registry.Deployed``)."""

_CASE = "linear"
_SIZES: testing.Sizes = (2, 4, 6, 8)


class _StepFailed(Exception):
    """A protocol step failed; the words go in its row."""


@dataclass
class _Run:
    """What the steps share: the deployed model, the reference and the bound."""

    backend: str
    deployed: Any = None
    reference: Any = None
    inputs: tuple[Any, ...] = ()
    bound: float = 0.0


def _deploy(run: _Run) -> str:
    deployment = get_deployment(run.backend)
    assert deployment is not None  # protocol_rows asks only backends with one
    case = next(c for c in testing.LOWERING_CASES if c.name == _CASE)
    converted, run.reference, inputs = testing.quantize_case(run.backend, case, _SIZES)
    run.inputs = tuple(inputs)
    run.deployed = deployment.deploy(converted, run.inputs)
    with torch.no_grad():
        expected = run.reference(*run.inputs)
    run.bound = testing.tolerance(case, expected, testing.output_scale(run.reference))
    return f"{deployment.name}: {type(run.deployed).__name__}"


def _protocol(run: _Run) -> str:
    missing = [name for name in PROTOCOL_MEMBERS if not hasattr(run.deployed, name)]
    if missing or not isinstance(run.deployed, Deployed):
        msg = f"{type(run.deployed).__name__} lacks {', '.join(missing)}: subclass DeployedModel"
        raise _StepFailed(msg)
    return ""


def _difference(run: _Run, model: Any, against: Any) -> float:
    with torch.no_grad():
        return float((model(*run.inputs) - against(*run.inputs)).abs().max())


def _call(run: _Run) -> str:
    difference = _difference(run, run.deployed, run.reference)
    if difference > run.bound:
        msg = f"{difference:.3g} off the reference model, over one step ({run.bound:.3g})"
        raise _StepFailed(msg)
    return f"within one step ({difference:.3g})"


def _explain(run: _Run) -> str:
    table = run.deployed.report.table()
    own, through = run.deployed.explain(show=False), explain(run.deployed, show=False)
    if own.table() != table or through.table() != table:
        msg = "explain() or fxquant.explain(deployed) does not give deployed.report"
        raise _StepFailed(msg)
    return f"{len(own.entries())} nodes"


def _save_load(run: _Run) -> str:
    with tempfile.TemporaryDirectory() as folder:
        suffix = getattr(type(run.deployed), "suffix", "")  # DeployedModel's: ".pte"...
        path = Path(run.deployed.save(Path(folder) / f"model{suffix}"))
        loaded = type(run.deployed).load(path)
        difference = _difference(run, loaded, run.deployed)
        if difference > run.bound:
            msg = f"the loaded model is {difference:.3g} off the deployed one"
            raise _StepFailed(msg)
        if loaded.report.table() != run.deployed.report.table():
            msg = "the loaded model's report differs from the deployed one's"
            raise _StepFailed(msg)
        return f"{type(loaded).__name__}, within {difference:.3g}"


_STEPS: tuple[tuple[str, Callable[[_Run], str]], ...] = (
    ("deploy", _deploy),
    ("protocol", _protocol),
    ("call", _call),
    ("explain", _explain),
    ("save_load", _save_load),
)


def protocol_rows(backend: str) -> list[CheckResult]:
    """A row per step of the protocol for ``backend``'s deployment (see the module).

    Example:
        >>> protocol_rows("reference")[0].reason
        'backend reference has no deployment (fxquant_deployment)'
    """
    if get_deployment(backend) is None:
        words = f"backend {backend} has no deployment (fxquant_deployment)"
        return [CheckResult(_CASE, "deployment[*]", CheckStatus.SKIP, words)]
    run, rows, failed = _Run(backend), [], ""
    for name, step in _STEPS:
        check = f"deployment[{name}]"
        if failed:
            rows.append(CheckResult(_CASE, check, CheckStatus.SKIP, f"after {failed} failed"))
            continue
        try:
            rows.append(CheckResult(_CASE, check, CheckStatus.PASS, step(run)))
        except Exception as error:  # a crash is a failed step, reported in its row
            words = str(error) if isinstance(error, _StepFailed) else f"{type(error).__name__}: "
            words += "" if isinstance(error, _StepFailed) else str(error)
            rows.append(CheckResult(_CASE, check, CheckStatus.FAIL, words.splitlines()[0]))
            failed = name
    return rows
