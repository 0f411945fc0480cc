"""Developer sessions: `nox -s dev`, `tests`, `lint`, `typecheck`, `docs`, `demo`, `bench`,
`plugin`, `fuzz`, `install`, `zoo`, `matrix`.

Every session that needs torch installs ``torch==2.13.0`` first and explicitly:
an unpinned torch (asked for directly or through a dependency's range) pulls
several GB of CUDA packages.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
TORCH = "torch==2.13.0"
sys.path.insert(0, os.fspath(ROOT))  # the install commands' module: stdlib only
from tests.install_commands import (  # noqa: E402
    PLUGINS,
    dependencies_first,
    development_install,
    local_plugins,
)


def _is_backend(name: str) -> bool:
    """The plugin registers a backend (an ``fxquant.backends`` entry point); libraries and
    optional parts (quantized-engine, distributed) do not."""
    meta = tomllib.loads((ROOT / "plugins" / name / "pyproject.toml").read_text())
    return "fxquant.backends" in meta["project"].get("entry-points", {})


BACKENDS = [name for name in PLUGINS if _is_backend(name)]

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True


TORCHVISION = "torchvision==0.28.0"
TORCHVISION_NEEDS = ("pillow>=10", "numpy")


def install_torchvision(session: nox.Session) -> None:
    """torchvision for the zoo's models, without its dependencies: it requires an unpinned
    torch (CUDA's GBs), and a pyproject extra cannot say ``--no-deps``. Its import on the CPU
    torch needs two op schemas defined first (tests/zoo/torchvision_models.py)."""
    session.install("--no-deps", TORCHVISION)
    # its own requirements but torch: without Pillow `import torchvision` fails, and then so
    # does every transformers import (transformers imports torchvision when it is installed)
    session.install(*TORCHVISION_NEEDS)


def install_core(session: nox.Session, *extras: str) -> None:
    # pinned first: an unpinned torch pulls GBs of CUDA packages. numpy because torch's
    # wheel does not require it yet warns on import without it.
    session.install(TORCH, "numpy")
    target = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", target)


def workers() -> str:
    """pytest-xdist's worker count: one per CPU this process may use (2 on CI)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return str(max(1, cpus or 1))


def _develop_in(session: nox.Session, venv: Path) -> None:
    """Set ``venv`` up for development: pinned torch first, then :func:`development_install`."""
    with session.chdir(ROOT):  # the arguments are folders of the clone
        _venv_run(session, venv, "pip", "install", TORCH, "numpy")
        _venv_run(session, venv, "pip", "install", *development_install())
        # the zoo's torchvision models, as `tests` has them (install_torchvision: no deps)
        _venv_run(session, venv, "pip", "install", "--no-deps", TORCHVISION)
        _venv_run(session, venv, "pip", "install", *TORCHVISION_NEEDS)


@nox.session(python="3.11")
def dev(session: nox.Session) -> None:
    """A virtualenv for development, ``.venv`` (or the folder given: ``nox -s dev -- PATH``):
    torch==2.13.0, then the core and every plugin installed editable, dependencies first, with
    the test and docs extras. Edits under core/ and plugins/ take effect without reinstalling.
    Then ``. .venv/bin/activate`` and ``fxquant demo``, ``pytest``.
    """
    venv = Path(session.posargs[0] if session.posargs else ROOT / ".venv").resolve()
    session.run("python", "-m", "venv", os.fspath(venv))  # from nox's python 3.11
    _develop_in(session, venv)
    _venv_run(session, venv, "fxquant", "backends")
    shown = venv.relative_to(ROOT) if venv.is_relative_to(ROOT) else venv
    session.log(f"ready: . {shown / 'bin' / 'activate'}")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """Core tests and doctests with coverage (every plugin installed), then each plugin's tests.

    The docs extra too: tests/docs builds the site with ``mkdocs build --strict`` and runs
    every code block of it, so a broken page fails CI (FXQUANT_DOCS_REQUIRED: not a skip).

    One pytest-xdist worker per CPU, a test file per worker (``--dist loadfile``: a file's
    module fixtures are built once, its tests run in order). Property tests run the "quick"
    hypothesis profile (20 examples); ``nox -s fuzz`` reruns them under the full one.
    """
    install_core(session, "test", "docs")
    if PLUGINS:  # one pip call: plugins that build on each other resolve locally
        session.install(*(f"-e./plugins/{name}[test]" for name in dependencies_first()))
    install_torchvision(session)  # the zoo's torchvision models in tests/invariants
    env = {"OMP_NUM_THREADS": "1", "FXQUANT_HYPOTHESIS_PROFILE": "quick"}
    parallel = ["-n", workers(), "--dist", "loadfile"]
    session.run(
        "pytest",
        "tests",
        "core/fxquant",
        *parallel,
        "--cov=fxquant",
        "--cov-report=term",
        *session.posargs,
        env={**env, "FXQUANT_DOCS_REQUIRED": "1"},
    )
    for name in PLUGINS:  # the plugin's tests and its docstring examples (src/)
        session.run("pytest", f"plugins/{name}", *parallel, env=env)


@nox.session(python="3.11")
def fuzz(session: nox.Session) -> None:
    """The long runs of the robustness suites (#18): 20,000 fuzzed configs, the hostile-name
    suite, 100 fresh processes racing register_plugin against list_backends, and every
    property test (``@given``) of the core and the plugins under the full hypothesis profile.

    ``nox -s tests`` runs a fast slice of each. ``nox -s fuzz -- --cases 50000 --seed 3``
    passes its arguments to the fuzzer.
    """
    install_core(session, "test")
    if PLUGINS:  # the fuzzer mutates every installed backend's configs
        session.install(*(f"-e./plugins/{name}[test]" for name in dependencies_first()))
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.fspath(ROOT)}
    session.run(
        "python", "-m", "tests.config.fuzz", *(session.posargs or ["--cases", "20000"]), env=env
    )
    session.run(
        "pytest",
        "tests/config/test_hostile_names.py",
        "tests/registry/test_threads.py",
        "-p",
        "no:cacheprovider",
        env={**env, "FXQUANT_RACE_PROCESSES": "100"},
    )
    # the property tests, full profile ("tests" runs them with 20 examples each); exit code 5:
    # a plugin without any
    full = {**env, "FXQUANT_HYPOTHESIS_PROFILE": "default"}
    session.run("pytest", "tests", "-m", "hypothesis", "-n", workers(), env=full)
    for name in PLUGINS:
        session.run(
            "pytest", f"plugins/{name}/tests", "-m", "hypothesis", env=full, success_codes=[0, 5]
        )


