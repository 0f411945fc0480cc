"""``QConfigMapping``: which QConfig each part of a model gets.

Five levels, lowest priority first; the most specific level that matches wins:

    global               set_global
    object type          set_object_type         module class, function or method name
    module name regex    set_module_name_regex   first registered regex that re.match()es
    module name          set_module_name         the name, or its nearest named ancestor
    name + type + index  set_module_name_object_type_order

The index counts calls inside one module, in the order ``forward`` makes them:
``("", nn.Conv2d, 3)`` is the fourth ``nn.Conv2d`` the root module calls directly,
``("block", torch.add, 0)`` the first ``torch.add`` in ``block.forward``. A module
call counts in the module whose ``forward`` makes it (for a module held in a
``ModuleList``, the list's owner; the flow also accepts the list's own path,
torch.ao's count), a function or method call in the module that makes it.
:meth:`QConfigMapping.qconfig_for`, which knows names only, counts a module in
its parent by path (:func:`order_scope`).

:meth:`QConfigMapping.resolve` applies these rules, the one place that does;
the flow calls it once per node, and :meth:`QConfigMapping.qconfig_for` is its
short form for one module or call. A qconfig of ``None`` is a real answer
("leave this in float"), not a miss.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
import torch.nn.functional as F

from fxquant.config import serialize
from fxquant.config.checks import check_dict_form, check_entries, check_str, unknown_keys
from fxquant.config.qconfig import QConfig, QConfigAny
from fxquant.errors import ConfigError, ConfigTypeError, wrong_type

__all__ = ["ObjectType", "OrderKey", "QConfigChoice", "QConfigMapping", "order_key", "order_scope"]

ObjectType = Callable[..., Any] | str
"""A module class, a function (``torch.add``, ``operator.add``) or a method name (``"relu"``)."""

OrderKey = tuple[str, ObjectType, int]
"""``(module_name, object_type, index)``: the key of :meth:`set_module_name_object_type_order`."""

GLOBAL_KEY: Final = ""
OBJECT_TYPE_KEY: Final = "object_type"
MODULE_NAME_REGEX_KEY: Final = "module_name_regex"
MODULE_NAME_KEY: Final = "module_name"
MODULE_NAME_OBJECT_TYPE_ORDER_KEY: Final = "module_name_object_type_order"


def _check_qconfig(qconfig: object, argument: str) -> QConfigAny:
    if qconfig is None or isinstance(qconfig, QConfig):
        return qconfig
    raise wrong_type(
        qconfig, argument, "a fxquant.QConfig or None (None leaves the match in float)"
    )


# torch.ao's default mappings list these method names, which torch.Tensor has no method
# for; a torch.ao mapping or qconfig dict carrying them must keep loading.
_TORCH_AO_METHOD_NAMES: Final = frozenset({"hardsigmoid", "hardsigmoid_"})


def _functions_named(name: str) -> list[str]:
    """What the user may have meant by a string naming no tensor method, as they write it."""
    found = [
        f"{prefix}.{name}"
        for prefix, namespace in (("torch.nn.functional", F), ("torch", torch))
        if callable(getattr(namespace, name, None))
        and not isinstance(getattr(namespace, name), type)
    ]
    lowered = name.lower().replace("_", "")
    found += [
        f"torch.nn.{attr}"
        for attr, value in vars(torch.nn).items()
        if attr.lower() == lowered and _is_module_class(value)
    ]
    return found


def _check_method_name(name: str, argument: str) -> None:
    """A string object type matches ``call_method`` nodes (``x.relu()``) only: a module class
    name, or a function's name that no tensor method has, would match nothing, silently in
    torch.ao, where the user meant the class or the function."""
    if _is_module_class(getattr(torch.nn, name, None)):
        msg = (
            f"{argument} {name!r} is the name of a module class, and a string object type "
            f"matches method calls only (e.g. 'relu' for x.relu()): pass the class, "
            f"torch.nn.{name}, not the string {name!r}"
        )
        raise ConfigTypeError(msg)
    if hasattr(torch.Tensor, name) or name in _TORCH_AO_METHOD_NAMES:
        return
    meant = _functions_named(name)
    hint = f"pass the object itself: {', '.join(meant)}" if meant else "pass the function or class"
    msg = (
        f"{argument} {name!r} names no torch.Tensor method, and a string object type matches "
        f"method calls only (e.g. 'relu' for x.relu(), 'add' for x.add(y)), so it would match "
        f"nothing; {hint}"
    )
    raise ConfigTypeError(msg)


def _check_object_type(object_type: object, argument: str) -> ObjectType:
    if isinstance(object_type, str):
        if object_type.isidentifier():
            _check_method_name(object_type, argument)
            return object_type
    elif isinstance(object_type, type):
        if issubclass(object_type, torch.nn.Module):
            return object_type
    elif callable(object_type) and not isinstance(object_type, torch.nn.Module):
        return object_type
    expected = "a module class, a function or a method name"
    raise wrong_type(object_type, argument, expected, "; e.g. torch.nn.Linear, torch.add, 'relu'")


def _compile(regex: object) -> re.Pattern[str]:
    text = check_str(regex, "module_name_regex")
    try:
        return re.compile(text)
    except re.error as error:
        msg = f"module_name_regex {text!r} is not a valid regular expression: {error}"
        raise ConfigError(msg) from error


def _parent_names(module_name: str) -> list[str]:
    """``"a.b.c"`` -> ``["a.b.c", "a.b", "a"]``; the root (``""``) has no name entry."""
    parts = module_name.split(".") if module_name else []
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _is_module_class(object_type: object) -> bool:
    return isinstance(object_type, type) and issubclass(object_type, torch.nn.Module)


def order_scope(module_name: str, object_type: object) -> str:
    """The module whose calls an index counts: a module's parent, a call's own module.

    ``module_name`` is the module itself when ``object_type`` is a module class
    (``"block.conv"`` is counted among the calls ``"block"`` makes), and the module
    making the call for a function or method.

    Example:
        >>> order_scope("block.conv", torch.nn.Conv2d), order_scope("conv", torch.nn.Conv2d)
        ('block', '')
        >>> order_scope("block", torch.add)
        'block'
    """
    if _is_module_class(object_type):
        return module_name.rpartition(".")[0]
    return module_name


def order_key(module_name: str, object_type: ObjectType, index: int) -> OrderKey:
    """The :meth:`QConfigMapping.set_module_name_object_type_order` key that names one call.

    Args:
        module_name: the module (for a module class) or the module making the call.
        object_type: the module class, function or method name.
        index: how many earlier calls of ``object_type`` the same scope made.

    Example:
        >>> order_key("block.conv", torch.nn.Conv2d, 1)[0]
        'block'
    """
    return (order_scope(module_name, object_type), object_type, index)


@dataclass(frozen=True, slots=True)
class QConfigChoice:
    """What :meth:`QConfigMapping.resolve` chose, and which level of the mapping gave it.

    ``level`` is the ``to_dict`` key of that level (``""`` for the global QConfig).

    Example:
        >>> QConfigChoice(None, "").names_module
        False
    """

    qconfig: QConfigAny
    level: str

    @property
    def names_module(self) -> bool:
        """True when an entry naming a module (order, name or regex) gave the QConfig."""
        return self.level not in (GLOBAL_KEY, OBJECT_TYPE_KEY)


class QConfigMapping(serialize.DictForm):
    """Map model parts to QConfigs at five levels of priority (see the module docstring).

    Setting a key that is already there replaces its QConfig; regexes keep the
    position where they were first registered, because the first match wins.

    Example:
        >>> import torch
        >>> from fxquant.config.qconfig import QConfig
        >>> qconfig = QConfig(activation=torch.nn.Identity, weight=torch.nn.Identity)
        >>> mapping = (QConfigMapping()
        ...     .set_global(qconfig)
        ...     .set_object_type(torch.nn.Linear, None)
        ...     .set_module_name("head", qconfig))
        >>> mapping.qconfig_for("body.fc", torch.nn.Linear) is None
        True
        >>> mapping.qconfig_for("head.fc", torch.nn.Linear) is qconfig
        True
    """

    def __init__(self) -> None:
        self.global_qconfig: QConfigAny = None
        self.object_type_qconfigs: dict[ObjectType, QConfigAny] = {}
        self.module_name_regex_qconfigs: dict[str, QConfigAny] = {}
        self.module_name_qconfigs: dict[str, QConfigAny] = {}
        self.module_name_object_type_order_qconfigs: dict[OrderKey, QConfigAny] = {}

    def __getstate__(self) -> dict[str, Any]:
        # the compiled regexes are a cache: pickles and copies hold the five levels only
        return {k: v for k, v in vars(self).items() if k != "_compiled"}

    def _compiled_regexes(self) -> dict[str, re.Pattern[str]]:
        # made on first use, not in __init__: a subclass or a copy built without __init__
        # (torch.ao's attributes set by hand) resolves as well
        cache: dict[str, re.Pattern[str]] = vars(self).setdefault("_compiled", {})
        return cache

    def set_global(self, global_qconfig: QConfigAny) -> QConfigMapping:
        """Set the QConfig used where no other level matches.

        Example:
            >>> QConfigMapping().set_global(None).global_qconfig is None
            True
        """
        self.global_qconfig = _check_qconfig(global_qconfig, "global_qconfig")
        return self

    def set_object_type(self, object_type: ObjectType, qconfig: QConfigAny) -> QConfigMapping:
        """Set the QConfig for a module class, function or method name.

        Setting a type again moves its entry last: between a fused module class and the
        type it is built around (``LinearReLU`` and ``nn.Linear``) the entry set last
        decides, so a user's ``nn.Linear`` entry reaches the linears fused with a relu
        even where a backend's default mapping gave ``LinearReLU`` its own.

        Example:
            >>> list(QConfigMapping().set_object_type("relu", None).object_type_qconfigs)
            ['relu']
        """
        key = _check_object_type(object_type, "object_type")
        checked = _check_qconfig(qconfig, "qconfig")
        self.object_type_qconfigs.pop(key, None)
        self.object_type_qconfigs[key] = checked
        return self

    def set_module_name_regex(self, module_name_regex: str, qconfig: QConfigAny) -> QConfigMapping:
        """Set the QConfig for module names the regex ``re.match``-es; first registered wins.

        Raises:
            ConfigError: when the regex does not compile.

        Example:
            >>> m = QConfigMapping().set_module_name_regex("foo.*", None)
            >>> list(m.module_name_regex_qconfigs)
            ['foo.*']
        """
        compiled = _compile(module_name_regex)
        checked = _check_qconfig(qconfig, "qconfig")
        self.module_name_regex_qconfigs[compiled.pattern] = checked
        self._compiled_regexes()[compiled.pattern] = compiled
        return self

    def set_module_name(self, module_name: str, qconfig: QConfigAny) -> QConfigMapping:
        """Set the QConfig for a module by its qualified name; its submodules inherit it.

        Example:
            >>> list(QConfigMapping().set_module_name("layer1", None).module_name_qconfigs)
            ['layer1']
        """
        name = check_str(module_name, "module_name")
        self.module_name_qconfigs[name] = _check_qconfig(qconfig, "qconfig")
        return self

    def set_module_name_object_type_order(
        self, module_name: str, object_type: ObjectType, index: int, qconfig: QConfigAny
    ) -> QConfigMapping:
        """Set the QConfig for the ``index``-th call of ``object_type`` inside ``module_name``.

        ``module_name`` is the module whose ``forward`` makes the calls, for module
        classes too: ``("", torch.nn.Conv2d, 3)`` is the fourth ``Conv2d`` the root
        module calls directly, ``("block", torch.add, 0)`` the first ``torch.add`` in
        ``block.forward``. Indices count calls in execution order (a module called
        twice counts twice), of the model as written, before fusion.

        Example:
            >>> m = QConfigMapping().set_module_name_object_type_order("foo", torch.add, 0, None)
            >>> len(m.module_name_object_type_order_qconfigs)
            1
        """
        name = check_str(module_name, "module_name")
        checked = _check_object_type(object_type, "object_type")
        if not isinstance(index, int) or isinstance(index, bool):
            msg = f"index must be an int (the call's position in its module), got {index!r}"
            raise ConfigTypeError(msg)
        if index < 0:
            msg = f"index must be >= 0 (0 is the first call in the module), got {index!r}"
            raise ConfigError(msg)
        key = (name, checked, index)
        self.module_name_object_type_order_qconfigs[key] = _check_qconfig(qconfig, "qconfig")
        return self

    def qconfig_for(
        self, module_name: str, object_type: ObjectType | None = None, index: int | None = None
    ) -> QConfigAny:
        """The QConfig of one module or call; :meth:`resolve` with one object type.

        Args:
            module_name: qualified name of the module (for a function or method call,
                the module whose ``forward`` makes the call; ``""`` for the root).
            object_type: the module's class, the function, or the method name.
            index: how many earlier calls of ``object_type`` precede this one in its
                :func:`order_scope` (a module's parent, a call's own module); 0 for the first.

        Example:
            >>> q = QConfig(activation=torch.nn.Identity, weight=torch.nn.Identity)
            >>> m = QConfigMapping().set_module_name_object_type_order("", torch.nn.Conv2d, 3, q)
            >>> m.qconfig_for("conv3", torch.nn.Conv2d, 3) is q
            True
        """
        if object_type is None:
            return self.resolve(module_name).qconfig
        orders = () if index is None else (order_key(module_name, object_type, index),)
        return self.resolve(module_name, (object_type,), orders).qconfig

    def resolve(
        self,
        module_name: str,
        object_types: Sequence[Any] = (),
        orders: Sequence[OrderKey] = (),
    ) -> QConfigChoice:
        """The QConfig of one graph node: the highest-priority level that matches wins.

        Priority, highest first:

        1. the first of ``orders`` set with :meth:`set_module_name_object_type_order`;
        2. ``module_name`` itself, else its nearest ancestor with a name entry
           (``"a.b.c"`` looks up ``"a.b.c"``, ``"a.b"``, ``"a"``);
        3. the first registered regex that ``re.match``-es ``module_name``;
        4. the first of ``object_types`` with an entry;
        5. the global QConfig.

        Args:
            module_name: qualified name of the module (for a function or method call,
                the module whose ``forward`` makes the call; ``""`` for the root).
            object_types: the object types the node answers to, first preferred: a
                module's class (then the classes a fused module replaced); for a call,
                the owning module's class, then the function or method name (torch.ao's
                order). ``None`` items are skipped.
            orders: the :func:`order_key` s naming the node's call (a fused module has
                one per module it replaced).

        Example:
            >>> q = QConfig(activation=torch.nn.Identity, weight=torch.nn.Identity)
            >>> m = QConfigMapping().set_global(q).set_module_name("head", None)
            >>> m.resolve("head.fc", (torch.nn.Linear,))
            QConfigChoice(qconfig=None, level='module_name')
            >>> m.resolve("body.fc", (torch.nn.Linear,)).level
            ''
        """
        table = self.module_name_object_type_order_qconfigs
        for key in orders:
            if key in table:
                return QConfigChoice(table[key], MODULE_NAME_OBJECT_TYPE_ORDER_KEY)
        for name in _parent_names(module_name):
            if name in self.module_name_qconfigs:
                return QConfigChoice(self.module_name_qconfigs[name], MODULE_NAME_KEY)
        compiled = self._compiled_regexes()
        for regex, qconfig in self.module_name_regex_qconfigs.items():
            # compiled once and kept: a call of re.compile, even answered from re's cache
            # (which drops patterns past 512), costs more than the match; attributes are public
            # (torch.ao's names), so a regex assigned directly is checked and compiled here
            if regex not in compiled:
                compiled[regex] = _compile(regex)
            if compiled[regex].match(module_name):
                return QConfigChoice(qconfig, MODULE_NAME_REGEX_KEY)
        for object_type in object_types:
            if object_type is not None and object_type in self.object_type_qconfigs:
                return QConfigChoice(self.object_type_qconfigs[object_type], OBJECT_TYPE_KEY)
        return QConfigChoice(self.global_qconfig, GLOBAL_KEY)

    def to_dict(self) -> dict[str, Any]:
        """The dict form (torch.ao's keys): the global QConfig and lists of tuples.

        Example:
            >>> QConfigMapping().set_module_name("fc", None).to_dict()["module_name"]
            [('fc', None)]
        """
        result: dict[str, Any] = {GLOBAL_KEY: self.global_qconfig}
        for key in _LEVELS:
            # an order entry's key is the tuple (module_name, object_type, index): its items
            # come first; the other levels' keys are one name, type or function each
            items = getattr(self, f"{key}_qconfigs").items()
            result[key] = [(*k, q) if isinstance(k, tuple) else (k, q) for k, q in items]
        return result

    @classmethod
    def from_dict(cls, qconfig_dict: Mapping[str, Any], *, strict: bool = False) -> QConfigMapping:
        """Build from the dict form (all keys optional; entries are tuples or lists).

        A key fxquant does not know is ignored with one ``ConfigWarning`` naming it, as
        torch.ao ignores it; ``strict=True`` raises instead.

        Raises:
            ConfigError: for an entry of the wrong length, or an unknown key with
                ``strict=True`` (the message lists the valid ones).

        Example:
            >>> QConfigMapping.from_dict({"module_name": [("fc", None)]}).module_name_qconfigs
            {'fc': None}
        """
        data = check_dict_form(qconfig_dict, "QConfigMapping")
        # the warning points at the caller of from_dict, one frame up
        unknown_keys(data, DICT_KEYS, "QConfigMapping.from_dict", strict, stacklevel=3)
        mapping = cls()
        if GLOBAL_KEY in qconfig_dict:
            mapping.set_global(qconfig_dict[GLOBAL_KEY])
        for key, (_, size, setter) in _LEVELS.items():
            listed, entry = f"a list of tuples of {size} items", f"a tuple of {size} items"
            argument = f"QConfigMapping.from_dict: {key}"
            for items in check_entries(qconfig_dict.get(key, []), argument, size, listed, entry):
                setter(mapping, *items)
        return mapping

    def to_json(self) -> str:
        """The JSON form (see ``fxquant.config.serialize``).

        Example:
            >>> QConfigMapping().to_json()[:7]
            '{"": nu'
        """
        return serialize.to_json(self.to_dict(), _MAPPING_JSON)

    @classmethod
    def from_json(cls, text: str) -> QConfigMapping:
        """Build from :meth:`to_json`'s output, resolving names only in trusted modules.

        Example:
            >>> QConfigMapping.from_json('{"": null}').global_qconfig is None
            True
        """
        return cls.from_dict(serialize.from_json(text, "QConfigMapping", _MAPPING_JSON))

    def __repr__(self) -> str:
        entries = {k: v for k, v in self.to_dict().items() if v}
        return f"QConfigMapping({entries!r})"


# ---------------------------------------------------------------- the JSON form
# the codecs of the dict form's keys; config/serialize.py's to_json/from_json apply them


def _entry_codec(object_positions: tuple[int, ...]) -> serialize.Codec:
    """An entry ``(key..., qconfig)``: the items at ``object_positions`` are object types."""

    def encode(entry: tuple[Any, ...], path: str) -> list[Any]:
        *keys, qconfig = entry
        encoded = [
            serialize.encode_op(key, f"{path}[{i}]") if i in object_positions else key
            for i, key in enumerate(keys)
        ]
        return [*encoded, serialize.encode_qconfig(qconfig, f"{path}[{len(keys)}]")]

    def decode(data: object, path: str) -> tuple[Any, ...]:
        *keys, qconfig = serialize.json_list(data, path) or [None]
        decoded = [
            serialize.decode_op(key, f"{path}[{i}]") if i in object_positions else key
            for i, key in enumerate(keys)
        ]
        return (*decoded, serialize.decode_qconfig(qconfig, f"{path}[{len(keys)}]"))

    return (encode, decode)


# the levels with entries, lowest priority first: dict key -> (the positions of object types
# in an entry ``(key..., qconfig)``, the entry's length, the setter from_dict calls with an
# entry); a level's entries are the attribute ``<key>_qconfigs``
_LEVELS: Final[dict[str, tuple[tuple[int, ...], int, Callable[..., QConfigMapping]]]] = {
    OBJECT_TYPE_KEY: ((0,), 2, QConfigMapping.set_object_type),
    MODULE_NAME_REGEX_KEY: ((), 2, QConfigMapping.set_module_name_regex),
    MODULE_NAME_KEY: ((), 2, QConfigMapping.set_module_name),
    MODULE_NAME_OBJECT_TYPE_ORDER_KEY: ((1,), 4, QConfigMapping.set_module_name_object_type_order),
}
DICT_KEYS: Final = (GLOBAL_KEY, *_LEVELS)
_MAPPING_JSON: Final[serialize.Codecs] = {
    GLOBAL_KEY: (serialize.encode_qconfig, serialize.decode_qconfig),
    **{key: serialize.list_codec(_entry_codec(o)) for key, (o, _, _) in _LEVELS.items()},
}
