"""The config API: what a backend supports and how a user wants a model quantized.

backend.py          ObservationType, DTypeWithConstraints, DTypeConfig,
                    BackendPatternConfig, BackendConfig
pattern.py          MatchAllNode, the two pattern formats, pattern_str()
qconfig.py          QConfig
qconfig_mapping.py  QConfigMapping (five levels, one lookup: qconfig_for)
custom.py           FuseCustomConfig, PrepareCustomConfig, ConvertCustomConfig
serialize.py        the JSON forms and safe name resolution
"""

from __future__ import annotations

from fxquant.config.backend import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
)
from fxquant.config.custom import (
    ConvertCustomConfig,
    FuseCustomConfig,
    PrepareCustomConfig,
    QuantType,
    StandaloneModuleConfigEntry,
)
from fxquant.config.pattern import MatchAllNode, Pattern, pattern_str
from fxquant.config.qconfig import QConfig, QConfigAny
from fxquant.config.qconfig_mapping import QConfigMapping

__all__ = [
    "BackendConfig",
    "BackendPatternConfig",
    "ConvertCustomConfig",
    "DTypeConfig",
    "DTypeWithConstraints",
    "FuseCustomConfig",
    "MatchAllNode",
    "ObservationType",
    "Pattern",
    "PrepareCustomConfig",
    "QConfig",
    "QConfigAny",
    "QConfigMapping",
    "QuantType",
    "StandaloneModuleConfigEntry",
    "pattern_str",
]
