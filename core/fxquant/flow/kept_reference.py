"""The reference form ``convert_fx`` keeps for a deployment, without the float weights.

On a backend that both lowers in PyTorch and deploys (x86), ``convert_fx``'s model keeps
the model from before lowering, which the deployment compiles. Kept as it was, it would
hold every float weight the int8 kernels replaced: four bytes per weight next to the
kernels' one (an 8-layer 2048-wide MLP: 128 MB beside 32 MB). The kernels hold the same
information: a reference module quantizes its float weight with its own qparams before
use, and the kernel at (or above) its path stores exactly those integers and scales.

So, after lowering, each float weight that only the kept model holds is replaced by an
empty placeholder when a kernel module answers ``dequantized_weight()`` with a tensor
whose quantized form is the reference module's (checked exactly, not assumed); the weight
is rebuilt from the kernel when the reference form is asked for (:func:`materialize`). A
weight no kernel can give back stays as it was.

Example:
    >>> import torch
    >>> from torch import fx
    >>> gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    >>> release_replaced_weights(gm, gm)  # nothing was replaced: nothing to release
    0
"""

from __future__ import annotations

import torch
from torch import nn
from torch.fx import GraphModule

__all__ = ["materialize", "release_replaced_weights"]

#: attribute of the kept model: weight path -> path of the kernel module that rebuilds it
SOURCES = "_fxquant_weight_sources"


def release_replaced_weights(reference: GraphModule, lowered: GraphModule) -> int:
    """Put placeholders for the weights of ``reference`` that ``lowered``'s kernels hold.

    Returns:
        How many weights were released.
    """
    held = {id(t) for t in (*lowered.parameters(), *lowered.buffers())}
    kernels = dict(lowered.named_modules())
    sources: dict[str, str] = {}
    for path, param in list(reference.named_parameters()):
        owner_path, _, name = path.rpartition(".")
        if name != "weight" or id(param) in held:
            continue
        source = _kernel_for(owner_path, reference.get_submodule(owner_path), kernels)
        if source is not None:
            placeholder = torch.empty_like(param, device="meta")
            setattr(reference.get_submodule(owner_path), name, nn.Parameter(placeholder, False))
            sources[path] = source
    setattr(reference, SOURCES, sources)
    return len(sources)


def materialize(reference: GraphModule, lowered: GraphModule) -> GraphModule:
    """``reference`` with its released weights rebuilt from ``lowered``'s kernels (in place).

    The kernels' current integers are read, so a ``state_dict`` loaded into the lowered
    model since ``convert_fx`` is what the rebuilt weights carry.
    """
    sources: dict[str, str] = getattr(reference, SOURCES, {})
    for path, source in sources.items():
        owner_path, _, name = path.rpartition(".")
        rebuild = getattr(lowered.get_submodule(source), "dequantized_weight")  # noqa: B009
        weight: torch.Tensor = rebuild()
        setattr(reference.get_submodule(owner_path), name, nn.Parameter(weight, False))
    setattr(reference, SOURCES, {})
    return reference


def _kernel_for(owner_path: str, owner: nn.Module, kernels: dict[str, nn.Module]) -> str | None:
    """The kernel module at ``owner_path`` or above it (a fused pattern's kernel replaces
    its parent) whose integer weight is exactly ``owner``'s quantized weight."""
    quantized_weight = getattr(owner, "get_quantized_weight", None)
    if quantized_weight is None:
        return None
    expected = quantized_weight()
    parts = owner_path.split(".") if owner_path else []
    for depth in range(len(parts), -1, -1):
        path = ".".join(parts[:depth])
        kernel = kernels.get(path)
        rebuild = getattr(kernel, "dequantized_weight", None)
        integers = getattr(kernel, "weight", None)
        if rebuild is None or not isinstance(integers, torch.Tensor):
            continue
        if integers.shape == expected.shape and torch.equal(integers, expected):
            return path
    return None
