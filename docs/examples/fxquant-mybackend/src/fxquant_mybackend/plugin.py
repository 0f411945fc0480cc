"""The fxquant hook implementations of mybackend (hooks only; the data lives next door)."""

from __future__ import annotations

import fxquant.registry
from fxquant.config.backend import BackendPatternConfig
from fxquant.config.qconfig_mapping import QConfigMapping

from fxquant_mybackend.patterns import pattern_configs
from fxquant_mybackend.qconfig import default_qconfig_mapping

# the fxquant plugin API this module was written for
fxquant_plugin_api = 1

BACKEND = "mybackend"


@fxquant.registry.hookimpl
def fxquant_pattern_configs(backend: str) -> list[BackendPatternConfig] | None:
    """The patterns mybackend quantizes."""
    return pattern_configs() if backend == BACKEND else None


@fxquant.registry.hookimpl
def fxquant_default_qconfig_mapping(backend: str, is_qat: bool) -> QConfigMapping | None:
    """A mapping whose observers satisfy mybackend's dtype constraints."""
    return default_qconfig_mapping(is_qat) if backend == BACKEND else None
