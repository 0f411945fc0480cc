"""What a hook answers besides config classes and lowering rules: overrides and deployments.

    Override     wraps an answer that deliberately replaces another plugin's answer
    Deployment   how a backend runs converted models outside PyTorch eager (``fxquant_deployment``)
    Deployed     what ``Deployment.deploy`` returns: call, report, explain, save, load
    GraphMode    a mapping a backend picks for a graph's shape (``fxquant_graph_mode``)
    only_for     a hook implementation that answers for one backend only

The hook specifications themselves are in ``fxquant.registry.hookspecs``, which
re-exports these records for plugins written against it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from fxquant.errors import ConfigError, ConfigTypeError, wrong_type

if TYPE_CHECKING:
    from pathlib import Path

    from torch import fx

    from fxquant.config.qconfig_mapping import QConfigMapping
    from fxquant.flow.report import Report

__all__ = ["Deployed", "Deployment", "GraphMode", "Override", "only_for"]


@dataclass(frozen=True, slots=True)
class Override:
    """Marks a hook answer that deliberately replaces another plugin's answer.

    Wrap a ``BackendPatternConfig``, a ``LoweringRule`` or a ``QConfigMapping``
    in ``Override`` to say "this replaces what an earlier plugin gave for the
    same pattern". Without it, two plugins answering for one pattern is a
    ``PluginConflictError``. An ``Override`` with nothing to replace is fine.

    Args:
        item: the pattern config, lowering rule or qconfig mapping.
        reason: an optional note shown by ``fxquant show``.

    Example:
        >>> from fxquant.lowering import LoweringRule
        >>> from fxquant.nn import reference
        >>> Override(LoweringRule(reference.Linear, build=print, name="fast")).item.name
        'fast'
    """

    item: Any
    reason: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.item, Override):
            msg = f"Override wraps another Override {self.item!r}; wrap the item once"
            raise ConfigTypeError(msg)


@runtime_checkable
class Deployed(Protocol):
    """A converted model running outside PyTorch eager, as ``Deployment.deploy`` returns it.

    The deployed-object protocol every backend's deployment implements:

    - ``deployed(*inputs)`` runs it on the model's positional inputs and
      returns what the model returns, as torch tensors;
    - ``deployed.report`` says, per node of the converted model, what the
      target took (status ``lowered``) and, for every quantized node it did
      not take, why (a reason code and its words), in ``fxquant.explain``'s
      form; ``deployed.explain()`` (and ``fxquant.explain(deployed)``) prints
      it and returns it;
    - ``deployed.save(path)`` writes the target's artifact (a ``.pt2``
      package, a ``.pte`` program, an ``.onnx`` model) at ``path`` and the
      report next to it (``PATH.fxquant.json``), and returns ``path``;
    - ``type(deployed).load(path)``, a classmethod, reads back what ``save``
      wrote: an object of this protocol computing the same outputs, with the
      same report, that runs without the converted model.

    ``fxquant.flow.deployed.DeployedModel`` implements ``explain`` and the
    report file once; a plugin's deployed class subclasses it.

    Example:
        >>> from fxquant.flow.report import Report
        >>> class Echo:
        ...     report = Report()
        ...     def __call__(self, *inputs):
        ...         return inputs[0]
        ...     def explain(self, *, show=True):
        ...         return self.report
        ...     def save(self, path, **options):
        ...         return path
        ...     @classmethod
        ...     def load(cls, path):
        ...         return cls()
        >>> isinstance(Echo(), Deployed)
        True
    """

    @property
    def report(self) -> Report:
        """Per node of the converted model: taken by the target, or why not."""

    def __call__(self, *inputs: Any) -> Any:
        """Run the deployed model on the model's positional inputs."""

    def explain(self, *, show: bool = True) -> Report:
        """The report; printed as a table unless ``show=False``."""

    def save(self, path: str | Path, **options: Any) -> Path:
        """Write the artifact at ``path`` and the report at ``PATH.fxquant.json``."""

    @classmethod
    def load(cls, path: str | Path) -> Deployed:
        """Read back what :meth:`save` wrote at ``path``."""