@nox.session(python="3.11")
@nox.parametrize("name", PLUGINS)
def plugin(session: nox.Session, name: str) -> None:
    """One plugin alone with the core in a fresh venv: its dependencies are its own."""
    session.install(TORCH, "numpy")
    *deps, _ = local_plugins(name)
    session.install(".", *(f"./plugins/{dep}" for dep in deps), f"./plugins/{name}[test]")
    session.run("pytest", f"plugins/{name}/tests", env={"OMP_NUM_THREADS": "1"})


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install("ruff==0.17.6")  # pinned: formatting must not change under our feet
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy --strict on core/."""
    install_core(session)
    session.install("mypy")
    session.run("mypy", "core/fxquant")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """The documentation site, built with --strict (every warning fails) into site/.

    Every plugin is installed: the backend pages are generated from them at build time.
    ``nox -s docs -- serve`` serves it with live reload instead.
    """
    install_core(session, "docs")
    if PLUGINS:
        session.install(*(f"-e./plugins/{name}" for name in dependencies_first()))
    command = session.posargs or ["build"]
    session.run("mkdocs", *command, "--strict", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """The main job: `fxquant demo` with every installed backend."""
    install_core(session)
    if PLUGINS:
        session.install(*(f"-e./plugins/{name}" for name in dependencies_first()))
    session.run("fxquant", "demo", *session.posargs)


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks: a table per benchmark and JSON under bench/results/, then one summary table
    (bench/summary.py) and its plot, docs/img/benchmarks.png. Not part of ``tests``. Each table
    follows a line with the CPU's ISA flags and the load (bench/harness.py); the x86 precision
    table (bench/bench_x86_precisions.py) runs twice: as the CPU is, and with its ISA capped to
    AVX2 (``--isa-cap avx2``: issue 31's target against fp32 ``torch.compile`` without bf16).

    ``nox -s bench -- --quick`` is a smoke run (small models; the summary reads only full runs).
    """
    install_core(session, "bench")  # matplotlib for the plot, transformers for BertModel
    if PLUGINS:
        session.install(*(f"-e./plugins/{name}" for name in dependencies_first()))
        session.install("-e./plugins/x86[pt2e]")  # torchao: bench_compiled_x86.py's pt2e side
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.fspath(ROOT)}
    machine = os.fspath(ROOT / "bench" / "harness.py")  # the ISA flags and load before each table
    for script in sorted((ROOT / "bench").glob("bench_*.py")):
        session.run("python", machine, env=env)
        session.run("python", os.fspath(script), *session.posargs, env=env)
    # issue 31's no-bfloat16 target, on this CPU with oneDNN, ATen, inductor and MKL held to AVX2
    precisions = os.fspath(ROOT / "bench" / "bench_x86_precisions.py")
    session.run("python", precisions, "--isa-cap", "avx2", *session.posargs, env=env)
    # the real pretrained transformer of issue 23, every backend's deployment (offline weights)
    accuracy = ROOT / "bench" / "accuracy_transformer.py"
    session.run("python", os.fspath(accuracy), *session.posargs, env={**env, "HF_HUB_OFFLINE": "1"})
    session.run("python", os.fspath(ROOT / "bench" / "summary.py"), env=env)


