"""The argument checks the config classes share: numbers, names, module classes, dict forms.

A number from a JSON file or a dict may be NaN, infinite, negative or a bool; each
check raises at the constructor, naming the argument, the value and what is expected,
so that a bad value never reaches a scale (``eps=nan`` gave all-NaN outputs,
``averaging_constant=2.0`` an error of 1.77, a NaN bound switched a constraint off).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from numbers import Real
from typing import Any

import torch

from fxquant.errors import ConfigError, ConfigTypeError, ConfigWarning, wrong_type

__all__ = [
    "check_dict_form",
    "check_entries",
    "check_flag",
    "check_integer",
    "check_module_class",
    "check_real",
    "check_str",
    "check_unit_interval",
    "unknown_keys",
]


def check_real(
    value: object, argument: str, *, positive: bool = False, optional: bool = False
) -> float | None:
    """A finite real number (``positive``: also > 0); ``optional`` lets ``None`` through.

    Raises:
        ConfigTypeError: for a non-number (a bool or a string included).
        ConfigError: for NaN, an infinity, or a value <= 0 when ``positive``.

    Example:
        >>> check_real(2**-12, "eps", positive=True)
        0.000244140625
        >>> check_real(float("nan"), "eps", positive=True)
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: eps=nan: expected a finite number > 0
    """
    if value is None and optional:
        return None
    wanted = "a finite number > 0" if positive else "a finite number"
    if isinstance(value, bool) or not isinstance(value, Real):
        msg = f"{argument}={value!r}: expected {wanted}, got {type(value).__name__}"
        raise ConfigTypeError(msg)
    number = float(value)
    if not math.isfinite(number) or (positive and number <= 0):
        msg = f"{argument}={value!r}: expected {wanted}"
        raise ConfigError(msg)
    return number


def check_unit_interval(value: object, argument: str) -> float:
    """A number in ``(0, 1]`` (a moving average's weight of the newest batch).

    Example:
        >>> check_unit_interval(2.0, "averaging_constant")
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: averaging_constant=2.0: expected a number in (0, 1]
    """
    number = check_real(value, argument)
    assert number is not None  # not optional
    if not 0 < number <= 1:
        msg = f"{argument}={value!r}: expected a number in (0, 1]"
        raise ConfigError(msg)
    return number


def check_integer(
    value: object, argument: str, *, minimum: int | None = None, optional: bool = False
) -> int | None:
    """An int (not a bool, not a float), at least ``minimum`` when given.

    Example:
        >>> check_integer(0, "bins", minimum=1)
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: bins=0: expected an integer >= 1
    """
    if value is None and optional:
        return None
    wanted = "an integer" if minimum is None else f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{argument}={value!r}: expected {wanted}, got {type(value).__name__}"
        raise ConfigTypeError(msg)
    if minimum is not None and value < minimum:
        msg = f"{argument}={value!r}: expected {wanted}"
        raise ConfigError(msg)
    return int(value)


def check_flag(value: object, argument: str) -> bool:
    """A bool (0 and 1 too, as torch.ao scripts pass them).

    Example:
        >>> check_flag("yes", "reduce_range")
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigTypeError: reduce_range='yes': expected True or False, got str
    """
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    msg = f"{argument}={value!r}: expected True or False, got {type(value).__name__}"
    raise ConfigTypeError(msg)


def unknown_keys(
    data: Iterable[str], valid: tuple[str, ...], owner: str, strict: bool, *, stacklevel: int = 4
) -> None:
    """Warn once about keys of ``data`` (a dict form) outside ``valid`` (raise when ``strict``).

    torch.ao ignores keys it does not know, so a saved torch.ao dict with a stray key
    loads there: it loads here too, with one warning naming the keys. ``stacklevel`` is
    :func:`warnings.warn`'s, counted from here: the default points at the caller of a
    ``from_dict`` that calls the function calling this one.

    Raises:
        ConfigError: ``strict`` and an unknown key.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     unknown_keys({"x": 1}, ("y",), "Config.from_dict", strict=False)
        >>> str(caught[0].message)[:60]
        "Config.from_dict: unknown key(s) 'x' at Config.from_dict['x'"
    """
    unknown = [k for k in data if k not in valid]
    if not unknown:
        return
    where = ", ".join(f"{owner}[{k!r}]" for k in unknown)
    found = f"{owner}: unknown key(s) {', '.join(map(repr, unknown))} at {where}"
    listed = ", ".join(map(repr, valid))
    if strict:
        msg = f"{found}; valid keys: {listed}"
        raise ConfigError(msg)
    msg = (
        f"{found} ignored, as torch.ao does; valid keys: {listed} (strict=True makes this an error)"
    )
    warnings.warn(msg, ConfigWarning, stacklevel=stacklevel)


def check_str(value: object, argument: str) -> str:
    """A str.

    Example:
        >>> check_str(3, "module_name")
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigTypeError: module_name must be a str, got 3 of type int
    """
    if isinstance(value, str):
        return value
    raise wrong_type(value, argument, "a str")


def check_module_class(value: object, argument: str, *, optional: bool = False) -> Any:
    """A ``torch.nn.Module`` subclass (the class, not an instance); ``optional``: None too.

    Example:
        >>> check_module_class(torch.nn.Linear(1, 1), "root_module")
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigTypeError: root_module must be a torch.nn.Module subclass ...
    """
    if (value is None and optional) or (
        isinstance(value, type) and issubclass(value, torch.nn.Module)
    ):
        return value
    expected = "a torch.nn.Module subclass (the class, not an instance)"
    raise wrong_type(value, argument, f"{expected} or None" if optional else expected)


def check_dict_form(data: object, owner: str) -> Mapping[str, Any]:
    """The dict form a ``from_dict`` of class ``owner`` got, refused when it is no dict.

    Example:
        >>> check_dict_form([], "Config")
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigTypeError: Config.from_dict expects a dict, got [] of type list
    """
    if not isinstance(data, Mapping):
        msg = f"{owner}.from_dict expects a dict, got {data!r} of type {type(data).__name__}"
        raise ConfigTypeError(msg)
    return data


def check_entries(
    value: object, argument: str, size: int, listed: str, entry: str
) -> Iterator[Any]:
    """The entries of a dict form's list of tuples, each checked as it is reached.

    Args:
        value: the list (or tuple) of entries.
        argument: its name in the messages (``argument[i]`` for an entry).
        size: the length every entry (a tuple or list) must have.
        listed: what the list must be, for a value that is none.
        entry: what an entry must be, for one that is not.

    Raises:
        ConfigTypeError: ``value`` is not a list or tuple.
        ConfigError: an entry is not a tuple or list of ``size`` items.

    Example:
        >>> list(check_entries([("a", 1)], "module_name", 2, "a list", "a pair"))
        [('a', 1)]
        >>> list(check_entries([("a",)], "module_name", 2, "a list", "a pair"))
        Traceback (most recent call last):
        ...
        fxquant.errors.ConfigError: module_name[0] must be a pair, got ('a',)
    """
    if not isinstance(value, (list, tuple)):
        raise wrong_type(value, argument, listed)
    for i, item in enumerate(value):
        if not isinstance(item, (tuple, list)) or len(item) != size:
            msg = f"{argument}[{i}] must be {entry}, got {item!r}"
            raise ConfigError(msg)
        yield item
