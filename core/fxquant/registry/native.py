"""The host's native backend: what ``backend_config=None`` means in the flow.

torch.ao's flow takes ``backend_config=None`` as its native backend config, lowered to the
quantized engine of the host: ``x86`` on an x86 CPU (the engine that picks FBGEMM or
oneDNN kernels per op, torch.ao's default engine and ``get_default_qconfig_mapping()``'s
``"x86"``), ``qnnpack`` on ARM. fxquant takes None the same way, among the installed
backends, first found::

    x86 CPU (x86_64, AMD64, i386...)   x86, fbgemm, onednn
    ARM CPU (arm64, aarch64, armv7...)  qnnpack
    none of them installed             reference (no lowering), with a NativeBackendWarning
                                        naming the plugin to install
"""

from __future__ import annotations

import platform
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from fxquant.errors import NativeBackendWarning
from fxquant.registry.install import install_command

__all__ = ["NativeBackend", "host_native_backend", "native_backend"]

_X86 = ("x86_64", "amd64", "x64", "i386", "i486", "i586", "i686", "x86")
_PREFERRED = {
    "x86": ("x86", "fbgemm", "onednn"),
    "ARM": ("qnnpack",),
}
_WHY = {
    "x86": "torch.ao's native engine on x86 CPUs is x86 (FBGEMM or oneDNN per op)",
    "ARM": "torch.ao's native engine on ARM CPUs is QNNPACK",
}


def _family(machine: str) -> str | None:
    name = machine.lower()
    if name in _X86:
        return "x86"
    if name == "aarch64" or name.startswith("arm"):  # arm64, armv7l, armv8l...
        return "ARM"
    return None


@dataclass(frozen=True, slots=True)
class NativeBackend:
    """The backend ``backend_config=None`` resolved to on this host, and why.

    Example:
        >>> choice = native_backend(["fbgemm", "reference", "x86"], "x86_64")
        >>> choice.name
        'x86'
        >>> choice.line()[:64]
        'backend: x86 (backend_config=None: the native backend of this x8'
    """

    name: str
    reason: str
    missing: str | None = None
    """Why no native backend was found, with the plugin to install; ``None`` when found."""

    def line(self) -> str:
        """The line ``fxquant.explain`` prints for the resolution."""
        return f"backend: {self.name} (backend_config=None: {self.reason})"


def native_backend(installed: Sequence[str], machine: str) -> NativeBackend:
    """The native backend of a CPU ``machine`` (``platform.machine()``) among ``installed``.

    Example:
        >>> native_backend(["qnnpack", "reference"], "aarch64").name
        'qnnpack'
        >>> native_backend(["reference"], "riscv64").name
        'reference'
    """
    family = _family(machine)
    if family is None:
        missing = (
            f"no fxquant backend has kernels for this CPU ({machine}): the reference "
            "backend's model lowers nothing and runs slower than float; pass "
            "backend_config=fxquant.get_backend_config(NAME) for the target you deploy to"
        )
        return NativeBackend("reference", f"no native backend for a {machine} CPU", missing)
    for name in _PREFERRED[family]:
        if name in installed:
            why = f"the native backend of this {family} CPU ({machine}): {_WHY[family]}"
            return NativeBackend(name, why)
    wanted = _PREFERRED[family][0]
    missing = (
        f"this {family} CPU's native backend {wanted!r} is not installed, so the reference "
        f"backend is used: its convert_fx model lowers nothing and runs slower than float. "
        f"Install it ({install_command(wanted)}), or pass "
        "backend_config=fxquant.get_backend_config('reference') to mean the reference backend"
    )
    return NativeBackend("reference", f"{wanted!r} is not installed", missing)


def host_native_backend(
    installed: Sequence[str], step: str, *, stacklevel: int = 2
) -> NativeBackend:
    """:func:`native_backend` of this host; warns (``NativeBackendWarning``) when none is found.

    The warning points ``stacklevel`` frames up: the user's flow call (``step``).

    Example:
        >>> host_native_backend(["x86", "qnnpack"], "prepare_fx").name in ("x86", "qnnpack")
        True
    """
    choice = native_backend(installed, platform.machine())
    if choice.missing is not None:
        warnings.warn(f"{step}: {choice.missing}", NativeBackendWarning, stacklevel=stacklevel)
    return choice
