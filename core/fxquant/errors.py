"""Every exception fxquant raises, in one tree.

    FxquantError
    ├── ConfigError (ValueError)            a config value is out of range or malformed
    │   └── UnsafeNameError                 a JSON name resolves outside the allowed modules
    ├── ConfigTypeError (TypeError)         a config argument has the wrong type
    ├── CheckpointError (ValueError)        a checkpoint file is corrupt, changed or does not fit
    ├── UntraceableModelError (TypeError)   symbolic tracing failed inside the user's model
    ├── ExportError (RuntimeError)          torch.export could not capture a converted model
    ├── KernelCallError (RuntimeError)      a lowered model's node failed on the inputs it got
    ├── UnknownBackendError (KeyError)      no installed plugin provides that backend
    ├── MissingDefaultQConfigError (LookupError)  a backend has no default qconfig mapping
    ├── PluginError (RuntimeError)          a plugin failed to load or answered wrongly
    │   ├── PluginConflictError             two distributions configure one pattern
    │   └── PluginAPIVersionError           a plugin targets a plugin-API version we lack
    └── QuantizationSkipped (RuntimeError)  strict mode: a pattern would be left in float

    PluginWarning (UserWarning)             a broken extension was left out of its backend
    ConfigWarning (UserWarning)             a dict form has keys fxquant does not know (ignored)
    CalibrationWarning (UserWarning)        a result would otherwise be wrong without a word:
                                            non-finite calibration values ignored,
                                            observers never calibrated, a train-mode model
                                            given to prepare_fx

Catching the builtin base (``ValueError``, ``KeyError``...) keeps working for
code written against torch.ao, while ``FxquantError`` catches everything of ours.
"""

from __future__ import annotations

__all__ = [
    "CalibrationWarning",
    "CheckpointError",
    "ConfigError",
    "ConfigTypeError",
    "ConfigWarning",
    "ExportError",
    "FxquantError",
    "GraphModeWarning",
    "KernelCallError",
    "MissingDefaultQConfigError",
    "NativeBackendWarning",
    "PluginAPIVersionError",
    "PluginConflictError",
    "PluginError",
    "PluginWarning",
    "QuantizationSkipped",
    "UnknownBackendError",
    "UnsafeNameError",
    "UntraceableModelError",
    "extension_skipped_warning",
    "wrong_type",
]


class FxquantError(Exception):
    """Base class of every error fxquant raises on purpose."""


class ConfigError(FxquantError, ValueError):
    """A config value is invalid: out of range, unknown key, malformed pattern."""


class ConfigTypeError(FxquantError, TypeError):
    """A config argument has the wrong type."""


_REPR_LIMIT = 120  # a whole mapping's repr runs to thousands of characters


def _short_repr(value: object) -> str:
    text = repr(value)
    if len(text) <= _REPR_LIMIT:
        return text
    return f"{text[:_REPR_LIMIT]}... ({len(text)} characters)"


def wrong_type(value: object, argument: str, expected: str, hint: str = "") -> ConfigTypeError:
    """The error for ``value`` of the wrong type: it names the argument, what it must be, the value.

    The value's repr is cut to a readable length; a torch.ao object (a migrating
    user's ``QConfig``, ``QConfigMapping``...) is named as torch.ao's first, with the
    fxquant class to use instead, and no repr (its type says it all).

    Example:
        >>> print(wrong_type(3, "name", "a str", "; e.g. 'x86'"))
        name must be a str, got 3 of type int; e.g. 'x86'
    """
    ao = torch_ao_hint(value)
    if ao:
        return ConfigTypeError(f"{argument} is {ao}; {argument} must be {expected}")
    msg = (
        f"{argument} must be {expected}, got {_short_repr(value)} of type "
        f"{type(value).__name__}{hint}"
    )
    return ConfigTypeError(msg)


class CheckpointError(FxquantError, ValueError):
    """A checkpoint cannot be trusted: truncated, corrupt, changed since saved, or it does
    not fit the model (``fxquant.tools.checkpoint``). The message names the file."""


class UnsafeNameError(ConfigError):
    """A qualified name in a JSON config resolves outside the modules fxquant trusts."""


class UntraceableModelError(FxquantError, TypeError):
    """The model cannot be captured by symbolic tracing (data-dependent control flow...).

    The message names the module path and the user's source line, and how to
    mark that module non-traceable in ``PrepareCustomConfig``.
    """


class ExportError(FxquantError, RuntimeError):
    """``torch.export`` could not capture a converted model (``fxquant.tools.export``).

    The message names the node of the converted model that failed, its module
    path and the user's source line; torch's exception is chained as ``__cause__``.
    """


class KernelCallError(FxquantError, RuntimeError):
    """A node of a model ``convert_fx`` returned failed when called (a kernel given an input
    of another shape than its weights take...). The message names the node, its module path
    and the shapes it got; the kernel's own error is the ``__cause__``."""


class UnknownBackendError(FxquantError, KeyError):
    """No installed plugin provides the requested backend."""

    def __str__(self) -> str:
        # KeyError repr()s its argument; a sentence should read as a sentence.
        return str(self.args[0]) if self.args else ""


