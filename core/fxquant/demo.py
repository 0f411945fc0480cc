"""``fxquant demo``: the seed tutorial's backend built with fxquant, then the installed ones.

The tutorial's backend has two quantized ops, linear and conv-relu (with the
conv + relu fusion that produces the latter). The demo builds it with
fxquant's config classes, registers it as a plugin of a private registry so
that it goes through the same path as an installed backend, prints its
pattern table, then lists the installed backends.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, TextIO

import torch

from fxquant.registry.hookspecs import hookimpl

__all__ = ["TutorialPlugin", "fuse_conv2d_relu", "run_demo", "tutorial_pattern_configs"]

BACKEND = "my_backend"


def _optional_class(module: str, name: str) -> type[torch.nn.Module] | None:
    # the nn packages are written alongside the demo: leave a mapping out until they exist
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def fuse_conv2d_relu(is_qat: bool, conv: torch.nn.Conv2d, relu: torch.nn.ReLU) -> torch.nn.Module:
    """The tutorial's fuser: conv + relu -> ConvReLU2d (the same for PTQ and QAT).

    Example:
        >>> fused = fuse_conv2d_relu(False, torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU())
        >>> type(fused).__name__
        'ConvReLU2d'
    """
    from fxquant.nn.intrinsic import ConvReLU2d

    return ConvReLU2d(conv, relu)


def tutorial_pattern_configs() -> list[Any]:
    """The three pattern configs of the tutorial: linear, conv+relu fusion, fused conv-relu.

    Example:
        >>> [len(c.dtype_configs) for c in tutorial_pattern_configs()]
        [1, 0, 1]
    """
    from fxquant.config.backend import (
        BackendPatternConfig,
        DTypeConfig,
        DTypeWithConstraints,
        ObservationType,
    )
    from fxquant.nn.intrinsic import ConvReLU2d

    # The tutorial's spelling; on a torch without quantized dtypes the plain ones mean the same.
    quint8 = getattr(torch, "quint8", torch.uint8)
    qint8 = getattr(torch, "qint8", torch.int8)
    quint8_with_constraints = DTypeWithConstraints(
        dtype=quint8,
        quant_min_lower_bound=0,
        quant_max_upper_bound=255,
        scale_min_lower_bound=2**-12,
    )
    weighted_int8 = DTypeConfig(
        input_dtype=quint8_with_constraints,
        output_dtype=quint8_with_constraints,
        weight_dtype=qint8,
        bias_dtype=torch.float,
    )
    different = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    linear = (
        BackendPatternConfig(torch.nn.Linear)
        .set_observation_type(different)
        .add_dtype_config(weighted_int8)
        .set_root_module(torch.nn.Linear)
        .set_qat_module(_optional_class("fxquant.nn.qat", "Linear"))
        .set_reference_quantized_module(_optional_class("fxquant.nn.reference", "Linear"))
    )
    conv_relu = (
        BackendPatternConfig((torch.nn.Conv2d, torch.nn.ReLU))
        .set_fused_module(ConvReLU2d)
        .set_fuser_method(fuse_conv2d_relu)
    )
    fused_conv_relu = (
        BackendPatternConfig(ConvReLU2d)
        .set_observation_type(different)
        .add_dtype_config(weighted_int8)
        .set_root_module(torch.nn.Conv2d)
        .set_qat_module(_optional_class("fxquant.nn.intrinsic.qat", "ConvReLU2d"))
        .set_reference_quantized_module(_optional_class("fxquant.nn.reference", "Conv2d"))
    )
    return [linear, conv_relu, fused_conv_relu]


class TutorialPlugin:
    """The tutorial's backend as a plugin object (what ``register_plugin`` takes).

    Example:
        >>> len(TutorialPlugin().fxquant_pattern_configs(BACKEND))
        3
    """

    @hookimpl
    def fxquant_pattern_configs(self, backend: str) -> list[Any] | None:
        """The tutorial's three pattern configs, for ``my_backend`` only."""
        return tutorial_pattern_configs() if backend == BACKEND else None


def run_demo(out: TextIO | None = None) -> int:
    """Print the tutorial backend's tables, then the installed backends; return 0.

    Example:
        >>> import io
        >>> run_demo(io.StringIO())
        0
    """
    from fxquant.cli import render_show
    from fxquant.registry import list_backends
    from fxquant.registry.describe import describe
    from fxquant.registry.manager import Registry

    out = sys.stdout if out is None else out
    registry = Registry()  # private: the demo backend must not show up in the user's process
    registry.register_plugin(TutorialPlugin(), backend=BACKEND)
    print("The BackendConfig of the seed tutorial, built with fxquant:\n", file=out)
    print(render_show(describe(registry.assembled(BACKEND))), file=out)
    print(f"\nInstalled backends: {', '.join(list_backends())}", file=out)
    print("(`fxquant show NAME` for one of them; quantizing with each comes later)", file=out)
    return 0
