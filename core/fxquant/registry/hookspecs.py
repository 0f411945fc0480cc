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

This module holds the specifications only. The records hooks return and
kernels receive live in ``fxquant.lowering`` (``LoweringRule``,
``LoweringMatch``, ``QParams``, ``Quantize``, ``Dequantize``, ``Declined``) and
``fxquant.registry.answers`` (``Override``, ``Deployment``, ``Deployed``,
``GraphMode``);
they are importable from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

# re-exported: plugins written against this module import the records from here
from fxquant.lowering import Declined, Dequantize, LoweringMatch, LoweringRule, QParams, Quantize
from fxquant.registry.answers import Deployed, Deployment, GraphMode, Override

if TYPE_CHECKING:
    from torch import fx

    from fxquant.config.backend import BackendPatternConfig
    from fxquant.config.qconfig_mapping import QConfigMapping

__all__ = [
    "PLUGIN_API_VERSIONS",
    "PROJECT_NAME",
    "Declined",
    "Deployed",
    "Deployment",
    "Dequantize",
    "GraphMode",
    "LoweringMatch",
    "LoweringRule",
    "Override",
    "QParams",
    "Quantize",
    "fxquant_default_qconfig_mapping",
    "fxquant_deployment",
    "fxquant_graph_mode",
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
    ``dequantize -> float op -> quantize`` pattern with the kernel. The rules are
    those of the backend the flow's entry point resolved: ``prepare_fx`` records
    them on the prepared model, so a plugin registered after prepare lowers the
    models prepared after it.

    :param backend: the backend being assembled.

    Return a list of ``LoweringRule(pattern, build, name)``. ``None`` means
    "no kernels": the converted model stays a reference model for those
    patterns. A pattern names the ops as they are in the reference model:
    ``fxquant.nn.reference.Linear``, not ``torch.nn.Linear`` (convert swaps
    it); a rule whose pattern can never occur there is refused with a
    ``PluginError`` that says what to write. ``build`` receives a
    ``LoweringMatch`` (the matched nodes and modules, the ``QParams`` of each
    input and of the output) and returns the kernel, which takes and returns
    integer tensors, or ``Declined("why")`` to leave that place unlowered.

    Merge rule: as for ``fxquant_pattern_configs``, one rule per pattern; a
    later plugin replaces an earlier rule only with ``Override(rule)``.

    Example::

        @fxquant.hookimpl
        def fxquant_lowering_kernels(backend):
            if backend != "mybackend":
                return None
            linear = fxquant.nn.reference.Linear  # what the reference model holds
            return [LoweringRule(linear, build=build_qlinear, name="qlinear")]
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
    exports the model returned by ``convert_fx`` for ``backend`` (a backend
    may accept ``convert_to_reference_fx``'s too) and returns an object of the
    deployed-object protocol, ``Deployed``:

    - ``deployed(*inputs)``: runs it in the target runtime;
    - ``deployed.report``: per node of the converted model, taken by the
      target (``lowered``) or why not; ``deployed.explain()`` and
      ``fxquant.explain(deployed)`` print it;
    - ``deployed.save(path)``: the target's artifact at ``path`` (``.pt2``,
      ``.pte``, ``.onnx``...) and the report at ``PATH.fxquant.json``; at any
      batch size of the example inputs, or an error that names the fix;
    - ``type(deployed).load(path)`` (a classmethod): reads back what ``save``
      wrote, an object of the same protocol with the same outputs and report.

    Subclass ``fxquant.flow.deployed.DeployedModel``: it gives ``explain`` and
    the report file, so a plugin writes ``__call__``, ``save_artifact`` and
    ``load_artifact``. ``fxquant check NAME`` checks the protocol (deploy a
    small model, call it, explain it, save, load, the same outputs).
    ``None`` means "runs in PyTorch": ``convert_fx``'s model is the deployed one.

    Merge rule: one plugin answers; a second answer is a
    ``PluginConflictError`` unless it is wrapped in ``Override(deployment)``.

    Example::

        @fxquant.hookimpl
        def fxquant_deployment(backend):
            if backend != "mybackend":
                return None
            return Deployment("my runtime", deploy=compile_and_load)

        class MyProgram(DeployedModel):  # what compile_and_load returns
            def __call__(self, *inputs): ...
            def save_artifact(self, path, **options): ...  # the runtime's file; {} or extras
            @classmethod
            def load_artifact(cls, path, report, extras): ...  # that file back
    """


@hookspec
def fxquant_graph_mode(
    backend: str, model: fx.GraphModule, qconfig_mapping: QConfigMapping, is_qat: bool
) -> GraphMode | Override | None:
    """Pick a way to quantize this graph; prepare merges it under the user's own entries.

    Some graphs need another mapping than the backend's default to stay
    accurate: a transformer's residual stream, say, which a CNN's settings
    quantize badly. This hook lets the backend recognize such a graph and say
    how it quantizes it; what the user's mapping says still wins.

    Called by ``prepare_fx`` and ``prepare_qat_fx`` on every call, whatever
    mapping the user passed, once the model is traced and before it is fused
    (fusion reads the mapping, so the mode's parts must decide it) and
    observed. Only the plugins registered for ``backend`` are asked (the
    backend named by ``backend_config.name``).

    :param backend: the backend of the ``backend_config`` given to prepare.
    :param model: the traced ``torch.fx.GraphModule`` (modules as the user
        wrote them: a Linear and its ReLU are two nodes); read it, do not
        change it.
    :param qconfig_mapping: the mapping the user passed; do not change it.
    :param is_qat: True under ``prepare_qat_fx``.

    Return a ``GraphMode(name, reason, qconfig_mapping, equalization)``:
    ``qconfig_mapping`` is how the mode quantizes the graph starting from the
    backend's default mapping (the default plus the mode's changes), and
    ``equalization`` an ``_equalization_config`` or ``None`` (``prepare_qat_fx``
    takes none: return ``None`` there). ``None`` means "the default mapping
    suits this graph". Anything else, or a raise, is a ``PluginError`` naming
    the plugin.

    How prepare applies it (``fxquant.flow.graph_mode``): the mode's *parts*
    are the entries of its ``qconfig_mapping`` that differ from
    ``get_default_qconfig_mapping(backend, is_qat)`` (per level and key: the
    global qconfig, an object type, a module name or regex, a call order).
    Each part is merged into the user's mapping, a three-way merge whose base
    is the default:

    - the user's entry for that key is the default's (or neither has one): the
      part applies; the mode fills what the user did not say;
    - the user's entry is the part's: agreed;
    - the user's entry is their own: it stays, and the part is not applied.

    No decision rests on the whole mapping being the default. The mapping
    resolves the most specific level per node, so the user's module-name
    entries (``set_module_name("pooler", None)``) win over the mode's
    object-type parts for the nodes they cover: write a mode's parts as object
    types, and the user keeps every decision they wrote. ``equalization``
    merges the same way into the user's ``_equalization_config`` (its base: no
    entry). A ``fxquant.errors.GraphModeWarning`` names the mode, the parts
    applied and those not applied, when a part was not applied or when the
    user's global qconfig is not the default's (a mapping of their own, which
    the mode's other parts still change); the default mapping with entries
    added gets none. ``fxquant.explain`` prints ``mode: NAME (REASON)``, the
    user's entries that win, and the parts not applied; ``flow_state(model)``
    keeps the mode (``graph_mode``) and the merged mapping.

    Merge rule: one plugin answers; a second answer for the same graph is a
    ``PluginConflictError`` unless it is wrapped in ``Override(mode)``.

    Example::

        @fxquant.hookimpl
        @fxquant.registry.only_for("mybackend")
        def fxquant_graph_mode(backend, model, qconfig_mapping, is_qat):
            if not any(n.target == "attention" for n in model.graph.nodes):
                return None
            mapping = my_default_mapping(is_qat).set_object_type(operator.add, None)
            return GraphMode("transformer", "attention found", mapping)
    """
