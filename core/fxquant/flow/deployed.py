"""What a deployment gives back: the deployed-object protocol, implemented once.

:class:`DeployedModel` is the base class of every backend's deployed object
(the protocol is ``fxquant.registry.Deployed``). It gives ``explain`` and the
saving and loading of the report, written next to the target's artifact::

    deployed.save("model.pte")   ->  model.pte              (the plugin's save_artifact)
                                     model.pte.fxquant.json (the report, the plugin's extras)
    Program.load("model.pte")    ->  Program.load_artifact(path, report, extras)

so a plugin writes only what its runtime does: ``__call__``, ``save_artifact``
and the classmethod ``load_artifact``.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from fxquant.errors import ConfigError
from fxquant.flow.report import Report

__all__ = ["REPORT_SUFFIX", "DeployedModel", "report_path"]

REPORT_SUFFIX = ".fxquant.json"
"""What ``save(path)`` appends to ``path``'s name for the report file."""

_FORMAT = 1


def report_path(path: str | Path) -> Path:
    """Where ``save(path)`` writes the report.

    Example:
        >>> report_path("out/model.pte").as_posix()
        'out/model.pte.fxquant.json'
    """
    target = Path(path)
    return target.with_name(target.name + REPORT_SUFFIX)


class DeployedModel(abc.ABC):
    """Base class of a deployed model: ``explain``, ``save`` and ``load`` written once.

    A subclass sets ``self.report`` (the converted model's report, told what
    the target took) and implements ``__call__``, :meth:`save_artifact` and
    :meth:`load_artifact`.

    Example:
        >>> class Echo(DeployedModel):
        ...     def __init__(self, report): self.report = report
        ...     def __call__(self, *inputs): return inputs[0]
        ...     def save_artifact(self, path): path.write_text("echo"); return {"v": 1}
        ...     @classmethod
        ...     def load_artifact(cls, path, report, extras): return cls(report)
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> saved = Echo(Report(notes=["runs nowhere"])).save(f"{folder}/echo.bin")
        >>> Echo.load(saved).report.notes()
        ['runs nowhere']
    """

    report: Report
    suffix: ClassVar[str] = ""
    """The artifact's file suffix (``".pte"``), for tools that pick a file name."""

    @abc.abstractmethod
    def __call__(self, *inputs: Any) -> Any:
        """Run the deployed model on the model's positional inputs."""

    @abc.abstractmethod
    def save_artifact(self, path: Path, **options: Any) -> Mapping[str, Any]:
        """Write the target's artifact at ``path`` (``options``: the backend's own, from
        :meth:`save`); return what :meth:`load_artifact` needs besides it (JSON-able:
        strings, numbers, lists, dicts), stored in the report file."""

    @classmethod
    @abc.abstractmethod
    def load_artifact(cls, path: Path, report: Report, extras: Mapping[str, Any]) -> DeployedModel:
        """The deployed model of the artifact at ``path``, with its saved report and extras."""

    def explain(self, *, show: bool = True) -> Report:
        """The report; printed as a table unless ``show=False`` (as ``fxquant.explain``)."""
        if show:
            print(self.report.table())  # printing the table is the point, as fxquant.explain
        return self.report

    def save(self, path: str | Path, **options: Any) -> Path:
        """Write the artifact at ``path`` and the report at ``PATH.fxquant.json``; return ``path``.

        ``options`` are the backend's own (x86: ``dynamic_batch``), passed to
        :meth:`save_artifact`.

        Raises:
            ConfigError: ``path`` is a folder.
        """
        target = Path(path)
        if target.is_dir():
            msg = f"save(path) writes a file, got the folder {str(target)!r}; name a file in it"
            raise ConfigError(msg)
        extras = dict(self.save_artifact(target, **options))
        plain = {
            "format": _FORMAT,
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "report": self.report.to_dict(),
            "extras": extras,
        }
        report_path(target).write_text(json.dumps(plain, indent=1, default=repr))
        return target

    @classmethod
    def load(cls, path: str | Path) -> DeployedModel:
        """Read back what :meth:`save` wrote at ``path`` (the report too, when its file is there).

        Raises:
            FileNotFoundError: nothing at ``path``.
        """
        target = Path(path)
        if not target.is_file():
            msg = f"{cls.__name__}.load: no file at {str(target)!r}; save(path) writes one"
            raise FileNotFoundError(msg)
        sidecar = report_path(target)
        if not sidecar.is_file():
            note = f"no report: {sidecar.name} is not next to {target.name}"
            return cls.load_artifact(target, Report(notes=[note]), {})
        plain = json.loads(sidecar.read_text())
        return cls.load_artifact(target, Report.from_dict(plain["report"]), plain["extras"])
