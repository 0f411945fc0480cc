"""How to install a backend, as a command that works where fxquant runs.

The plugins are not on a package index yet: ``pip install fxquant-x86`` fails,
and so does ``pip install plugins/x86`` alone (x86 depends on the local
``fxquant-onednn`` and ``fxquant-quantized-engine``, which pip then looks for on an
index). When the core runs from a source checkout (``core/fxquant`` next to
``plugins/``), the hint names the plugin folders to install together, dependencies
first; otherwise it names the distribution, as an index would serve it::

    from a checkout:  pip install /path/to/fxquant/plugins/quantized-engine
                          /path/to/fxquant/plugins/onednn /path/to/fxquant/plugins/x86
    elsewhere:        pip install fxquant-x86

docs/getting-started.md shows the same commands, relative to the checkout,
and ``nox -s install`` runs them in a clean venv.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import urllib.parse
from pathlib import Path

__all__ = ["checkout_root", "install_command", "install_hint", "local_plugin_folders"]

_DEPENDENCY = re.compile(r"""["']fxquant-([\w-]+)\s*[<>=!~;\[,"']""")


def _installed_from() -> Path | None:
    """The folder pip installed the ``fxquant`` distribution from (PEP 610), if any."""
    try:
        text = importlib.metadata.distribution("fxquant").read_text("direct_url.json")
        url = json.loads(text or "{}").get("url", "")
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        return None
    if not isinstance(url, str) or not url.startswith("file://"):
        return None
    return Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))


def checkout_root() -> Path | None:
    """The source checkout the running core comes from, or ``None`` (installed from an index).

    A checkout has ``core/fxquant/`` (this package) and a ``plugins/`` folder beside it:
    the running code's own folder, or the folder pip installed ``fxquant`` from.

    Example:
        >>> root = checkout_root()
        >>> root is None or (root / "plugins").is_dir()
        True
    """
    package = Path(__file__).resolve().parents[1]  # .../core/fxquant
    for root in (package.parents[1], _installed_from()):
        if root is not None and all((root / part).is_dir() for part in ("core/fxquant", "plugins")):
            return root
    return None


def _core_installed() -> bool:
    try:
        importlib.metadata.version("fxquant")
    except importlib.metadata.PackageNotFoundError:
        return False  # running from the source tree (PYTHONPATH): pip must get the core too
    return True


def _local_dependencies(folder: Path) -> list[str]:
    """The first-party plugins (folder names) that the plugin in ``folder`` depends on."""
    text = (folder / "pyproject.toml").read_text()
    block = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.M | re.S)
    names = _DEPENDENCY.findall(block.group(1)) if block else []
    return [n for n in names if (folder.parent / n / "pyproject.toml").is_file()]


def local_plugin_folders(name: str, root: Path) -> list[Path]:
    """The plugin folders to install for backend ``name`` from checkout ``root``, dependencies
    first (``x86`` -> ``[plugins/quantized-engine, plugins/onednn, plugins/x86]``); empty
    when there is no such folder.

    Example:
        >>> root = checkout_root()
        >>> folders = [] if root is None else local_plugin_folders("x86", root)
        >>> root is None or [p.name for p in folders] == ["quantized-engine", "onednn", "x86"]
        True
    """
    folder = root / "plugins" / name
    if not (folder / "pyproject.toml").is_file():
        return []
    found: list[Path] = []
    for dependency in _local_dependencies(folder):
        found += local_plugin_folders(dependency, root)
    return list(dict.fromkeys([*found, folder]))


def install_command(name: str) -> str:
    """The ``pip install`` command that installs backend ``name`` here.

    From a source checkout that has ``plugins/NAME``: its folder and the folders
    of the first-party plugins it depends on, in one command (absolute paths, so
    it runs from any directory), with the checkout itself first when the core
    is not installed in this environment. Otherwise: ``pip install fxquant-NAME``.

    Example:
        >>> install_command("no_such_backend")
        'pip install fxquant-no_such_backend'
    """
    root = checkout_root()
    folders = local_plugin_folders(name, root) if root is not None else []
    if root is not None and folders:
        if not _core_installed():
            folders = [root, *folders]  # the plugins depend on fxquant, not on any index either
        return "pip install " + " ".join(shlex.quote(str(f)) for f in folders)
    return f"pip install fxquant-{name}"


def install_hint(name: str | None = None) -> str:
    """How to install backend ``name`` (or any backend, for ``None``), for error messages.

    Example:
        >>> install_hint("no_such_backend")
        'to install it: pip install fxquant-no_such_backend'
    """
    if name is not None:
        return f"to install it: {install_command(name)}"
    root = checkout_root()
    if root is None:
        return "to install one: pip install fxquant-NAME"
    available = sorted(  # backends only: not a library or an optional part (no entry point)
        p.parent.name
        for p in (root / "plugins").glob("*/pyproject.toml")
        if "fxquant.backends" in p.read_text()
    )
    bases = {name: local_plugin_folders(name, root)[:-1] for name in available}
    needs = [
        f"{name}: {', '.join(f.name for f in found)}" for name, found in bases.items() if found
    ]
    first = f", after the plugins it builds on ({'; '.join(needs)})" if needs else ""
    return (
        f"to install one: pip install {shlex.quote(str(root / 'plugins'))}/NAME{first}; "
        f"this checkout has {', '.join(available)}"
    )
