"""The default QConfigMapping of the x86 backend: fxquant-onednn's, whose kernels x86 runs.

x86 states only its pattern list (:mod:`fxquant_x86.patterns`); which ops are
int8 by default, and why, is :func:`fxquant_onednn.qconfig.default_qconfig_mapping`.
"""

from __future__ import annotations

from fxquant_onednn.qconfig import FLOAT_OPS, default_qconfig_mapping

__all__ = ["FLOAT_OPS", "default_qconfig_mapping"]
