"""``QConfig``: how to observe (or fake-quantize) a node's activation and weight.

A QConfig holds *constructors*, not modules: every node gets its own observer
instance, built by calling ``qconfig.activation()`` / ``qconfig.weight()``.
A constructor is an observer or fake-quantize class, or a factory made by
``SomeObserver.with_args(...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fxquant.errors import ConfigError, ConfigTypeError, wrong_type

__all__ = ["OUTPUT_DTYPES", "QConfig", "QConfigAny"]

Constructor = Callable[..., torch.nn.Module]

OUTPUT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
"""The float sides a quantized op may hand its output on in (``QConfig.output_dtype``)."""


@dataclass(frozen=True)
class QConfig:
    """How to observe a node: a constructor for the activation and one for the weight.

    Args:
        activation: builds the observer or fake-quantize module for activations.
        weight: builds the one for weights.
        output_dtype: keyword only; ``None`` (default): the output is observed with
            ``activation``, as in torch.ao. A float dtype (``torch.bfloat16``,
            ``torch.float16``, ``torch.float32``) asks for an int8-in, float-out kernel
            whose output is that dtype: the backend must list a ``DTypeConfig`` with a
            quantized ``input_dtype`` and that ``output_dtype`` for the pattern (the
            reference model rounds the output to it: ``y.to(bfloat16).to(float32)``).

    Raises:
        ConfigTypeError: when given a module instance or a non-callable, or an
            ``output_dtype`` that is not a ``torch.dtype``.
        ConfigError: an ``output_dtype`` that is not a float dtype.

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
    output_dtype: torch.dtype | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        output: Any = self.output_dtype
        if output is not None and output not in OUTPUT_DTYPES:
            choices = ", ".join(str(d) for d in OUTPUT_DTYPES)
            if not isinstance(output, torch.dtype):
                expected = f"None or a torch.dtype ({choices})"
                raise wrong_type(output, "QConfig output_dtype", expected)
            msg = (
                f"QConfig output_dtype={output!r} is not a float side fxquant runs; expected "
                f"None (the output observed by activation) or one of {choices}"
            )
            raise ConfigError(msg)
        for field_name in ("activation", "weight"):
            value: Any = getattr(self, field_name)
            if isinstance(value, torch.nn.Module):
                msg = (
                    f"QConfig {field_name} got an observer instance {value!r}; pass its class "
                    f"or a factory instead, e.g. {type(value).__name__}.with_args(...)"
                )
                raise ConfigTypeError(msg)
            if not callable(value):
                raise wrong_type(value, f"QConfig {field_name}", "an observer class or factory")


QConfigAny = QConfig | None
