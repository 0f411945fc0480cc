"""The JSON vocabulary of the configs: safe name resolution and the value helpers.

Each config class states its JSON form as a table of codecs over its ``to_dict()`` keys
(``config/backend.py`` the ``BackendConfig``'s, ``config/qconfig_mapping.py`` the
``QConfigMapping``'s) and :func:`to_json`/:func:`from_json` apply it; this module imports
no class above ``QConfig``, so the classes import it at module level and the import graph
points one way.

The JSON mirrors ``to_dict()``; objects that JSON cannot hold are tagged:

    module class / function / builtin   {"module": "torch.nn.modules.linear", "name": "Linear"}
    method name (pattern op)            {"method": "relu"}
    pattern tuple                       [op, op, ...]        (nested lists for complex format)
    dtype                               "torch.quint8"       ({"dtype": ...} inside kwargs)
    qscheme (kwargs)                    {"qscheme": "per_tensor_affine"}
    observer constructor                {"module": ..., "name": ..., "kwargs": {...}}  (no
                                        "kwargs" key: the class itself, not a factory)

Reading a name must not let a JSON file run code of its choosing, so a name is
decided from its text alone, *before* anything is imported: its root must be
trusted for its kind (``torch``, ``operator``, ``fxquant``, installed fxquant plugins),
and under ``torch``/``operator``/``fxquant`` its module must be one fxquant reads that
kind from (:data:`ALLOWED_MODULES`: ops and module classes from ``torch``,
``torch.nn.functional``, ``torch.nn.modules.*``, ``fxquant.nn.*``...; fusers only from
``fxquant.nn.fusers``/``fxquant.patterns.conv_add``, getters only from
``fxquant.patterns.getters``, observers only from ``fxquant.observer``/``fake_quantize``).
Every part is a plain identifier (no leading underscore, no dunder). fxquant's own
functions must also be listed in their module's ``__all__``; what is found must then be
a plain function / ``nn.Module`` class defined under a trusted root. A plugin root is
the top-level package of an entry point in group ``fxquant.backends`` (trusted as
installed code); listing them imports nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import json
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, TypeVar

import torch

from fxquant import plugin_roots
from fxquant.config import pattern as patterns
from fxquant.config.qconfig import QConfig
from fxquant.dtypes import dtype_from_name, dtype_name, qscheme_name, qscheme_object
from fxquant.errors import ConfigError, ConfigTypeError, UnsafeNameError
from fxquant.factory import ModuleFactory

__all__ = [
    "Codec",
    "Codecs",
    "DictForm",
    "coded",
    "decode_dtype",
    "decode_op",
    "decode_pattern",
    "decode_qconfig",
    "encode_op",
    "encode_pattern",
    "encode_qconfig",
    "from_json",
    "json_list",
    "list_codec",
    "loads",
    "name_codec",
    "name_of",
    "one_scan",
    "resolve",
    "to_json",
    "trusted_roots",
    "unsafe",
    "with_path",
]


T = TypeVar("T")


class DictForm:
    """Equality and repr by ``to_dict()`` for the mutable config builders (so unhashable).

    Configs of unrelated classes are never equal, even with equal dicts.

    Example:
        >>> from fxquant.config import FuseCustomConfig, ConvertCustomConfig
        >>> FuseCustomConfig() == FuseCustomConfig(), FuseCustomConfig() == ConvertCustomConfig()
        (True, False)
        >>> FuseCustomConfig()
        FuseCustomConfig({})
    """

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"

    def __eq__(self, other: object) -> bool:
        if not (isinstance(other, type(self)) or isinstance(self, type(other))):
            return NotImplemented
        assert isinstance(other, DictForm)  # one class is the other's subclass
        return self.to_dict() == other.to_dict()

    # mutable builders: two configs equal now may differ after the next set_* call
    __hash__ = None  # type: ignore[assignment]


# what a name is used for: its kind
OP: Final = "pattern op"
MODULE_CLASS: Final = "module class"
FUSER: Final = "fuser function"
GETTER: Final = "getter function"
CONSTRUCTOR: Final = "observer class"
_OP_MODULES: Final = (
    "torch",
    "torch.functional",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.modules.*",
    "operator",
    "_operator",
    "fxquant.nn.*",
    "fxquant.config.pattern",  # MatchAllNode
)
# the modules (``.*``: and their submodules) a name of each kind may come from, decided
# before any import, so a refused name is never imported; their roots are the kind's base
# roots, to which installed plugins' roots are added
ALLOWED_MODULES: Final = {
    OP: _OP_MODULES,
    MODULE_CLASS: _OP_MODULES,
    FUSER: ("fxquant.nn.fusers", "fxquant.patterns.conv_add"),
    GETTER: ("fxquant.patterns.getters",),
    CONSTRUCTOR: ("fxquant.observer", "fxquant.fake_quantize", "fxquant.numerics.*"),
}
# a builtin's __module__ can be an implementation module; these are the names users write
# (fxquant's observers moved into fxquant.numerics; JSON keeps their public paths)
_MODULE_ALIASES: Final = {
    "_operator": "operator",
    "fxquant.numerics.observer": "fxquant.observer",
    "fxquant.numerics.fake_quantize": "fxquant.fake_quantize",
}


def trusted_roots(kind: str) -> frozenset[str]:
    """Top-level packages a name of ``kind`` may resolve under, plugins included.

    Example:
        >>> "torch" in trusted_roots("pattern op"), "torch" in trusted_roots("fuser function")
        (True, False)
    """
    # the registry owns discovery and keeps its scan until fxquant.registry.refresh(), as for
    # backends: a scan costs 25 ms, a hostile or fuzzed config is refused in microseconds;
    # it answers through fxquant.plugin_roots, as the configs sit below the registry
    scanned = _SCANNED_ROOTS.get()
    return _base_roots(kind) | (scanned if scanned is not None else plugin_roots.plugin_roots())


def _base_roots(kind: str) -> frozenset[str]:
    return frozenset(_root(module) for module in ALLOWED_MODULES[kind])


# the roots read once per to_json/from_json call: a backend has hundreds of names
_SCANNED_ROOTS: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar(
    "fxquant_plugin_roots", default=None
)


@contextlib.contextmanager
def one_scan() -> Iterator[None]:
    """Scan the plugin roots once for a whole to_json/from_json call (a config has hundreds
    of names).

    Example:
        >>> with one_scan():
        ...     "fxquant" in trusted_roots("fuser function")
        True
    """
    token = _SCANNED_ROOTS.set(plugin_roots.plugin_roots())
    try:
        yield
    finally:
        _SCANNED_ROOTS.reset(token)


def _root(module: str) -> str:
    return _MODULE_ALIASES.get(module, module).split(".", 1)[0]


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def unsafe(path: str, value: object, why: str) -> UnsafeNameError:
    """The error for a value at JSON ``path`` that cannot be written or read safely.

    Example:
        >>> str(unsafe("configs[0]", 3, "is not a dtype"))
        'configs[0]: 3 is not a dtype'
    """
    return UnsafeNameError(f"{path}: {value!r} {why}")


# ---------------------------------------------------------------- naming objects


def _candidates(obj: Any) -> list[tuple[str, str]]:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__name__", None)
    qualname = getattr(obj, "__qualname__", name)
    found: list[tuple[str, str]] = []
    if isinstance(obj, types.BuiltinFunctionType) and isinstance(name, str):
        # torch builtins live in torch._C; users know them as torch.nn.functional.X / torch.X
        found += [("torch.nn.functional", name), ("torch", name)]
    if isinstance(module, str):
        module = _MODULE_ALIASES.get(module, module)
        # __name__ too: wrapped functions (F.max_pool2d) have a <locals> qualname
        found += [(module, n) for n in (qualname, name) if isinstance(n, str)]
    return found


def name_of(obj: object, path: str, kind: str) -> dict[str, str]:
    """The ``{"module", "name"}`` reference of ``obj``, checked against ``kind``'s roots.

    Raises:
        UnsafeNameError: when ``obj`` has no importable name or lives outside the roots.

    Example:
        >>> name_of(torch.nn.Linear, "pattern", "pattern op")
        {'module': 'torch.nn.modules.linear', 'name': 'Linear'}
    """
    for module, name in _candidates(obj):
        if "<" in name or _root(module) not in trusted_roots(kind):
            continue
        try:
            if _lookup(module, name) is obj:
                return {"module": module, "name": name}
        except (ImportError, AttributeError):
            continue
    roots = ", ".join(sorted(trusted_roots(kind)))
    why = (
        f"cannot be written as {_a(kind)}: it needs an importable qualified name under "
        f"{roots} (lambdas and local functions have none; define it at module level "
        "in fxquant or an installed fxquant plugin)"
    )
    raise unsafe(path, obj, why)


def _lookup(module: str, name: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        if isinstance(found, types.ModuleType):
            # vars(), not getattr: a module __getattr__ (torch's) imports submodules by
            # name, and a name from a JSON file must import nothing past its module
            if part not in vars(found):
                msg = f"module {found.__name__!r} has no attribute {part!r}"
                raise AttributeError(msg)
            found = vars(found)[part]
        else:
            found = getattr(found, part)
    return found


# ---------------------------------------------------------------- resolving names


def _check_dotted(text: object, path: str) -> str:
    if not isinstance(text, str) or not text:
        msg = f"{path}: expected a dotted name (str), got {text!r}"
        raise ConfigTypeError(msg)
    for part in text.split("."):
        # ascii: the text is shown in messages and compared with module names as it is
        private = part.startswith("_") and part != "_operator"
        if not (part.isascii() and part.isidentifier()) or private:
            why = "is not a plain dotted name (no dunder or _private parts allowed)"
            raise unsafe(path, text, why)
    return text


def _module_allowed(module: str, kind: str) -> bool:
    """Whether ``module`` is one fxquant reads names of ``kind`` from (text only): an entry
    ``a.*`` allows ``a`` and its submodules, any other entry only itself."""
    for allowed in ALLOWED_MODULES[kind]:
        package = allowed.removesuffix(".*")
        if module == package or (allowed.endswith(".*") and module.startswith(package + ".")):
            return True
    return False


def _check_module(module: str, name: str, path: str, kind: str) -> None:
    """Refuse a name under a base root but outside its kind's modules (decided from the text
    alone, before any import), and fxquant's own functions its module does not list in
    ``__all__``."""
    if _root(module) not in _base_roots(kind):
        return  # a plugin's own package: installed code the user chose (roots checked before)
    if not _module_allowed(module, kind):
        allowed = ", ".join(ALLOWED_MODULES[kind])
        why = f"is not in a module fxquant reads {_a(kind)} from ({allowed})"
        raise unsafe(path, f"{module}.{name}", why)
    if "." in name:
        why = f"is not a top-level name of {module} (a dotted name would reach other modules)"
        raise unsafe(path, f"{module}.{name}", why)
    if kind in (FUSER, GETTER) and _root(module) == "fxquant":
        listed = getattr(importlib.import_module(module), "__all__", ())
        if name not in listed:
            why = f"is not one of the {kind}s {module} offers ({', '.join(listed)})"
            raise unsafe(path, f"{module}.{name}", why)


def resolve(ref: object, path: str, kind: str) -> Any:
    """Resolve a ``{"module", "name"}`` reference, importing only under trusted roots.

    The root is checked before anything is imported; the object found must then be
    of the right kind and defined under a trusted root itself (so a re-export such as
    ``fxquant.x.eval`` does not pass).

    Raises:
        UnsafeNameError: for a root outside the trusted ones, or an object of the wrong
            kind or origin.
        ConfigError: when the name does not exist.

    Example:
        >>> resolve({"module": "operator", "name": "add"}, "pattern", "pattern op")
        <built-in function add>
    """
    if not isinstance(ref, Mapping) or set(ref) != {"module", "name"}:
        msg = f"{path}: expected {{'module': ..., 'name': ...}}, got {ref!r}"
        raise ConfigError(msg)
    module = _check_dotted(ref["module"], f"{path}.module")
    name = _check_dotted(ref["name"], f"{path}.name")
    roots = trusted_roots(kind)
    if _root(module) not in roots:
        allowed = ", ".join(sorted(roots))
        raise unsafe(
            path, f"{module}.{name}", f"is outside the modules trusted for {_a(kind)} ({allowed})"
        )
    try:
        _check_module(module, name, path, kind)
        found = _lookup(module, name)
    except (ImportError, AttributeError) as error:
        msg = f"{path}: {module}.{name} does not exist ({error})"
        raise ConfigError(msg) from error
    _check_resolved(found, path, kind, roots)
    return found


def _check_resolved(found: Any, path: str, kind: str, roots: frozenset[str]) -> None:
    origin = getattr(found, "__module__", None)
    if isinstance(found, str) or not isinstance(origin, str) or _root(origin) not in roots:
        raise unsafe(path, found, f"is not defined in a module trusted for {_a(kind)}")
    if kind in (FUSER, GETTER) and not isinstance(found, types.FunctionType):
        raise unsafe(path, found, "is not a plain function")
    if kind in (MODULE_CLASS, CONSTRUCTOR) and not (
        isinstance(found, type) and issubclass(found, torch.nn.Module)
    ):
        raise unsafe(path, found, "is not a torch.nn.Module subclass")
    if kind == OP:
        try:
            patterns.op_kind(found)
        except ConfigTypeError as error:
            raise unsafe(path, found, "is not a pattern op") from error


# ---------------------------------------------------------------- patterns and ops


def encode_op(op: object, path: str) -> Any:
    """An op of a pattern (module class, function or method name) as JSON; ``path`` for errors."""
    if isinstance(op, str):
        return {"method": op}
    return name_of(op, path, OP)


def decode_op(data: object, path: str) -> Any:
    """:func:`encode_op`'s JSON back to the op, resolved only in trusted modules."""
    if isinstance(data, Mapping) and set(data) == {"method"}:
        method = data["method"]
        if not isinstance(method, str) or not method.isidentifier():
            msg = f"{path}: a method name must be an identifier, got {method!r}"
            raise ConfigError(msg)
        return method
    return resolve(data, path, OP)


