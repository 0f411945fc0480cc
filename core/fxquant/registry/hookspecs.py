"""The fxquant plugin specification: the hooks a backend plugin implements.

A plugin is a module (or any object) whose functions are marked with
``fxquant.hookimpl`` and named after the hooks below. It is announced by an
entry point in the group ``fxquant.backends`` whose name is the backend it
contributes to::

    [project.entry-points."fxquant.backends"]
    mybackend = "my_package.plugin"

Every hook receives the backend's name, so one module can serve several
backends; a hook with nothing to say for that name returns ``None``.

Merge rule, the same for every hook: the answers of all plugins registered for
a backend are merged in call order (the core's built-in plugins first, then
installed distributions sorted by name, then ``register_plugin`` calls in
order; pluggy's ``tryfirst``/``trylast`` move a plugin to the front or the
back). Two plugins answering for the same pattern (or both returning a default
mapping) is a ``PluginConflictError``, unless the later answer is wrapped in
``Override(...)``, which replaces the earlier one and is shown by
``fxquant show``.

A plugin may declare the plugin-API versions it was written for with a module
attribute ``fxquant_plugin_api = 1`` (an int or a tuple of ints); omitting it
means version 1. ``PLUGIN_API_VERSIONS`` lists the versions this fxquant offers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pluggy

from fxquant.errors import ConfigError, ConfigTypeError

if TYPE_CHECKING:
    import torch
    from torch import fx, nn

    from fxquant.config.backend import BackendPatternConfig
    from fxquant.config.qconfig_mapping import QConfigMapping
    from fxquant.flow.report import Report

__all__ = [
    "PLUGIN_API_VERSIONS",
    "PROJECT_NAME",
    "Deployed",
    "Deployment",
    "Dequantize",
    "LoweringMatch",
    "LoweringRule",
    "Override",
    "QParams",
    "Quantize",
    "fxquant_default_qconfig_mapping",
    "fxquant_deployment",
    "fxquant_lowering_kernels",
    "fxquant_pattern_configs",
    "hookimpl",
    "hookspec",
]

PROJECT_NAME = "fxquant"
# Versions of the hook API this fxquant can call; a plugin names the ones it targets.
PLUGIN_API_VERSIONS: tuple[int, ...] = (1,)

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@dataclass(frozen=True, slots=True)
class LoweringRule:
    """How a backend lowers one reference pattern to its own kernel.

    ``convert_fx`` matches ``pattern`` in the reference model (the float op
    between ``dequantize`` and ``quantize`` steps: a function such as
    ``torch.add``, a method name, or a module class as it is in the reference
    model, e.g. ``fxquant.nn.reference.Linear`` or ``fxquant.nn.intrinsic.
    LinearReLU``), only where every matched node was quantized at prepare, and
    calls ``build(match)`` with a ``LoweringMatch``. ``build`` returns the
    kernel (an ``nn.Module``, or any callable) or ``None`` to decline, which
    leaves that place in reference form (reported as ``no_lowering_kernel``).

    The kernel is called as ``kernel(*args)``, one argument per entry of
    ``match.inputs``: the integer tensor for a statically quantized input,
    the float tensor for a dynamically quantized one, the value itself
    otherwise. It returns the integer tensor when ``match.output`` is set
    (the output ``quantize`` step is removed), else the float result.

    Epilogues: once every rule has run, a kernel module that defines
    ``absorb(step) -> bool`` is offered, one at a time, what alone reads its
    output: a module called on it alone (a clamp kernel, a float ``nn.GELU``),
    ``Dequantize(qparams)`` when only dequantize steps read it, or
    ``Quantize(qparams)`` when one quantize step does. ``True`` means the
    kernel now computes that step too (returning floats after a
    ``Dequantize``, integers after a ``Quantize``); the step is removed and
    the next one offered. Likewise a kernel module with ``absorb_input(step)``
    is offered ``Quantize(qparams)`` when a quantize step alone feeds its
    first argument from float values; ``True`` means the kernel takes the
    floats and quantizes them itself. Results must stay within one output
    step of the reference. An ``nn.Identity`` kernel is removed without asking.

    Args:
        pattern: the op(s), in the simple pattern format of
            ``BackendPatternConfig`` (or the reversed nested format when
            ``complex_format`` is True).
        build: ``build(match: LoweringMatch)`` -> kernel, or ``None``.
        name: a short name shown by ``fxquant show`` (e.g. ``"qlinear"``).
        complex_format: whether ``pattern`` is in the reversed nested format.

    Raises:
        ConfigTypeError: when ``build`` is not callable or ``name`` not a str.
        ConfigError: when ``name`` is empty or ``pattern`` is not a valid pattern.

    Example:
        >>> import torch
        >>> rule = LoweringRule(torch.nn.Linear, build=lambda match: match, name="qlinear")
        >>> rule.name
        'qlinear'
    """

    pattern: Any
    build: Callable[..., Any]
    name: str
    complex_format: bool = False

    def __post_init__(self) -> None:
        if self.pattern is None:
            msg = f"LoweringRule {self.name!r} needs a pattern, got None; pass e.g. torch.nn.Linear"
            raise ConfigError(msg)
        if not callable(self.build):
            msg = (
                f"LoweringRule build must be callable, got {self.build!r} of type "
                f"{type(self.build).__name__}; pass a function that builds the kernel"
            )
            raise ConfigTypeError(msg)
        if not isinstance(self.name, str):
            msg = f"LoweringRule name must be a str, got {self.name!r}"
            raise ConfigTypeError(msg)
        if not self.name:
            msg = "LoweringRule name must not be empty; give the kernel a short name"
            raise ConfigError(msg)
        _ = self.key  # validates the pattern now, not when the flow first needs it

    @property
    def key(self) -> Hashable:
        """The pattern in the reversed nested format: the key for matching and conflicts."""
        # imported here: `import fxquant.registry` must not need the config package
        from fxquant.config.pattern import simple_to_complex, validate_complex

        key: Hashable = (
            validate_complex(self.pattern)
            if self.complex_format
            else simple_to_complex(self.pattern)
        )
        return key


@dataclass(frozen=True, slots=True)
class QParams:
    """How one tensor at the boundary of a lowered pattern is quantized.

    Args:
        dtype: the integer dtype: ``torch.uint8``, ``torch.int8`` or ``torch.int32``.
        quant_min: smallest integer used.
        quant_max: largest integer used.
        scale: a float (per tensor) or a 1-d float tensor (per channel);
            ``None`` when ``is_dynamic``.
        zero_point: an int (per tensor) or a 1-d integer tensor; ``None``
            when ``is_dynamic``.
        axis: the channel axis for per-channel qparams, else ``None``.
        is_dynamic: qparams are chosen from each input at run time
            (``fxquant.qdq.choose_qparams_per_tensor``); the kernel then
            receives the float tensor.

    Example:
        >>> import torch
        >>> QParams(torch.uint8, 0, 255, scale=0.02, zero_point=128).is_per_channel
        False
    """

    dtype: torch.dtype
    quant_min: int
    quant_max: int
    scale: float | torch.Tensor | None = None
    zero_point: int | torch.Tensor | None = None
    axis: int | None = None
    is_dynamic: bool = False

    @property
    def is_per_channel(self) -> bool:
        """True when ``scale`` and ``zero_point`` hold one value per channel of ``axis``."""
        return self.axis is not None


@dataclass(frozen=True, slots=True)
class Dequantize:
    """The dequantize step after a kernel, offered to its ``absorb`` (see ``LoweringRule``).

    Example:
        >>> import torch
        >>> Dequantize(QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)).qparams.scale
        0.1
    """

    qparams: QParams


@dataclass(frozen=True, slots=True)
class Quantize:
    """A quantize step after a float-output kernel, offered to its ``absorb``.

    Example:
        >>> import torch
        >>> Quantize(QParams(torch.uint8, 0, 255, scale=0.1, zero_point=3)).qparams.zero_point
        3
    """

    qparams: QParams


@dataclass(frozen=True, slots=True)
class LoweringMatch:
    """What ``LoweringRule.build`` receives: one place in a reference model to lower.

    Args:
        rule: the rule that matched.
        backend: the backend being lowered to.
        nodes: the matched float nodes (``torch.fx.Node``) in graph order; the
            last is the anchor. Read constant arguments (``dim``, ``alpha``...)
            from ``node.args``/``node.kwargs``.
        modules: for each node, its module when it is a ``call_module`` node
            (a reference module such as ``fxquant.nn.reference.Linear``, which
            has ``get_quantized_weight()`` and ``get_weight_qparams()``), else
            ``None``.
        inputs: one entry per kernel argument, in order: the arguments of the
            matched nodes that are graph values from outside the match
            (positional then keyword, nodes in graph order). ``QParams`` for a
            quantized input, ``None`` for one passed as is (a float bias...).
        output: the qparams of the output ``quantize`` step, or ``None`` when
            the pattern's output stays float (dynamic and weight-only patterns).

    Copy what the kernel needs out of the match: keeping the match itself
    (it holds graph nodes) would keep the whole reference model alive.

    Example:
        >>> import torch
        >>> rule = LoweringRule(torch.add, build=lambda match: None, name="qadd")
        >>> uint8 = QParams(torch.uint8, 0, 255, scale=0.1, zero_point=0)
        >>> match = LoweringMatch(rule, "mine", (), (), (uint8, uint8), uint8)
        >>> match.output.scale
        0.1
    """

    rule: LoweringRule
    backend: str
    nodes: tuple[fx.Node, ...]
    modules: tuple[nn.Module | None, ...]
    inputs: tuple[QParams | None, ...]
    output: QParams | None

    @property
    def anchor(self) -> fx.Node:
        """The last matched node (its result is the pattern's result)."""
        return self.nodes[-1]

    @property
    def module(self) -> nn.Module | None:
        """The first module among the matched nodes (the weighted one), or ``None``."""
        return next((m for m in self.modules if m is not None), None)


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
        >>> import torch
        >>> Override(LoweringRule(torch.nn.Linear, build=print, name="fast")).item.name
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

    Called with the model's positional inputs, it returns what the model
    returns, as torch tensors. ``report`` says, per node of the converted
    model, what the target took (status ``lowered``) and, for every quantized
    node it did not take, why (a reason code and its words), in the form
    ``fxquant.explain`` prints.

    Example:
        >>> from fxquant.flow.report import Report
        >>> class Echo:
        ...     report = Report()
        ...     def __call__(self, *inputs):
        ...         return inputs[0]
        >>> isinstance(Echo(), Deployed)
        True
    """

    @property
    def report(self) -> Report:
        """Per node of the converted model: taken by the target, or why not."""

    def __call__(self, *inputs: Any) -> Any:
        """Run the deployed model on the model's positional inputs."""


@dataclass(frozen=True, slots=True)
class Deployment:
    """How a backend runs converted models outside PyTorch eager: a toolchain and its runtime.

    Args:
        name: what runs the model, for people (``"ExecuTorch XNNPACK"``).
        deploy: ``deploy(model, example_inputs) -> Deployed``: export the
            converted model (``convert_fx`` with this backend) for the target
            and load it in the target's runtime in this process.

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


# --- hook specifications: the docstrings are the plugin author's reference ----------------------


@hookspec
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig | Override] | None:
    """Return the patterns this plugin supports on ``backend``.

    Called once per backend, the first time ``get_backend_config(backend)``
    (or ``fxquant show``) needs it, and again after ``refresh()`` or a
    ``register_plugin`` for that backend.

    :param backend: the backend being assembled (the entry-point name).

    Return a list of ``BackendPatternConfig``, each with its dtype configs,
    observation type and, when needed, fuser, QAT and reference modules.
    ``None`` means "nothing for this backend".

    Merge rule: the lists of all plugins of the backend are joined in call
    order. A pattern configured by two plugins is a ``PluginConflictError``
    naming both distributions, unless the later one returns it wrapped in
    ``Override(config)``.

    Example::

        @fxquant.hookimpl
        def fxquant_pattern_configs(backend):
            if backend != "mybackend":
                return None
            return [BackendPatternConfig(torch.nn.Linear).add_dtype_config(int8)]
    """


@hookspec
def fxquant_lowering_kernels(backend: str) -> list[LoweringRule | Override] | None:
    """Return how to lower reference patterns to this plugin's kernels on ``backend``.

    Called when the backend is assembled, like ``fxquant_pattern_configs``;
    ``convert_fx`` uses the rules to replace each matched
    ``dequantize -> float op -> quantize`` pattern with the kernel.

    :param backend: the backend being assembled.

    Return a list of ``LoweringRule(pattern, build, name)``. ``None`` means
    "no kernels": the converted model stays a reference model for those
    patterns. ``build`` receives a ``LoweringMatch`` (the matched nodes and
    modules, the ``QParams`` of each input and of the output) and returns the
    kernel, which takes and returns integer tensors.

    Merge rule: as for ``fxquant_pattern_configs``, one rule per pattern; a
    later plugin replaces an earlier rule only with ``Override(rule)``.

    Example::

        @fxquant.hookimpl
        def fxquant_lowering_kernels(backend):
            if backend != "mybackend":
                return None
            return [LoweringRule(torch.nn.Linear, build=build_qlinear, name="qlinear")]
    """


@hookspec
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | Override | None:
    """Return the ``QConfigMapping`` that ``get_default_qconfig_mapping`` gives for ``backend``.

    Called by ``get_default_qconfig_mapping(backend, is_qat)`` on every call
    (and by ``fxquant show``); return a new mapping each time, since callers
    may change the one they get.

    :param backend: the backend asked for.
    :param is_qat: True for quantization-aware training (fake-quantize
        modules), False for post-training quantization (observers).

    Return a mapping whose qconfigs the backend's dtype configs accept.
    ``None`` means "no opinion"; if every plugin says ``None``,
    ``get_default_qconfig_mapping`` raises ``MissingDefaultQConfigError``.

    Merge rule: one plugin answers; a second answer is a
    ``PluginConflictError`` unless it is wrapped in ``Override(mapping)``.

    Example::

        @fxquant.hookimpl
        def fxquant_default_qconfig_mapping(backend, is_qat):
            if backend != "mybackend":
                return None
            return QConfigMapping().set_global(my_qconfig)
    """


@hookspec
def fxquant_deployment(backend: str) -> Deployment | Override | None:
    """Return how ``backend`` runs converted models outside PyTorch eager.

    For backends whose target is a toolchain and runtime of its own (an
    ExecuTorch program, an ONNX model for TensorRT) rather than kernels called
    from PyTorch: ``fxquant demo`` deploys the converted model with it and
    measures the deployed model, and ``fxquant show`` names it. Called when the
    backend is assembled.

    :param backend: the backend being assembled.

    Return a ``Deployment(name, deploy)``; ``deploy(model, example_inputs)``
    exports the model returned by ``convert_fx`` and returns a ``Deployed``
    callable that runs it in the target runtime, with a ``report`` of what the
    target took. ``None`` means "runs in PyTorch": ``convert_fx``'s model is
    the deployed one.

    Merge rule: one plugin answers; a second answer is a
    ``PluginConflictError`` unless it is wrapped in ``Override(deployment)``.

    Example::

        @fxquant.hookimpl
        def fxquant_deployment(backend):
            if backend != "mybackend":
                return None
            return Deployment("my runtime", deploy=compile_and_load)
    """
