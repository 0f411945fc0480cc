"""Input-weight equalization, all of it: the qconfig and observers, prepare's and convert's parts.

- :mod:`~fxquant.flow.equalization.observers`: ``EqualizationQConfig``,
  ``default_equalization_qconfig``, the two observers and the scale they give;
- :mod:`~fxquant.flow.equalization.prepare`: where prepare puts the input observer;
- :mod:`~fxquant.flow.equalization.convert`: convert's part, scaling weights and folding or
  inserting the input's scale.

``prepare_fx(..., _equalization_config=...)`` turns it on; the documented names are also at
``fxquant.numerics`` and ``fxquant.default_equalization_qconfig``.

Example:
    >>> from fxquant.flow.equalization import default_equalization_qconfig
    >>> type(default_equalization_qconfig).__name__
    'EqualizationQConfig'
"""

from __future__ import annotations

from fxquant.flow.equalization.observers import (
    EqualizationQConfig,
    InputEqualizationObserver,
    WeightEqualizationObserver,
    default_equalization_qconfig,
)

__all__ = [
    "EqualizationQConfig",
    "InputEqualizationObserver",
    "WeightEqualizationObserver",
    "default_equalization_qconfig",
]