@dataclass(frozen=True, slots=True)
class Deployment:
    """How a backend runs converted models outside PyTorch eager: a toolchain and its runtime.

    Args:
        name: what runs the model, for people (``"ExecuTorch XNNPACK"``).
        deploy: ``deploy(model, example_inputs) -> Deployed``: export the
            model ``convert_fx`` returned for this backend (a backend may take
            ``convert_to_reference_fx``'s too) for the target and load it in
            the target's runtime in this process.

    Raises:
        ConfigTypeError: when ``deploy`` is not callable or ``name`` not a str.
        ConfigError: when ``name`` is empty.

    Example:
        >>> Deployment("my runtime", deploy=lambda model, example_inputs: model).name
        'my runtime'
    """

    name: str
    deploy: Callable[[fx.GraphModule, tuple[Any, ...]], Deployed]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            msg = f"Deployment name must be a str, got {self.name!r}"
            raise ConfigTypeError(msg)
        if not self.name:
            msg = "Deployment name must not be empty; name the runtime (e.g. 'onnxruntime')"
            raise ConfigError(msg)
        if not callable(self.deploy):
            msg = (
                f"Deployment deploy must be callable, got {self.deploy!r} of type "
                f"{type(self.deploy).__name__}; pass deploy(model, example_inputs)"
            )
            raise ConfigTypeError(msg)


def _check_words(value: object, field: str, example: str) -> None:
    if not isinstance(value, str):
        raise wrong_type(value, f"GraphMode {field}", "a str")
    if not value.strip():
        msg = f"GraphMode {field} must not be empty; e.g. {example!r}"
        raise ConfigError(msg)


def _check_mapping(value: object, field: str, allow_none: bool) -> None:
    from fxquant.config.qconfig_mapping import QConfigMapping  # why: config imports torch

    if isinstance(value, QConfigMapping) or (allow_none and value is None):
        return
    expected = "a fxquant.QConfigMapping" + (" or None" if allow_none else "")
    raise wrong_type(value, f"GraphMode {field}", expected)


@dataclass(frozen=True, slots=True)
class GraphMode:
    """A way to quantize a graph of one shape that a backend picks, under the user's entries.

    What a ``fxquant_graph_mode`` hook returns when it recognizes the graph
    (a transformer, say): ``prepare_fx`` merges the mode's parts (the entries of
    ``qconfig_mapping`` that differ from the backend's default mapping, and the
    ``equalization``) into the user's mapping where the user said nothing else
    (``fxquant.flow.graph_mode``), and ``fxquant.explain`` prints
    ``mode: NAME (REASON)``.

    Args:
        name: a short name for people and reports (``"transformer"``).
        reason: why the graph gets this mode, in words (``"6 Linear -> add ->
            LayerNorm blocks"``).
        qconfig_mapping: the backend's default mapping with the mode's changes.
        equalization: an ``_equalization_config`` mapping (equalization qconfigs,
            ``fxquant.numerics.EqualizationQConfig``), or ``None`` for none.
            ``prepare_qat_fx`` takes none.

    Raises:
        ConfigTypeError: a field has the wrong type.
        ConfigError: ``name`` or ``reason`` is empty.

    Example:
        >>> from fxquant.config.qconfig_mapping import QConfigMapping
        >>> mode = GraphMode("transformer", "3 residual blocks", QConfigMapping())
        >>> mode.line()
        'mode: transformer (3 residual blocks)'
    """

    name: str
    reason: str
    qconfig_mapping: QConfigMapping = field(repr=False)
    equalization: QConfigMapping | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _check_words(self.name, "name", "transformer")
        _check_words(self.reason, "reason", "6 Linear -> add -> LayerNorm blocks")
        _check_mapping(self.qconfig_mapping, "qconfig_mapping", allow_none=False)
        _check_mapping(self.equalization, "equalization", allow_none=True)

    def line(self) -> str:
        """The line ``fxquant.explain`` prints for this mode."""
        return f"mode: {self.name} ({self.reason})"


_Answer = TypeVar("_Answer")


def only_for(name: str) -> Callable[[Callable[..., _Answer]], Callable[..., _Answer | None]]:
    """Make a hook implementation answer for backend ``name`` only, and ``None`` for others.

    Every hook takes the backend's name first; a plugin's hook that has nothing for another
    backend returns ``None`` (the hookspecs' rule). This decorator says so once, under
    ``@hookimpl``, instead of an ``if backend == ...`` in every hook. pluggy reads the
    wrapped function's signature, so the hook keeps its arguments.

    Args:
        name: the backend the hook answers for.

    Example:
        >>> @only_for("mine")
        ... def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> str:
        ...     return f"{backend} mapping, qat={is_qat}"
        >>> fxquant_default_qconfig_mapping("mine", False)
        'mine mapping, qat=False'
        >>> fxquant_default_qconfig_mapping("x86", False) is None
        True
    """

    def decorate(hook: Callable[..., _Answer]) -> Callable[..., _Answer | None]:
        @functools.wraps(hook)
        def answer(backend: str, *args: Any, **kwargs: Any) -> _Answer | None:
            return hook(backend, *args, **kwargs) if backend == name else None

        return answer

    return decorate
