"""Which modules of a model hold observer state, and what must match between ranks.

``observer_sites(model)`` lists every stateful fxquant observer (inside
fake-quantize modules too) in module order, which is the same on every rank of
the same model; ``structure(sites)`` is what the ranks compare (by digest)
before pairing their observers up. Modules whose state fxquant does not know
raise here, before any collective, on every rank alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fxquant.errors import ConfigTypeError
from fxquant.numerics.fake_quantize import (
    FakeQuantize,
    FakeQuantizeBase,
    FusedMovingAvgObsFakeQuantize,
)
from fxquant.numerics.observer import (
    FixedQParamsObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    NoopObserver,
    ObserverBase,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
    RecordingObserver,
    ReuseInputObserver,
)
from torch import nn

__all__ = [
    "REDUCING_FAKE_QUANT_FORWARDS",
    "REDUCING_FORWARDS",
    "STATELESS",
    "SUPPORTED",
    "ObserverSite",
    "differ_message",
    "observer_sites",
    "structure",
]

# no state to merge: fixed qparams, dtype carriers, and the debug recorder (its tensors stay local)
STATELESS = (
    FixedQParamsObserver,
    PlaceholderObserver,
    NoopObserver,
    ReuseInputObserver,
    RecordingObserver,
)
_MOVING_AVERAGE = (MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver)
_MIN_MAX = (MinMaxObserver, PerChannelMinMaxObserver)  # after _MOVING_AVERAGE: its base classes
# forwards known to route their statistics through the observer's reducer
REDUCING_FORWARDS = {
    cls.forward
    for cls in (
        MinMaxObserver,
        MovingAverageMinMaxObserver,
        PerChannelMinMaxObserver,
        MovingAveragePerChannelMinMaxObserver,
        HistogramObserver,
    )
}
REDUCING_FAKE_QUANT_FORWARDS = {FakeQuantize.forward, FusedMovingAvgObsFakeQuantize.forward}
SUPPORTED = (
    "fxquant's MinMaxObserver, MovingAverageMinMaxObserver, PerChannelMinMaxObserver, "
    "MovingAveragePerChannelMinMaxObserver and HistogramObserver (and FakeQuantize modules "
    "around them)"
)


Kind = Literal["min_max", "moving_average", "histogram"]


@dataclass(frozen=True, slots=True)
class ObserverSite:
    """An observer with state to merge, found at ``name`` in the model.

    Example:
        >>> site = ObserverSite("obs", PerChannelMinMaxObserver(), "min_max")
        >>> site.per_channel
        True
    """

    name: str
    observer: Any  # one of the observer classes above (their buffers are read by name)
    kind: Kind  # how its state merges

    @property
    def per_channel(self) -> bool:
        """The observer keeps one min/max per channel."""
        return isinstance(self.observer, PerChannelMinMaxObserver)


def _kind(name: str, observer: ObserverBase) -> Kind | None:
    if isinstance(observer, STATELESS):
        return None
    if isinstance(observer, HistogramObserver):
        return "histogram"
    if isinstance(observer, _MOVING_AVERAGE):
        return "moving_average"
    if isinstance(observer, _MIN_MAX):
        return "min_max"
    msg = f"cannot synchronize {name!r} ({type(observer).__qualname__}) across ranks; {SUPPORTED}"
    raise ConfigTypeError(msg)


def observer_sites(model: nn.Module) -> list[ObserverSite]:
    """Every observer with state, in module order (the same on every rank of the same model).

    Raises:
        ConfigTypeError: a module with qparams whose state fxquant cannot merge.

    Example:
        >>> from fxquant.fake_quantize import default_fake_quant
        >>> fixed = FixedQParamsObserver(scale=0.1, zero_point=0)  # nothing to merge
        >>> model = nn.Sequential(MinMaxObserver(), default_fake_quant(), fixed)
        >>> [(site.name, site.kind) for site in observer_sites(model)]
        [('0', 'min_max'), ('1.activation_post_process', 'moving_average')]
    """
    sites = []
    for name, module in model.named_modules():
        if isinstance(module, ObserverBase):
            kind = _kind(name, module)
            if kind is not None:
                sites.append(ObserverSite(name, module, kind))
        elif isinstance(module, FakeQuantizeBase) and not isinstance(module, FakeQuantize):
            msg = (
                f"cannot synchronize {name!r} ({type(module).__qualname__}) across ranks: "
                f"a fake-quantize module without an observer; {SUPPORTED}"
            )
            raise ConfigTypeError(msg)
        elif not isinstance(module, FakeQuantize) and callable(
            getattr(module, "calculate_qparams", None)
        ):
            msg = f"cannot synchronize {name!r} ({type(module).__qualname__}); {SUPPORTED}"
            raise ConfigTypeError(msg)
    return sites


def structure(sites: Sequence[ObserverSite]) -> list[str]:
    """What must be equal on every rank for the sites to pair up: names, types, settings.

    Example:
        >>> structure(observer_sites(nn.Sequential(HistogramObserver(bins=8))))
        ['0|HistogramObserver|torch.float32|bins=8']
    """
    parts = []
    for site in sites:
        observer = site.observer
        detail = f"bins={observer.bins}" if site.kind == "histogram" else ""
        if site.per_channel:
            detail = f"ch_axis={observer.ch_axis}"
        parts.append(f"{site.name}|{type(observer).__qualname__}|{observer.min_val.dtype}|{detail}")
    return parts


def differ_message(what: str, sites: Sequence[ObserverSite]) -> str:
    """The error raised on every rank when ``what`` differs between the ranks.

    Example:
        >>> differ_message("the observers", [])[:49]
        'the observers differ between the ranks (0 observe'
    """
    return (
        f"{what} differ between the ranks ({len(sites)} observers on this one); build the same "
        "model with the same qconfig mapping on every rank (prepare_fx/prepare_qat_fx with the "
        "same arguments)"
    )