def encode_pattern(pattern: object, path: str) -> Any:
    """A pattern's JSON: ops by name, methods as ``{"method": ...}``, tuples as lists.

    Example:
        >>> encode_pattern((torch.nn.ReLU, "add"), "pattern")
        [{'module': 'torch.nn.modules.activation', 'name': 'ReLU'}, {'method': 'add'}]
    """
    if isinstance(pattern, tuple):
        return [encode_pattern(p, f"{path}[{i}]") for i, p in enumerate(pattern)]
    return encode_op(pattern, path)


def decode_pattern(data: object, path: str) -> Any:
    """Read :func:`encode_pattern`'s JSON back, resolving names as :func:`resolve` does.

    Example:
        >>> decode_pattern([{"module": "operator", "name": "add"}, {"method": "relu"}], "p")
        (<built-in function add>, 'relu')
    """
    if isinstance(data, list):
        return tuple(decode_pattern(p, f"{path}[{i}]") for i, p in enumerate(data))
    return decode_op(data, path)


# ---------------------------------------------------------------- observer constructors


def _is_qscheme(value: object) -> bool:
    qscheme_type = getattr(torch, "qscheme", None)
    return isinstance(qscheme_type, type) and isinstance(value, qscheme_type)


def _encode_value(value: object, path: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if _is_qscheme(value):
        return {"qscheme": qscheme_name(value)}
    if isinstance(value, (ModuleFactory, type)):
        return _encode_constructor(value, path)
    if isinstance(value, (list, tuple)):
        items = [_encode_value(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else {"tuple": items}
    why = (
        "cannot be written to JSON; constructor arguments may be None, bool, int, float, "
        "str, a dtype, a qscheme, an observer class or factory, or a list/tuple of these"
    )
    raise unsafe(path, value, why)


def _decode_value(data: object, path: str) -> Any:
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [_decode_value(v, f"{path}[{i}]") for i, v in enumerate(data)]
    if isinstance(data, Mapping):
        if set(data) == {"dtype"}:
            return decode_dtype(data["dtype"], f"{path}.dtype")
        if set(data) == {"qscheme"}:
            return qscheme_object(data["qscheme"])
        if set(data) == {"tuple"} and isinstance(data["tuple"], list):
            return tuple(_decode_value(data["tuple"], f"{path}.tuple"))
        if "module" in data:
            return _decode_constructor(data, path)
    msg = f"{path}: cannot read {data!r} as a constructor argument"
    raise ConfigError(msg)


def _encode_constructor(ctor: object, path: str) -> dict[str, Any]:
    if isinstance(ctor, ModuleFactory):
        ref: dict[str, Any] = name_of(ctor.cls, path, CONSTRUCTOR)
        kwargs = {str(k): _encode_value(v, f"{path}.kwargs.{k}") for k, v in ctor.kwargs.items()}
        return {**ref, "kwargs": kwargs}
    if isinstance(ctor, type):
        return name_of(ctor, path, CONSTRUCTOR)
    why = "is not an observer class or a .with_args(...) factory, so it cannot be written"
    raise unsafe(path, ctor, why)


def _decode_constructor(data: object, path: str) -> Any:
    if not isinstance(data, Mapping):
        msg = (
            f"{path}: expected an observer reference {{'module', 'name'[, 'kwargs']}}, got {data!r}"
        )
        raise ConfigError(msg)
    ref = {k: v for k, v in data.items() if k != "kwargs"}
    cls = resolve(ref, path, CONSTRUCTOR)
    if "kwargs" not in data:
        return cls
    kwargs = data["kwargs"]
    if not isinstance(kwargs, Mapping):
        msg = f"{path}.kwargs: expected an object of keyword arguments, got {kwargs!r}"
        raise ConfigError(msg)
    factory = ModuleFactory(
        cls, {k: _decode_value(v, f"{path}.kwargs.{k}") for k, v in kwargs.items()}
    )
    # built once, so a bad argument fails here with its JSON path: observers validate their
    # arguments in their constructors; without this, ``eps`` NaN from a file would only fail
    # (or silently give NaN scales) inside prepare_fx
    try:
        factory()
    except (ConfigError, ConfigTypeError) as error:
        msg = f"{path}.kwargs: {error}"
        raise type(error)(msg) from error
    except TypeError as error:  # an argument the class does not take
        msg = f"{path}.kwargs: {error}"
        raise ConfigTypeError(msg) from error
    except Exception as error:  # torch refusing a value (a device, a dtype...)
        msg = f"{path}.kwargs: {factory!r} cannot be built: {type(error).__name__}: {error}"
        raise ConfigError(msg) from error
    return factory


def encode_qconfig(qconfig: object, path: str) -> Any:
    """A QConfig (or None) as JSON: its two constructors by name with their arguments."""
    if qconfig is None:
        return None
    if not isinstance(qconfig, QConfig):
        raise unsafe(path, qconfig, "is not a QConfig")
    encoded: dict[str, Any] = {
        "activation": _encode_constructor(qconfig.activation, f"{path}.activation"),
        "weight": _encode_constructor(qconfig.weight, f"{path}.weight"),
    }
    if qconfig.output_dtype is not None:  # absent otherwise: the JSON torch.ao users know
        encoded["output_dtype"] = dtype_name(qconfig.output_dtype)
    return encoded


def decode_qconfig(data: object, path: str) -> QConfig | None:
    """:func:`encode_qconfig`'s JSON back to a QConfig, each constructor checked by building it."""
    if data is None:
        return None
    if not isinstance(data, Mapping) or not (
        {"activation", "weight"} <= set(data) <= {"activation", "weight", "output_dtype"}
    ):
        msg = (
            f"{path}: expected null or {{'activation': ..., 'weight': ...}} (and optionally "
            f"'output_dtype': 'torch.bfloat16'), got {data!r}"
        )
        raise ConfigError(msg)
    output = data.get("output_dtype")
    return QConfig(
        activation=_decode_constructor(data["activation"], f"{path}.activation"),
        weight=_decode_constructor(data["weight"], f"{path}.weight"),
        output_dtype=None if output is None else decode_dtype(output, f"{path}.output_dtype"),
    )


# ---------------------------------------------------------------- dtypes


def decode_dtype(name: object, path: str) -> torch.dtype:
    """The dtype a name like ``"torch.uint8"`` stands for; a ConfigError naming ``path``.

    Example:
        >>> decode_dtype("torch.int8", "weight_dtype")
        torch.int8
    """
    return with_path(path, dtype_from_name, name)


# ---------------------------------------------------------------- the config classes' JSON

# each config class states its JSON as a table of codecs over its to_dict() keys and hands it
# to to_json/from_json; serialize imports no config class above QConfig, so the classes
# import it at module level and the import graph points one way

Codec = tuple[Callable[[Any, str], Any], Callable[[Any, str], Any]]
"""(encode, decode) of one dict key's value; each takes the value and its JSON path."""

Codecs = Mapping[str, Codec]
"""A dict form's codecs by key; a key without one passes through as it is."""


def name_codec(kind: str) -> Codec:
    """Objects of ``kind`` written by :func:`name_of` and read back by :func:`resolve`.

    Example:
        >>> encode, decode = name_codec("module class")
        >>> decode(encode(torch.nn.ReLU, "root_module"), "root_module") is torch.nn.ReLU
        True
    """
    return (lambda v, p: name_of(v, p, kind), lambda d, p: resolve(d, p, kind))


def list_codec(item: Codec) -> Codec:
    """A JSON array whose items go through ``item``, each at its index's path.

    Example:
        >>> encode, decode = list_codec(name_codec("pattern op"))
        >>> decode(encode([torch.add], "ops"), "ops")
        [<built-in method add of type object at ...>]
    """
    return (
        lambda v, p: [item[0](x, f"{p}[{i}]") for i, x in enumerate(v)],
        lambda d, p: [item[1](x, f"{p}[{i}]") for i, x in enumerate(json_list(d, p))],
    )


def coded(data: object, path: str, codecs: Codecs, side: int) -> dict[str, Any]:
    """``data``'s values through their key's encoder (``side`` 0) or decoder (1).

    Keys without a codec pass through as they are (``from_dict`` names unknown ones).

    Example:
        >>> coded({"op": torch.add, "n": 1}, "", {"op": name_codec("pattern op")}, 0)
        {'op': {'module': 'torch', 'name': 'add'}, 'n': 1}
    """
    if not isinstance(data, Mapping):
        msg = f"{path}: expected an object, got {data!r}"
        raise ConfigError(msg)
    return {
        key: codecs[key][side](value, _key_path(path, key)) if key in codecs else value
        for key, value in data.items()
    }


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else (key or '[""]')


def to_json(data: Mapping[str, Any], codecs: Codecs) -> str:
    """A config's ``to_dict()`` as JSON text, each key's value through its codec.

    Raises:
        UnsafeNameError: naming the JSON path of a value that cannot be written.

    Example:
        >>> to_json({"pattern": torch.nn.ReLU}, {"pattern": name_codec("pattern op")})
        '{"pattern": {"module": "torch.nn.modules.activation", "name": "ReLU"}}'
    """
    with one_scan():
        return json.dumps(coded(data, "", codecs, 0))


def from_json(text: object, owner: str, codecs: Codecs) -> dict[str, Any]:
    """:func:`to_json`'s text back to the dict form ``owner.from_dict`` takes.

    Raises:
        UnsafeNameError: naming the JSON path of a name outside the trusted modules.
        ConfigError: for malformed JSON or config values (see :func:`loads`).

    Example:
        >>> from_json('{"n": 1}', "BackendConfig", {})
        {'n': 1}
    """
    data = loads(text, owner)
    with one_scan():
        return coded(data, "", codecs, 1)


def json_list(data: object, path: str) -> list[Any]:
    """``data`` when it is a JSON array, else a ConfigError naming ``path``.

    Example:
        >>> json_list([1], "configs")
        [1]
    """
    if isinstance(data, list):
        return data
    msg = f"{path}: expected a list, got {data!r}"
    raise ConfigError(msg)


def with_path(path: str, build: Callable[[Any], T], data: Any) -> T:
    """Run ``build(data)``, prefixing a config error's message with the JSON path.

    Example:
        >>> with_path("configs[0]", int, "7")
        7
    """
    try:
        return build(data)
    except (UnsafeNameError, ConfigError, ConfigTypeError) as error:
        if str(error).startswith(path):
            raise
        msg = f"{path}: {error}"
        raise type(error)(msg) from error


# a config nests a dozen levels; a deeper document is refused before it is walked
# (Python's recursion limit would fail a few hundred levels down with RecursionError)
MAX_DEPTH: Final = 64


def _depth_exceeded(data: object) -> bool:
    """Whether ``data`` nests deeper than :data:`MAX_DEPTH` (iterative: no recursion)."""
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return False


def _text(text: object, owner: str) -> str:
    if isinstance(text, (bytes, bytearray)):
        try:
            return bytes(text).decode("utf-8-sig")  # JSON is UTF-8 (RFC 8259); a BOM is allowed
        except UnicodeDecodeError as error:
            msg = (
                f"{owner}.from_json: the bytes are not UTF-8 (byte {error.start}: "
                f"{bytes(text)[error.start : error.start + 1]!r}); JSON files are UTF-8"
            )
            raise ConfigError(msg) from error
    if not isinstance(text, str):
        msg = f"{owner}.from_json expects a str, got {text!r} of type {type(text).__name__}"
        raise ConfigTypeError(msg)
    return text


def loads(text: object, owner: str) -> dict[str, Any]:
    """The JSON object in ``text`` (str, or UTF-8 bytes), refused with a ConfigError naming
    ``owner`` when it is no JSON object or nests deeper than :data:`MAX_DEPTH`.

    Example:
        >>> loads('{"name": "b"}', "BackendConfig")
        {'name': 'b'}
    """
    try:
        data = json.loads(_text(text, owner))
    except json.JSONDecodeError as error:
        msg = f"{owner}.from_json: the text is not valid JSON ({error})"
        raise ConfigError(msg) from error
    except RecursionError as error:
        msg = f"{owner}.from_json: the JSON nests deeper than {MAX_DEPTH} levels"
        raise ConfigError(msg) from error
    if not isinstance(data, dict):
        msg = f"{owner}.from_json expects a JSON object, got {data!r}"
        raise ConfigError(msg)
    if _depth_exceeded(data):
        msg = f"{owner}.from_json: the JSON nests deeper than {MAX_DEPTH} levels"
        raise ConfigError(msg)
    return data
