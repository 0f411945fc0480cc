"""The default QConfigMapping of mybackend: observers that respect its dtype constraints."""

from __future__ import annotations

from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.fake_quantize import FakeQuantize, default_weight_fake_quant
from fxquant.observer import MinMaxObserver, default_weight_observer

# quant_max 127 leaves headroom; eps = 2**-12 keeps every scale within the kernels' limit
_OBSERVER_ARGS = {"quant_min": 0, "quant_max": 127, "eps": 2**-12}


def default_qconfig_mapping(is_qat: bool) -> QConfigMapping:
    """One qconfig for every supported op (fake-quantize modules when ``is_qat``).

    Example:
        >>> default_qconfig_mapping(is_qat=False).global_qconfig is not None
        True
    """
    if is_qat:
        activation = FakeQuantize.with_args(observer=MinMaxObserver, **_OBSERVER_ARGS)
        qconfig = QConfig(activation=activation, weight=default_weight_fake_quant)
    else:
        qconfig = QConfig(
            activation=MinMaxObserver.with_args(**_OBSERVER_ARGS), weight=default_weight_observer
        )
    return QConfigMapping().set_global(qconfig)