@nox.session(python="3.11")
def zoo(session: nox.Session) -> None:
    """The model zoo of issues 20 and 30: 46 architectures on every backend, next to torch.ao on the
    CPU backends (bench/zoo.py): bench/results/zoo.json and zoo.md, docs/img/zoo.png. About
    an hour on two cores; not part of ``tests`` (which runs tests/zoo/test_zoo.py's subset).

    ``nox -s zoo -- --models resnet,bert --backends x86`` reruns some rows.
    """
    install_core(session, "bench")  # matplotlib for the plot, transformers for the HF models
    if PLUGINS:
        session.install(*(f"-e./plugins/{name}" for name in dependencies_first()))
    install_torchvision(session)
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.fspath(ROOT), "HF_HUB_OFFLINE": "1"}
    session.run("python", os.fspath(ROOT / "bench" / "zoo.py"), *session.posargs, env=env)


@nox.session(python="3.11")
def matrix(session: nox.Session) -> None:
    """The whole invariant matrix of issue 30 (tests/invariants/matrix.py): every zoo model x
    installed backend x user move, x86's compiled deployment on the default move; appends each
    cell to bench/results/matrix.jsonl (a rerun goes on with the cells not there) and writes
    docs/guide/matrix.md. Hours on two cores; ``nox -s tests`` runs a seeded slice of it.
    ``nox -s matrix -- --models resnet,bert --backends x86``.
    """
    install_core(session, "test", "bench")
    if PLUGINS:
        session.install(*(f"-e./plugins/{name}[test]" for name in dependencies_first()))
    install_torchvision(session)
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.fspath(ROOT), "HF_HUB_OFFLINE": "1"}
    session.run("python", "-m", "tests.invariants.matrix", *session.posargs, env=env)


# what `nox -s install` checks in each venv after the documented installs: every backend
# they installed loads, and x86 quantizes and lowers a model
_USE_BACKENDS = """
import sys, torch, fxquant
expected = set(sys.argv[1:])
names = set(fxquant.list_backends())
assert expected <= names, (expected, names)
for name in sorted(expected):
    fxquant.get_backend_config(name)
if "x86" in expected:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(4, 8)
    prepared = fxquant.prepare_fx(model, fxquant.get_default_qconfig_mapping(), (x,),
                                  backend_config=fxquant.get_backend_config("x86"))
    prepared(x)
    converted = fxquant.convert_fx(prepared)
    statuses = {e.status.value for e in fxquant.explain(converted, show=False).entries()}
    assert "lowered" in statuses, statuses
    assert (converted(x) - model(x)).abs().max() < 0.1
print("ok:", ", ".join(sorted(names)))
"""

_HINT = """
import sys, fxquant
name = sys.argv[1]
try:
    fxquant.get_backend_config(name)
except KeyError as error:
    print(str(error).split("to install it: ", 1)[1].split(";", 1)[0])
"""


# every module named imports from the clone (an editable install), not from site-packages
_FROM_CLONE = """
import importlib, pathlib, sys
root = pathlib.Path(sys.argv[1]).resolve()
for name in sys.argv[2:]:
    where = pathlib.Path(importlib.import_module(name).__file__).resolve()
    assert where.is_relative_to(root), f"{name} imports from {where}, not from {root}"
print("editable:", ", ".join(sys.argv[2:]))
"""


def _modules(plugins: list[str]) -> list[str]:
    """``fxquant`` and the import name of each plugin folder (``quantized-engine`` ->
    ``fxquant_quantized_engine``)."""
    return ["fxquant", *(f"fxquant_{name.replace('-', '_')}" for name in plugins)]


def _fresh_venv(session: nox.Session, name: str) -> Path:
    """A new, empty virtualenv under the session's tmp folder (never reused: clean)."""
    path = Path(session.create_tmp()).resolve() / name  # absolute: steps run from other folders
    shutil.rmtree(path, ignore_errors=True)
    session.run("python", "-m", "venv", os.fspath(path))
    return path


