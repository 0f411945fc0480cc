"""A seeded fuzzer of configs: valid JSON and dict forms, mutated (#18 item 4).

Every case is a valid config of a real backend (or a custom config) with one to three
mutations: wrong types, NaN/inf, huge and negative numbers, unknown and missing keys,
hostile names, deep nesting, bad bytes, odd strings. Loading a case must either work
or raise an fxquant error (``FxquantError``: ConfigError, ConfigTypeError,
UnsafeNameError...); anything else is an *unrelated* exception, a bug.

``tests/config/test_fuzz.py`` runs a fast slice; ``nox -s fuzz`` runs 20,000 cases::

    python -m tests.config.fuzz --cases 20000 --seed 0
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from fxquant.config import (
    BackendConfig,
    ConvertCustomConfig,
    FuseCustomConfig,
    PrepareCustomConfig,
    QConfigMapping,
)
from fxquant.errors import FxquantError

from tests.config.test_hostile_names import hostile_names

_NUMBERS: tuple[Any, ...] = (
    math.nan,
    math.inf,
    -math.inf,
    0,
    -1,
    1,
    -0.0,
    0.5,
    2.0,
    10**30,
    -(10**30),
    2**63,
    1e308,
    -1e-320,
    255,
    256,
    -129,
    2048,
    10**12,
)
_STRINGS: tuple[Any, ...] = (
    "",
    "x",
    "torch.quint8",
    "torch.float32",
    "per_tensor_affine",
    "OUTPUT_SHARE_OBSERVER_WITH_INPUT",
    "\x00",
    "\udcff",
    "ümlaut",
    "a" * 10_000,
    "relu",
    "(",
    "[a-",
    ".*",
    "1",
)
_SHAPES: tuple[Any, ...] = (None, True, False, [], {}, [[]], [None], {"": None}, {"module": "x"})


@dataclass(frozen=True)
class Case:
    """One fuzzed input: which loader reads it, and what it is given."""

    loader: str
    payload: Any
    mutations: tuple[str, ...]


def _seeds() -> list[tuple[str, Any]]:
    """Valid configs to mutate: (loader, payload) in JSON and dict forms."""
    import fxquant

    found: list[tuple[str, Any]] = []
    for name in fxquant.list_backends():
        try:
            backend = fxquant.get_backend_config(name)
            text = backend.to_json()
        except FxquantError:  # a backend whose configs cannot be written (a local fuser)
            continue
        configs = json.loads(text)["configs"]
        for start in range(0, len(configs), 8):  # small documents: mutations hit more of them
            part = {"name": name, "configs": configs[start : start + 8]}
            found.append(("backend_json", part))
        found.append(("backend_dict", backend))
        for is_qat in (False, True):
            try:
                mapping = fxquant.get_default_qconfig_mapping(name, is_qat=is_qat)
                found.append(("mapping_json", json.loads(mapping.to_json())))
                found.append(("mapping_dict", mapping))
            except FxquantError:
                continue
    prepare = (
        PrepareCustomConfig()
        .set_non_traceable_module_names(["body"])
        .set_non_traceable_module_classes([torch.nn.LSTM])
        .set_input_quantized_indexes([0])
        .set_output_quantized_indexes([0])
        .set_preserved_attributes(["attr"])
    )
    found += [
        ("prepare_dict", prepare.to_dict()),
        ("convert_dict", ConvertCustomConfig().set_preserved_attributes(["a"]).to_dict()),
        ("fuse_dict", FuseCustomConfig().set_preserved_attributes(["a"]).to_dict()),
    ]
    return found


def _dict_form(loader: str, seed: Any) -> Any:
    if loader == "backend_dict":
        return seed.to_dict()
    if loader == "mapping_dict":
        return seed.to_dict()
    return copy.deepcopy(seed)


def _paths(tree: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if len(prefix) > 30:  # inside an earlier deep nesting: deep enough
        return found
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            found += _paths(value, (*prefix, index))
    return found


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def _set(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = _get(tree, path[:-1])
    if isinstance(parent, tuple):  # dict forms hold tuples: rebuild the parent
        items = list(parent)
        items[path[-1]] = value
        return _set(tree, path[:-1], tuple(items))
    parent[path[-1]] = value
    return tree


def _nested(depth: int, leaf: Any, rng: random.Random) -> Any:
    for _ in range(depth):
        leaf = [leaf] if rng.random() < 0.5 else {"k": leaf}
    return leaf


class _Odd:
    """An object of no config type (a dict form may hold any Python object)."""

    def __repr__(self) -> str:
        return "<odd>"


def _python_values() -> tuple[Any, ...]:
    return (
        _Odd(),
        lambda x: x,
        torch.nn.Linear,
        torch.nn.Linear(1, 1),
        torch.tensor([1.0]),
        torch.float32,
        object,
        (1, 2),
        {1, 2},
        b"bytes",
        type,
        print,
    )


def _mutate(tree: Any, rng: random.Random, python: bool) -> tuple[Any, str]:
    paths = _paths(tree)
    path = rng.choice(paths)
    target = _get(tree, path)
    kind = rng.choice(
        ["type", "number", "string", "unknown_key", "drop_key", "name", "nest", "shape"]
        + (["python"] if python else [])
    )
    if kind in ("type", "shape"):
        value: Any = copy.deepcopy(rng.choice(_SHAPES))
    elif kind == "number":
        value = rng.choice(_NUMBERS)
    elif kind == "string":
        value = rng.choice(_STRINGS)
    elif kind == "python":
        value = rng.choice(_python_values())
    elif kind == "name":
        module, name = rng.choice(hostile_names())
        value = {"module": module, "name": name}
        if isinstance(target, dict) and "module" in target and rng.random() < 0.5:
            value = {**target, "name": name} if rng.random() < 0.5 else {**target, "module": module}
    elif kind == "nest":
        depth = rng.choice([3, 50, 600, 1200, 5000])
        if depth > 100 and not python:  # json.dumps cannot write it: spliced into the text
            value = f"@@nest{depth}@@"
        else:
            value = _nested(min(depth, 200), target, rng)  # replaces target: no copy needed
    elif kind == "unknown_key" and isinstance(target, dict):
        key = rng.choice(["bogus", "", "__class__", "pattern ", "kwargs", "\x00"])
        target[key] = copy.deepcopy(rng.choice(_NUMBERS + _SHAPES))
        return tree, f"unknown_key at {path}"
    elif kind == "drop_key" and isinstance(target, dict) and target:
        del target[rng.choice(list(target))]
        return tree, f"drop_key at {path}"
    else:
        value = copy.deepcopy(rng.choice(_NUMBERS + _STRINGS + _SHAPES))
    return _set(tree, path, value), f"{kind} at {path}"


def _bad_bytes(text: str, rng: random.Random) -> tuple[bytes, str]:
    data = bytearray(text.encode("utf-8"))
    choice = rng.choice(["flip", "insert", "truncate", "latin1", "bom", "utf16"])
    if choice == "flip" and data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif choice == "insert":
        data[rng.randrange(len(data) + 1) : 0] = bytes([rng.choice([0xFF, 0xC0, 0x80, 0x00])])
    elif choice == "truncate":
        data = data[: rng.randrange(len(data) + 1)]
    elif choice == "latin1":
        data = text.replace('"', '"\xe9', 1).encode("latin-1", "replace")
        return data, choice
    elif choice == "bom":
        data = bytearray(b"\xef\xbb\xbf" + bytes(data))
    else:
        return text.encode("utf-16"), choice
    return bytes(data), choice


def _splice_nesting(text: str) -> str:
    while "@@nest" in text:
        start = text.index('"@@nest')
        end = text.index('@@"', start + 7)
        depth = int(text[start + 7 : end])
        text = text[:start] + "[" * depth + "1" + "]" * depth + text[end + 3 :]
    return text


def generate(count: int, seed: int = 0) -> list[Case]:
    """``count`` fuzzed cases, the same for the same seed."""
    rng = random.Random(seed)
    seeds = _seeds()
    cases = []
    by_loader: dict[str, list[Any]] = {}
    for loader, original in seeds:
        by_loader.setdefault(loader, []).append(original)
    loaders = sorted(by_loader)
    for _ in range(count):
        loader = rng.choice(loaders)  # each loader as often, however many seeds it has
        original = rng.choice(by_loader[loader])
        tree = _dict_form(loader, original)
        python = loader.endswith("_dict")
        mutations = []
        for _ in range(rng.randint(1, 3)):
            tree, what = _mutate(tree, rng, python)
            mutations.append(what)
        if loader.endswith("_json"):
            text = _splice_nesting(json.dumps(tree))  # NaN/Infinity: json.loads reads them
            if rng.random() < 0.15:
                payload, what = _bad_bytes(text, rng)
                mutations.append(f"bytes {what}")
                cases.append(Case(loader, payload, tuple(mutations)))
                continue
            cases.append(Case(loader, text, tuple(mutations)))
        else:
            cases.append(Case(loader, tree, tuple(mutations)))
    return cases


_LOADERS: dict[str, Callable[[Any], Any]] = {
    "backend_json": BackendConfig.from_json,
    "mapping_json": QConfigMapping.from_json,
    "backend_dict": BackendConfig.from_dict,
    "mapping_dict": QConfigMapping.from_dict,
    "prepare_dict": PrepareCustomConfig.from_dict,
    "convert_dict": ConvertCustomConfig.from_dict,
    "fuse_dict": FuseCustomConfig.from_dict,
}


def run(case: Case) -> BaseException | None:
    """Load ``case``; the exception when it is not an fxquant error, else None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unknown keys warn (#22): not a failure
            _LOADERS[case.loader](case.payload)
    except FxquantError:
        return None
    except Exception as error:  # the point: anything else is a finding
        return error
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer; print the unrelated exceptions; exit 1 when there is any."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="tracebacks to print")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    cases = generate(args.cases, args.seed)
    failures: list[tuple[Case, BaseException]] = []
    for case in cases:
        error = run(case)
        if error is not None:
            failures.append((case, error))
    kinds = Counter(f"{type(e).__name__} ({c.loader})" for c, e in failures)
    for case, error in failures[: args.show]:
        print(f"--- {case.loader}: {case.mutations}", file=sys.stderr)
        traceback.print_exception(error, limit=-3, file=sys.stderr)
    seconds = time.perf_counter() - start
    print(
        f"fuzzed {len(cases)} configs (seed {args.seed}) in {seconds:.0f} s: "
        f"{len(failures)} unrelated exceptions {dict(kinds)}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
