"""Keep third-party start-up chatter out of fxquant's output, and nothing else.

Importing ExecuTorch's runtime prints ``[cpuinfo_utils.cpp:71] Reading file ...``
lines from C++ straight to file descriptor 2, and importing torchao logs
``Failed to load .../torchao/_C_mxfp8...so`` for the CUDA kernels a CPU build
lacks. Printed before ``fxquant demo``'s table, they read like errors of ours.
:func:`third_party_noise_filtered` points descriptor 2 at a temporary file for
the block (C++ writes are caught too), then writes back every line that is not
one of those known messages: fxquant's own warnings and errors, and any other
library's, still reach stderr, after the block.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["NOISE", "is_noise", "third_party_noise_filtered"]

NOISE = (
    # ExecuTorch's runtime probing the CPU (C++, on every import of its runtime)
    re.compile(r"^\[cpuinfo_utils\.cpp:\d+\] "),
    # torchao's optional CUDA/CUTLASS extensions, absent from a CPU build
    re.compile(r"^Failed to load \S*torchao\S*/_C\w*\S*\.so\b"),
    # torchao registering an Enum with torch's pytree, which torch 2.13 deprecates
    re.compile(r"^W\d{4} [\d:. ]+\d+ \S*torch/utils/_pytree\.py:\d+\] <enum '\w+'> is an Enum"),
)
"""The lines dropped: each pattern names the library it comes from."""


def is_noise(line: str) -> bool:
    """Whether ``line`` is one of the known third-party start-up messages.

    Example:
        >>> is_noise("[cpuinfo_utils.cpp:87] Failed to open midr file /sys/x")
        True
        >>> is_noise("fxquant: error: unknown backend 'x68'")
        False
    """
    return any(pattern.search(line) for pattern in NOISE)


@contextlib.contextmanager
def third_party_noise_filtered() -> Iterator[None]:
    """Run the block with stderr (descriptor 2) captured; replay all but the known noise.

    Where descriptor 2 cannot be redirected (no such descriptor), the block runs
    as it is.

    Example:
        >>> with third_party_noise_filtered():
        ...     pass
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [
                line
                for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                if not is_noise(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
