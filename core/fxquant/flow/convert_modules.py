"""Convert's module swaps: QAT modules back to float, weighted modules to reference modules.

A weighted node (``node.meta["fxquant"].is_root`` with a pattern config naming a
``reference_quantized_module``) gets its weight's qparams from the weight
observer (PTQ: ``qconfig.weight()`` run on the weight now; QAT: the module's
own ``weight_fake_quant``) and its root module replaced by
``reference_cls.from_float(root, weight_qparams)``::

    fc: Linear                      ->  fc: reference.Linear (weight qparams as buffers)
    block: ConvReLU2d[Conv2d, ReLU] ->  block: ConvReLU2d[reference.Conv2d, ReLU]
    fc: qat.LinearReLU              ->  fc: LinearReLU[reference.Linear, ReLU]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.fx import Node

from fxquant import dtypes
from fxquant.errors import ConfigTypeError
from fxquant.flow.convert_qdq import observer_range
from fxquant.flow.dtype_check import observable
from fxquant.flow.state import NodeInfo
from fxquant.nn import recurrent
from fxquant.nn.intrinsic import FusedModule
from fxquant.torch_ao_names import as_fxquant_class

__all__ = ["is_observer", "observer_node", "qparams_dict", "swap_weighted_module", "will_swap"]


def is_observer(module: nn.Module) -> bool:
    """True for observers and fake-quantize modules (fxquant's or torch.ao's).

    Duck-typed (``calculate_qparams`` and ``dtype``) so that observers built from
    torch.ao classes named in a user's qconfig convert too.

    Example:
        >>> from fxquant.observer import MinMaxObserver
        >>> is_observer(MinMaxObserver()), is_observer(nn.Linear(1, 1))
        (True, False)
    """
    return callable(getattr(module, "calculate_qparams", None)) and hasattr(module, "dtype")


def observer_node(node: object, modules: Mapping[str, nn.Module]) -> Node | None:
    """``node`` if it calls an observer (or fake quantize), else None.

    Example:
        >>> from torch import fx
        >>> gm = fx.symbolic_trace(nn.Sequential(nn.ReLU()))
        >>> [observer_node(n, dict(gm.named_modules())) for n in gm.graph.nodes]
        [None, None, None]
    """
    if isinstance(node, Node) and node.op == "call_module":
        module = modules.get(str(node.target))
        if module is not None and is_observer(module):
            return node
    return None


def _is_fused(module: nn.Module) -> bool:
    # fxquant's FusedModule, or torch.ao's fused modules named in a user's config: both are
    # sequences whose first module holds the weight
    return isinstance(module, (FusedModule, nn.Sequential)) and (
        len(module) > 0 and hasattr(module[0], "weight")
    )


def _is_qat(module: nn.Module) -> bool:
    return callable(getattr(module, "to_float", None)) and hasattr(module, "weight_fake_quant")


def will_swap(info: NodeInfo | None, module: nn.Module) -> bool:
    """Whether convert replaces ``module`` (the node's) with a reference module.

    Example:
        >>> will_swap(None, nn.Linear(1, 1))
        False
    """
    if info is None or not info.quantized or not info.is_root:
        return False
    config = info.pattern_config
    if config is None or config.reference_quantized_module is None:
        return False
    return hasattr(module, "weight") or _is_fused(module) or _is_recurrent(module)


def _is_recurrent(module: nn.Module) -> bool:
    return isinstance(module, (nn.RNNBase, nn.RNNCellBase))


def qparams_dict(observer: nn.Module) -> dict[str, Any]:
    """The ``weight_qparams`` dict of ``from_float`` from a weight observer or fake quant.

    Symmetric qschemes become their affine forms (the integers are the same);
    a placeholder (fp16 weights) gives ``{"qscheme": None, "dtype": ...}``.

    Example:
        >>> from fxquant.observer import default_weight_observer
        >>> obs = default_weight_observer()
        >>> _ = obs(torch.tensor([-1.0, 1.0]))
        >>> sorted(qparams_dict(obs))
        ['dtype', 'qscheme', 'quant_max', 'quant_min', 'scale', 'zero_point']
    """
    dtype = getattr(observer, "dtype", None)
    qscheme = getattr(observer, "qscheme", None)
    if (
        qscheme is None
        or not isinstance(dtype, torch.dtype)
        or not dtypes.is_quantized_dtype(dtype)
    ):
        return {"qscheme": None, "dtype": dtype}
    per_channel = dtypes.is_per_channel(qscheme)
    name = dtypes.qscheme_name(qscheme)
    if name != "per_channel_affine_float_qparams":
        name = "per_channel_affine" if per_channel else "per_tensor_affine"
    scale, zero_point = observer.calculate_qparams()  # type: ignore[operator]  # duck-typed
    params: dict[str, Any] = {
        "qscheme": dtypes.qscheme_object(name),
        "dtype": dtype,
        "scale": scale,
        "zero_point": zero_point,
    }
    if per_channel:
        params["axis"] = int(observer.ch_axis)  # type: ignore[arg-type]  # per-channel observers
    bounds = {key: getattr(observer, key, None) for key in ("quant_min", "quant_max")}
    return params | {key: int(value) for key, value in bounds.items() if value is not None}


def _weight_qparams(
    info: NodeInfo, weight: torch.Tensor, where: str, fake_quant: nn.Module | None = None
) -> dict[str, Any] | None:
    """The ``weight_qparams`` of ``weight``, from the QAT module's own fake quant or a new
    weight observer run on it; None when its dtype quantizes nothing (the module stays float).
    """
    observer = fake_quant
    if observer is None:
        assert info.qconfig is not None  # checked by will_swap
        observer = info.qconfig.weight()
        # its warnings (a NaN weight) name the module, as activation observers name their edge
        object.__setattr__(observer, "_fxquant_name", f"of the {where}")
        observer.to(weight.device)
    if not observable(getattr(observer, "dtype", None)):
        return None
    # torch.ao runs the weight observer here for PTQ and QAT alike (its qparams need a
    # first call to get their shapes); kept for numerics parity.
    observer(weight)
    return qparams_dict(observer)


def swap_weighted_module(
    root: nn.Module, node: Node, info: NodeInfo | None, modules: Mapping[str, nn.Module]
) -> nn.Module:
    """Replace the node's module: QAT -> float, then (if quantized) -> reference module.

    Returns:
        The module now at ``node.target``.

    Raises:
        ConfigTypeError: the reference module class has no ``from_float``.

    Example:
        >>> # see tests/flow/test_convert.py: reference modules replace weighted modules
    """
    path = str(node.target)
    module = modules[path]
    fake_quant: nn.Module | None = None
    if _is_qat(module):
        fake_quant = module.weight_fake_quant  # type: ignore[assignment]  # checked by _is_qat
        module = module.to_float()  # type: ignore[operator]  # checked by _is_qat
        root.set_submodule(path, module)
    if not will_swap(info, module):
        return module
    assert info is not None  # checked by will_swap
    assert info.pattern_config is not None  # checked by will_swap
    if _is_recurrent(module):
        return _swap_recurrent(root, path, module, info)
    # a fused module is a Sequential whose first module holds the weight (_is_fused)
    float_root: Any = module[0] if _is_fused(module) else module  # type: ignore[index]
    qparams = _weight_qparams(info, float_root.weight, f"weight of {path!r}", fake_quant)
    if qparams is None:
        return module
    declared = info.pattern_config.reference_quantized_module
    assert declared is not None  # checked by will_swap
    # a torch.ao class named in a user's config computes with torch.quint8/qint8 tensors,
    # which fxquant never creates: fxquant's class of the same name has its numerics
    reference_cls = as_fxquant_class(declared)
    from_float = getattr(reference_cls, "from_float", None)
    if not callable(from_float):
        msg = (
            f"reference_quantized_module {reference_cls!r} of pattern "
            f"{info.pattern_config.pattern!r} has no from_float(float_module, weight_qparams); "
            "use a class from fxquant.nn.reference or one with that classmethod"
        )
        raise ConfigTypeError(msg)
    reference = from_float(float_root, qparams)
    if _is_fused(module):
        setattr(module, "0", reference)  # Sequential's item 0
        return module
    root.set_submodule(path, reference)
    return reference  # type: ignore[no-any-return]  # from_float returns the module


def _swap_recurrent(root: nn.Module, path: str, module: nn.Module, info: NodeInfo) -> nn.Module:
    """An LSTM / GRU / cell -> its reference module (``fxquant.nn.recurrent``): one weight
    observer run per weight (int8), or fp16 weights; the dynamic activation range from the
    activation observer. A qconfig that quantizes neither way keeps the module float.
    """
    assert info.qconfig is not None  # checked by will_swap
    qparams: dict[str, Any] = {}
    for name in recurrent.weight_names(module):
        found = _weight_qparams(info, getattr(module, name), f"{name} of {path!r}")
        if found is None:
            return module
        qparams[name] = found
    activation = info.qconfig.activation()
    act_range = dtypes.quant_range(torch.uint8)  # fp16 weights: activations stay float
    if dtypes.is_quantized_dtype(getattr(activation, "dtype", None)):
        act_range = observer_range(activation, torch.uint8)
    reference_cls = getattr(recurrent, type(module).__name__)
    reference = reference_cls.from_float(module, qparams, activation=act_range)
    root.set_submodule(path, reference)
    return reference  # type: ignore[no-any-return]  # from_float returns the module
