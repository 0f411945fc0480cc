"""``QConfig``: how to observe (or fake-quantize) a node's activation and weight.

A QConfig holds *constructors*, not modules: every node gets its own observer
instance, built by calling ``qconfig.activation()`` / ``qconfig.weight()``.
A constructor is an observer or fake-quantize class, or a factory made by
``SomeObserver.with_args(...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxquant.errors import ConfigTypeError

__all__ = ["QConfig", "QConfigAny"]

Constructor = Callable[..., torch.nn.Module]


@dataclass(frozen=True)
class QConfig:
    """How to observe a node: a constructor for the activation and one for the weight.

    Args:
        activation: builds the observer or fake-quantize module for activations.
        weight: builds the one for weights.

    Raises:
        ConfigTypeError: when given a module instance or a non-callable.

    Example:
        >>> from fxquant.observer import MinMaxObserver, default_weight_observer
        >>> qconfig = QConfig(
        ...     activation=MinMaxObserver.with_args(quant_min=0, quant_max=127),
        ...     weight=default_weight_observer,
        ... )
        >>> qconfig.activation().quant_max
        127
    """

    activation: Constructor
    weight: Constructor

    def __post_init__(self) -> None:
        for field_name in ("activation", "weight"):
            value: Any = getattr(self, field_name)
            if isinstance(value, torch.nn.Module):
                msg = (
                    f"QConfig {field_name} got an observer instance {value!r}; pass its class "
                    f"or a factory instead, e.g. {type(value).__name__}.with_args(...)"
                )
                raise ConfigTypeError(msg)
            if not callable(value):
                msg = (
                    f"QConfig {field_name} must be an observer class or factory, got {value!r} "
                    f"of type {type(value).__name__}"
                )
                raise ConfigTypeError(msg)


QConfigAny = QConfig | None
