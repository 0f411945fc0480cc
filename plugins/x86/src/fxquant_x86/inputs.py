"""The caller's tensors stay the caller's: a compiled model never writes into its inputs.

Inductor's x86 int8 pass turns ``dequantize -> linear -> add(other)`` into oneDNN's
``qlinear_pointwise.binary`` with the ``sum`` post-op, which accumulates the linear's
output *into* ``other``. Its check (``_qlinear_binary_can_be_inplace``) lets ``other``
be a graph input: a transformer layer's residual ``src + attention(src)`` then wrote
its sum into the caller's ``src`` (the example input at ``deploy`` and every later
call's input, 16 dB away from what they were). Two guards:

* :func:`never_into_inputs` (around every compile): inductor's in-place checks say
  no for a graph input or a constant; the fusion then writes a fresh buffer
  (``add`` instead of ``sum``: the same kernel, one output allocation).
* :func:`call_on_copies` (the first call of each input signature): runs on copies
  and tells which inputs the compiled code changed anyway (a future inductor
  pass): :class:`~fxquant_x86.compiled.CompiledModel` then copies those inputs on
  every call, and only those.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

__all__ = ["call_on_copies", "copy_written", "never_into_inputs"]

# inductor's in-place checks for its oneDNN fusions, by module
_IN_PLACE_CHECKS = ("_qlinear_binary_can_be_inplace", "_can_be_inplace")


def _an_input(box: Any) -> bool:
    """Whether inductor's IR value ``box`` is (a view of) a graph input or a constant."""
    from torch._inductor import ir  # inductor loads with the compile: not on import

    data = box.data if isinstance(box, ir.MutableBox) else box
    while isinstance(data, (ir.BaseView, ir.MutableBox)):
        data = data.unwrap_view() if isinstance(data, ir.BaseView) else data.data
    return isinstance(data, ir.InputBuffer)  # ConstantBuffer (a frozen weight) is one too


def _refusing_inputs(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def can_be_in_place(other: Any) -> bool:
        return not _an_input(other) and check(other)

    return can_be_in_place


@contextlib.contextmanager
def never_into_inputs() -> Iterator[None]:
    """Inductor's oneDNN fusions never accumulate into a graph input while this is active.

    A torch without these checks (renamed, moved) is left as it is:
    :func:`call_on_copies` still finds a written input.

    Example:
        >>> with never_into_inputs():
        ...     pass
    """
    with warnings.catch_warnings():
        # inductor's import warns on torch.jit (torch's own code; an error under -W error);
        # loaded here, with the compile, never when fxquant_x86 is imported
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch._inductor.fx_passes import mkldnn_fusion

    with contextlib.ExitStack() as stack:
        for name in _IN_PLACE_CHECKS:
            check = getattr(mkldnn_fusion, name, None)
            if callable(check):
                patched = _refusing_inputs(check)
                stack.enter_context(mock.patch.object(mkldnn_fusion, name, patched))
        yield


def _copies(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Each tensor cloned once: a tensor passed twice stays one tensor, as dynamo guards it."""
    cloned: dict[int, torch.Tensor] = {}
    return tuple(
        cloned.setdefault(id(x), x.clone()) if isinstance(x, torch.Tensor) else x for x in inputs
    )


def call_on_copies(
    run: Callable[..., Any], inputs: tuple[Any, ...]
) -> tuple[Any, tuple[Any, ...], frozenset[int]]:
    """``run`` on copies of ``inputs``; returns its output, the copies, and the positions
    of the inputs it changed.

    Example:
        >>> x = torch.zeros(2)
        >>> out, _, written = call_on_copies(lambda t, n: t.add_(n), (x, 1))
        >>> out.tolist(), x.tolist(), sorted(written)
        ([1.0, 1.0], [0.0, 0.0], [0])
    """
    copies = _copies(inputs)
    out = run(*copies)
    written = frozenset(
        i
        for i, (given, ran) in enumerate(zip(inputs, copies, strict=True))
        if isinstance(given, torch.Tensor) and not _same_bits(given, ran)
    )
    return out, copies, written


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # bit for bit: NaN == NaN and -0.0 != 0.0, as memory holds them
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    return bool(torch.equal(a, b))


def copy_written(inputs: tuple[Any, ...], written: frozenset[int]) -> tuple[Any, ...]:
    """``inputs`` with the tensors at ``written`` cloned (the compiled code changes those).

    Example:
        >>> x = torch.zeros(2)
        >>> copy_written((x, x), frozenset({1}))[1] is x
        False
    """
    if not written:
        return inputs
    return tuple(
        x.clone() if i in written and isinstance(x, torch.Tensor) else x
        for i, x in enumerate(inputs)
    )