class MissingDefaultQConfigError(FxquantError, LookupError):
    """The backend exists but no plugin provides a default QConfigMapping for it."""


class PluginError(FxquantError, RuntimeError):
    """A plugin failed to load or one of its hooks answered wrongly.

    The message names the distribution, its version, the entry point and the
    hook; the original exception is chained as ``__cause__``.
    """


class PluginConflictError(PluginError):
    """Two distributions configure the same pattern of one backend.

    The later one must declare that it overrides the pattern (see
    ``fxquant.registry.hookspecs``) for its config to win.
    """


class PluginAPIVersionError(PluginError):
    """A plugin targets a plugin-API version this fxquant does not offer."""


class QuantizationSkipped(FxquantError, RuntimeError):
    """Strict mode: at least one pattern would not be quantized.

    ``skipped`` holds one record per node with its reason code and words.
    """

    def __init__(self, message: str, skipped: list[object] | None = None) -> None:
        super().__init__(message)
        self.skipped: list[object] = list(skipped or [])


class PluginWarning(UserWarning):
    """A plugin extending a backend failed; the backend loaded without it."""


def extension_skipped_warning(info: object) -> str:
    """The one warning for a broken extension: who failed, why, and how to switch it off.

    ``info`` is the extension's ``fxquant.registry.loading.PluginInfo``.

    Example:
        >>> from fxquant.registry.loading import PluginInfo
        >>> extension_skipped_warning(
        ...     PluginInfo("x86", "acme-x86", "1.0", "x86 = acme.plugin", reason="ImportError: no")
        ... )[:60]
        "backend 'x86' loaded without acme-x86 1.0 (entry point 'x86 "
    """
    backend = getattr(info, "backend", "?")
    label = getattr(info, "label", repr(info))
    dist = getattr(info, "distribution", "?")
    reason = getattr(info, "reason", "")
    return (
        f"backend {backend!r} loaded without {label}, which extends it and failed: {reason}; "
        f"switch it off with FXQUANT_DISABLE_PLUGINS={dist}, or set FXQUANT_STRICT_PLUGINS=1 "
        "to make a failing extension an error"
    )


class ConfigWarning(UserWarning):
    """A config's dict form has keys fxquant does not know; they were ignored."""


class GraphModeWarning(UserWarning):
    """A backend's graph mode changed a mapping the user wrote, or left parts of itself out.

    ``prepare_fx`` applies a backend's mode for a graph it recognises (tensorrt's
    ``transformer``) under the user's own entries (``fxquant.flow.graph_mode``); this
    warning names the mode, what it applied and what it did not.
    """


class NativeBackendWarning(UserWarning):
    """``backend_config=None`` found no native backend for this CPU installed.

    The flow then uses the built-in ``reference`` backend, whose ``convert_fx``
    lowers nothing; the message names the plugin to install
    (``fxquant.registry.native``).
    """


class CalibrationWarning(UserWarning):
    """fxquant did something about the user's data or model that changes the numbers.

    Raised as a warning, once per cause: an observer left non-finite values (NaN,
    inf) out of its range, ``convert_fx`` kept never-calibrated nodes float, or
    ``prepare_fx`` got a model in training mode. ``warnings.simplefilter("error",
    CalibrationWarning)`` turns them into errors.
    """


_AO = "torch.ao."
# The config classes fxquant keeps under torch.ao's names (fxquant.QConfig...), and the
# call that builds each; this module imports nothing, so they are listed, not looked up.
_OURS = {
    "BackendConfig": "fxquant.get_backend_config('x86')",
    "BackendPatternConfig": "fxquant.get_default_qconfig_mapping('x86')",
    "DTypeConfig": "fxquant.get_default_qconfig_mapping('x86')",
    "QConfig": "fxquant.get_default_qconfig('x86')",
    "QConfigMapping": "fxquant.get_default_qconfig_mapping('x86')",
    "PrepareCustomConfig": "fxquant.PrepareCustomConfig()",
    "ConvertCustomConfig": "fxquant.ConvertCustomConfig()",
    "FuseCustomConfig": "fxquant.FuseCustomConfig()",
}


def torch_ao_hint(value: object) -> str:
    """For a torch.ao object given where fxquant wants its own: what it is and what to pass.

    ``""`` for anything else. fxquant reads torch.ao's classes in patterns and
    models, but not its configs: their observers are torch.ao's, which make the
    deprecated quantized tensors. Recognised by module name, without importing torch.ao.

    Example:
        >>> torch_ao_hint(3)
        ''
    """
    cls = value if isinstance(value, type) else type(value)
    module = str(getattr(cls, "__module__", ""))
    if not module.startswith(_AO):
        return ""
    name = cls.__name__
    ours = f"fxquant.{name}" if name in _OURS else "fxquant's namesake"
    example = _OURS.get(name, "fxquant.get_default_qconfig_mapping('x86')")
    return (
        f"torch.ao's {module}.{name}, and fxquant does not take torch.ao's config objects: "
        f"build it with {ours} (import from fxquant what you imported from "
        f"torch.ao.quantization, e.g. {example}; see docs/migration.md)"
    )
