"""The default QConfigMapping of the x86 backend: fxquant-onednn's, whose kernels x86 runs.

x86 states only its pattern list (:mod:`fxquant_x86.patterns`); which ops are
int8 by default, and why, is :func:`fxquant_onednn.qconfig.default_qconfig_mapping`.
On CPUs without VNNI its weights are 7 bits (-63..63), where oneDNN's uint8 x int8
products would saturate on 8-bit ones (``fxquant.lowering.kernels.cpu``; the rules decline
larger weights there, with the reason, instead of giving wrong results).
"""

from __future__ import annotations

from fxquant_onednn.qconfig import FLOAT_OPS, default_qconfig_mapping

__all__ = ["FLOAT_OPS", "default_qconfig_mapping"]
