"""The fxquant hook implementations of mybackend (hooks only; the data lives next door)."""

from __future__ import annotations

import fxquant.registry

from fxquant_mybackend.kernels import lowering_rules
from fxquant_mybackend.patterns import pattern_configs
from fxquant_mybackend.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1  # the plugin API this module was written for

BACKEND = "mybackend"


@fxquant.registry.hookimpl
def fxquant_pattern_configs(backend):
    """The patterns mybackend quantizes."""
    return pattern_configs() if backend == BACKEND else None


@fxquant.registry.hookimpl
def fxquant_lowering_kernels(backend):
    """How reference patterns become mybackend's kernels."""
    return lowering_rules() if backend == BACKEND else None


@fxquant.registry.hookimpl
def fxquant_default_qconfig_mapping(backend, is_qat):
    """A mapping whose observers satisfy mybackend's dtype constraints."""
    return default_qconfig_mapping(is_qat) if backend == BACKEND else None