def _venv_run(session: nox.Session, venv: Path, *args: str, **kwargs: object) -> object:
    return session.run(os.fspath(venv / "bin" / args[0]), *args[1:], external=True, **kwargs)


@nox.session(python="3.11")
def install(session: nox.Session) -> None:
    """Every install command of README.md, docs/, the plugins' READMEs and the error hints,
    each in a clean venv, then what it installed is imported and used. Minutes: not in
    ``tests`` (tests/docs/test_install_commands.py checks, fast, that the commands it runs
    are the ones the files print).

    Four venvs: the development command (``nox -s dev``'s installs: every module then
    imports from the clone), the clone forms in doc order
    (``pip install . plugins/quantized-engine plugins/onednn plugins/x86``),
    the hint an error prints for a missing backend (core alone, then the hint's command),
    and the index forms (``pip install fxquant-x86``) against wheels built from the clone.
    """
    from tests.install_commands import SCAFFOLDS, SKIPPED, documented_commands

    commands = documented_commands()
    for command in commands:
        if command.kind == "skipped":
            session.log(f"not run: {command.text} ({command.source}): {SKIPPED[command.text]}")

    # 0. the development command: every distribution editable, so each imports from the clone
    venv = _fresh_venv(session, "dev")
    _develop_in(session, venv)
    _venv_run(session, venv, "python", "-c", _FROM_CLONE, os.fspath(ROOT), *_modules(PLUGINS))
    _venv_run(session, venv, "python", "-c", _USE_BACKENDS, *BACKENDS)

    # 1. the clone forms, in the order the pages give them, from the clone's root
    venv = _fresh_venv(session, "clone")
    _venv_run(session, venv, "pip", "install", TORCH, "numpy")  # pinned first (see above)
    scaffolds = Path(session.create_tmp()).resolve() / "scaffolds"  # relative targets go here
    shutil.rmtree(scaffolds, ignore_errors=True)
    scaffolds.mkdir()
    for command in commands:
        if command.kind not in ("clone", "scaffold"):
            continue
        session.log(f"{command.source}: {command.text}")
        if command.kind == "clone":
            _venv_run(session, venv, "pip", "install", *command.arguments)
            continue
        target = next(a for a in command.arguments if a.rstrip("/") in SCAFFOLDS)
        setup = SCAFFOLDS[target.rstrip("/")]
        with session.chdir(scaffolds if target.startswith(".") else ROOT):
            shutil.rmtree(target, ignore_errors=True)
            _venv_run(session, venv, *setup.split())  # fxquant new-backend writes the folder
            _venv_run(session, venv, "pip", "install", *command.arguments)
    _venv_run(session, venv, "fxquant", "backends")
    _venv_run(session, venv, "python", "-c", _USE_BACKENDS, *BACKENDS, "mybackend", "mychip")
    # the plugin commands (-e .) kept the core editable: edits under core/ still take effect
    _venv_run(session, venv, "python", "-c", _FROM_CLONE, os.fspath(ROOT), "fxquant")

    # 2. the hint of an error: the core alone, then the command its message prints
    venv = _fresh_venv(session, "hint")
    _venv_run(session, venv, "pip", "install", TORCH, "numpy", ".")
    for name in ("x86", "fbgemm"):
        output = str(_venv_run(session, venv, "python", "-c", _HINT, name, silent=True))
        hint = next(line for line in output.splitlines() if line.startswith("pip install "))
        session.log(f"the error for {name!r} says: {hint}")
        assert hint.startswith("pip install "), hint
        _venv_run(session, venv, *hint.split())
    _venv_run(session, venv, "python", "-c", _USE_BACKENDS, "x86", "fbgemm", "onednn")

    # 3. the index forms, against wheels built from the clone
    wheels = Path(session.create_tmp()).resolve() / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    session.run(
        "python",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "-w",
        os.fspath(wheels),
        ".",
        *(f"plugins/{name}" for name in PLUGINS),
    )
    venv = _fresh_venv(session, "index")
    _venv_run(session, venv, "pip", "install", TORCH, "numpy")
    for command in commands:
        if command.kind == "index":
            session.log(f"{command.source}: {command.text} (from the clone's wheels)")
            _venv_run(
                session,
                venv,
                "pip",
                "install",
                "--find-links",
                os.fspath(wheels),
                *command.arguments,
            )
    _venv_run(session, venv, "python", "-c", _USE_BACKENDS, *BACKENDS)
