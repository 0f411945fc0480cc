"""The default QConfigMapping of mybackend: observers that respect its dtype constraints."""

from __future__ import annotations

from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.numerics.fake_quantize import FakeQuantize, default_weight_fake_quant
from fxquant.numerics.observer import MinMaxObserver, default_weight_observer

# eps = 2**-12 keeps every scale within the patterns' scale_min_lower_bound
_ACTIVATION = {"quant_min": 0, "quant_max": 255, "eps": 2**-12}


def default_qconfig_mapping(is_qat):
    """One qconfig for every supported op (fake-quantize modules when ``is_qat``)."""
    if is_qat:
        activation = FakeQuantize.with_args(observer=MinMaxObserver, **_ACTIVATION)
        qconfig = QConfig(activation=activation, weight=default_weight_fake_quant)
    else:
        activation = MinMaxObserver.with_args(**_ACTIVATION)
        qconfig = QConfig(activation=activation, weight=default_weight_observer)
    return QConfigMapping().set_global(qconfig)
