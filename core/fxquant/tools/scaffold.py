"""``fxquant new-backend NAME``: an installable plugin skeleton that passes ``fxquant check``.

The skeleton is the layout of docs/plugins.md, filled in: an entry point, int8
linear and conv patterns built with :mod:`fxquant.patterns`, a default mapping
its dtype configs accept, one real lowering kernel (an integer linear written
in torch, to replace with the hardware's call) and a test that runs the
conformance checks. The files are templates below (``string.Template``: only
``$name``, ``$dist`` and ``$requires`` are substituted).
"""

from __future__ import annotations

import re
import string
from pathlib import Path

from fxquant.version import VERSION

__all__ = ["TEMPLATES", "new_backend"]

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "fxquant-$dist"
version = "0.1.0"
description = "The $name backend for fxquant"
readme = "README.md"
requires-python = ">=3.10"
# the fxquant versions this plugin was written for: outside them fxquant shows it as
# incompatible and never imports it
dependencies = ["$requires"]

[project.optional-dependencies]
test = ["pytest>=8"]

# the line that makes it a plugin: backend name = the module with the hook implementations
[project.entry-points."fxquant.backends"]
$name = "fxquant_$name.plugin"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
filterwarnings = ["error"]
"""

_README = """\
# fxquant-$dist

The `$name` backend for [fxquant](https://pypi.org/project/fxquant/), made by
`fxquant new-backend $name`.

```
pip install -e .          # the entry point registers the backend
fxquant backends          # $name: ok
fxquant show $name        # its pattern table
fxquant check $name       # does it keep the plugin contract?
pytest tests              # the same checks, in your test suite
```

- `src/fxquant_$name/patterns.py`: what the backend quantizes (dtype configs, patterns).
- `src/fxquant_$name/qconfig.py`: the default `QConfigMapping` (its observers must
  satisfy the dtype constraints: `fxquant check` verifies it).
- `src/fxquant_$name/kernels.py`: lowering rules; `QLinear` is a real integer linear
  written in torch, to replace with your hardware's call. `fxquant check` holds each
  kernel to its rule's tolerance (one output step unless declared) on random shapes.
"""

_INIT = '''\
"""fxquant-$dist: the $name backend for fxquant."""

__version__ = "0.1.0"
'''

_PLUGIN = '''\
"""The fxquant hook implementations of $name (hooks only; the data lives next door)."""

from __future__ import annotations

import fxquant.registry

from fxquant_$name.kernels import lowering_rules
from fxquant_$name.patterns import pattern_configs
from fxquant_$name.qconfig import default_qconfig_mapping

fxquant_plugin_api = 1  # the plugin API this module was written for

BACKEND = "$name"


@fxquant.registry.hookimpl
def fxquant_pattern_configs(backend):
    """The patterns $name quantizes."""
    return pattern_configs() if backend == BACKEND else None


@fxquant.registry.hookimpl
def fxquant_lowering_kernels(backend):
    """How reference patterns become $name's kernels."""
    return lowering_rules() if backend == BACKEND else None


@fxquant.registry.hookimpl
def fxquant_default_qconfig_mapping(backend, is_qat):
    """A mapping whose observers satisfy $name's dtype constraints."""
    return default_qconfig_mapping(is_qat) if backend == BACKEND else None
'''

_PATTERNS = '''\
"""What $name supports: data, built with fxquant's shared pattern builders."""

from __future__ import annotations

import torch
from fxquant.config.backend import DTypeConfig, DTypeWithConstraints
from fxquant.patterns import conv_configs, linear_configs

# uint8 activations whose scale is at least 2**-12, int8 weights, float bias
ACTIVATION = DTypeWithConstraints(
    dtype=torch.uint8,
    quant_min_lower_bound=0,
    quant_max_upper_bound=255,
    scale_min_lower_bound=2**-12,
)
WEIGHTED_INT8 = DTypeConfig(
    input_dtype=ACTIVATION,
    output_dtype=ACTIVATION,
    weight_dtype=torch.int8,
    bias_dtype=torch.float,
)


def pattern_configs():
    """Linear and 2-d conv, with their relu / batch-norm fusions."""
    return linear_configs([WEIGHTED_INT8]) + conv_configs(
        [WEIGHTED_INT8], dims=(2,), transpose=False
    )
'''

_QCONFIG = '''\
"""The default QConfigMapping of $name: observers that respect its dtype constraints."""

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
'''

_KERNELS = '''\
"""$name's lowering rules and kernels: integer tensors in, integer tensors out.

A kernel replaces ``dequantize -> float op -> quantize`` in the reference model
(see the kernel protocol in fxquant's plugin guide). ``QLinear`` is a real one,
written in torch; replace its ``forward`` with your hardware's call.
"""

from __future__ import annotations

import torch
from fxquant.lowering import LoweringRule
from fxquant.nn import reference
from torch import nn


class QLinear(nn.Module):
    """uint8 x int8 -> uint8 linear, per-tensor or per-channel (axis 0) weights."""

    def __init__(self, module, x, out):
        super().__init__()
        qparams = module.get_weight_qparams()
        channels = module.weight.shape[0]
        scale = torch.as_tensor(qparams["scale"], dtype=torch.float32).reshape(-1)
        zero_point = torch.as_tensor(qparams["zero_point"], dtype=torch.float32).reshape(-1)
        self.register_buffer("weight", module.get_quantized_weight().detach().clone())
        self.register_buffer("weight_scale", scale.expand(channels).clone())
        self.register_buffer("weight_zero_point", zero_point.expand(channels).clone())
        bias = module.bias
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.x_scale, self.x_zero_point = float(x.scale), int(x.zero_point)
        self.out_scale, self.out_zero_point = float(out.scale), int(out.zero_point)
        self.out_min, self.out_max, self.out_dtype = out.quant_min, out.quant_max, out.dtype

    def forward(self, qx):
        """The integer sums, scaled once, then requantized to the output's qparams."""
        # float32 holds these integer sums exactly while in_features * 255 * 128 < 2**24
        # (about 500 features); past that its rounding stays far below one output step
        weight = self.weight.float() - self.weight_zero_point[:, None]
        sums = (qx.float() - self.x_zero_point) @ weight.t()
        y = sums * (self.x_scale * self.weight_scale)
        if self.bias is not None:
            y = y + self.bias
        q = torch.round(y / self.out_scale) + self.out_zero_point
        return q.clamp(self.out_min, self.out_max).to(self.out_dtype)


def build_qlinear(match):
    """The kernel for one reference Linear, or None to leave it in reference form."""
    x, out = match.inputs[0], match.output
    if x is None or out is None or x.is_dynamic or x.is_per_channel:
        return None  # float or dynamic input, or a float output (fused relu): decline
    return QLinear(match.modules[-1], x, out)


def lowering_rules():
    """One rule per kernel; ``tolerance`` (output steps) is what ``fxquant check`` allows."""
    return [LoweringRule(reference.Linear, build=build_qlinear, name="${name}_qlinear")]
'''

_TEST = '''\
"""The backend keeps fxquant's plugin contract: the checks of ``fxquant check $name``."""

import pytest
from fxquant.tools.conformance import conformance_checks

BACKEND = "$name"


@pytest.mark.parametrize("check", conformance_checks(BACKEND), ids=str)
def test_backend_keeps_the_plugin_contract(check):
    check(BACKEND)
'''

TEMPLATES: dict[str, str] = {
    "pyproject.toml": _PYPROJECT,
    "README.md": _README,
    "src/fxquant_$name/__init__.py": _INIT,
    "src/fxquant_$name/plugin.py": _PLUGIN,
    "src/fxquant_$name/patterns.py": _PATTERNS,
    "src/fxquant_$name/qconfig.py": _QCONFIG,
    "src/fxquant_$name/kernels.py": _KERNELS,
    "tests/test_conformance.py": _TEST,
}
"""Relative path -> text of every file of the skeleton (both are templates)."""


def _requires() -> str:
    major, minor = (int(part) for part in VERSION.split(".")[:2])
    return f"fxquant>={major}.{minor},<{major}.{minor + 1}"


def new_backend(name: str, directory: str | Path = ".") -> Path:
    """Write the skeleton of backend ``name`` to ``directory/fxquant-NAME``; return that folder.

    Raises:
        ValueError: ``name`` is not a lowercase Python identifier.
        FileExistsError: the folder exists already (nothing is overwritten).

    Example:
        >>> import tempfile
        >>> folder = new_backend("mychip", tempfile.mkdtemp())
        >>> sorted(p.name for p in (folder / "src" / "fxquant_mychip").iterdir())
        ['__init__.py', 'kernels.py', 'patterns.py', 'plugin.py', 'qconfig.py']
    """
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        msg = (
            f"backend name must be a lowercase Python identifier (e.g. 'mychip'), got {name!r}: "
            "it names the entry point and the package fxquant_NAME"
        )
        raise ValueError(msg)
    values = {"name": name, "dist": name.replace("_", "-"), "requires": _requires()}
    folder = Path(directory) / f"fxquant-{values['dist']}"
    if folder.exists():
        msg = f"{folder} exists already; choose another --directory or remove it"
        raise FileExistsError(msg)
    for path, text in TEMPLATES.items():
        target = folder / string.Template(path).substitute(values)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(string.Template(text).substitute(values))
    return folder
