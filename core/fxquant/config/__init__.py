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

from fxquant.config import backend, custom
from fxquant.config.backend import *  # noqa: F403  # the classes its __all__ lists
from fxquant.config.custom import *  # noqa: F403  # the classes its __all__ lists
from fxquant.config.pattern import MatchAllNode, Pattern, pattern_str
from fxquant.config.qconfig import QConfig, QConfigAny
from fxquant.config.qconfig_mapping import QConfigMapping

__all__ = ["MatchAllNode", "Pattern", "QConfig", "QConfigAny", "QConfigMapping", "pattern_str"]
__all__ += backend.__all__
__all__ += custom.__all__
