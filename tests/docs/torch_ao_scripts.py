"""torch.ao FX scripts as a migrating user has them, and the one change fxquant asks: the imports.

Each script follows a torch.ao document step by step (#22): the BackendConfig
tutorial (seed 004) with its two faulty-config experiments, and the examples
of the quantize_fx docstrings (seed 002). ``to_fxquant`` rewrites their import
lines and nothing else; tests/docs/test_migration.py runs both versions.
"""

from __future__ import annotations

import re

__all__ = ["DOCSTRING_EXAMPLES", "TUTORIAL", "to_fxquant"]

# torch.ao module -> the fxquant module with the same names (longest prefix first)
IMPORT_MAP = (
    ("torch.ao.quantization.quantize_fx", "fxquant"),
    ("torch.ao.quantization.backend_config", "fxquant"),
    ("torch.ao.quantization.qconfig_mapping", "fxquant"),
    ("torch.ao.quantization.fx.custom_config", "fxquant"),
    ("torch.ao.quantization", "fxquant"),
)
_FROM = re.compile(r"^from (torch\.ao[\w.]*) import", re.M)


def to_fxquant(script: str) -> str:
    """``script`` with each ``from torch.ao... import`` line importing from fxquant instead."""

    def swap(found: re.Match[str]) -> str:
        module = found.group(1)
        for ao, ours in IMPORT_MAP:
            if module == ao:
                return f"from {ours} import"
        msg = f"no fxquant module for {module}"
        raise AssertionError(msg)

    return _FROM.sub(swap, script)


# The tutorial: a backend with a quantized linear and a fused conv-relu. Its body names
# torch.ao.nn classes as the tutorial does (fxquant reads them as its own, by name), and
# torch.nn.qat.Linear (torch's alias of torch.ao.nn.qat.Linear).
TUTORIAL = """\
import torch
from torch.ao.quantization import (
    default_weight_observer,
    get_default_qconfig_mapping,
    MinMaxObserver,
    QConfig,
    QConfigMapping,
)
from torch.ao.quantization.backend_config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
)
from torch.ao.quantization.quantize_fx import prepare_fx, convert_fx

quint8_with_constraints = DTypeWithConstraints(
    dtype=torch.quint8,
    quant_min_lower_bound=0,
    quant_max_upper_bound=255,
    scale_min_lower_bound=2**-12,
)
weighted_int8_dtype_config = DTypeConfig(
    input_dtype=quint8_with_constraints,
    output_dtype=quint8_with_constraints,
    weight_dtype=torch.qint8,
    bias_dtype=torch.float,
)


def fuse_conv2d_relu(is_qat, conv, relu):
    return torch.ao.nn.intrinsic.ConvReLU2d(conv, relu)


linear_config = (
    BackendPatternConfig()
    .set_pattern(torch.nn.Linear)
    .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
    .add_dtype_config(weighted_int8_dtype_config)
    .set_root_module(torch.nn.Linear)
    .set_qat_module(torch.nn.qat.Linear)
    .set_reference_quantized_module(torch.ao.nn.quantized.reference.Linear)
)
conv_relu_config = (
    BackendPatternConfig()
    .set_pattern((torch.nn.Conv2d, torch.nn.ReLU))
    .set_fused_module(torch.ao.nn.intrinsic.ConvReLU2d)
    .set_fuser_method(fuse_conv2d_relu)
)
fused_conv_relu_config = (
    BackendPatternConfig()
    .set_pattern(torch.ao.nn.intrinsic.ConvReLU2d)
    .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
    .add_dtype_config(weighted_int8_dtype_config)
    .set_root_module(torch.nn.Conv2d)
    .set_qat_module(torch.ao.nn.intrinsic.qat.ConvReLU2d)
    .set_reference_quantized_module(torch.ao.nn.quantized.reference.Conv2d)
)
backend_config = (
    BackendConfig("my_backend")
    .set_backend_pattern_config(linear_config)
    .set_backend_pattern_config(conv_relu_config)
    .set_backend_pattern_config(fused_conv_relu_config)
)

activation_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127, eps=2**-12)
qconfig = QConfig(activation=activation_observer, weight=default_weight_observer)
qconfig_mapping = (
    QConfigMapping()
    .set_object_type(torch.nn.Linear, qconfig)
    .set_object_type(torch.nn.Conv2d, qconfig)
    .set_object_type(torch.nn.BatchNorm2d, qconfig)
    .set_object_type(torch.nn.ReLU, qconfig)
)


class MyModel(torch.nn.Module):
    def __init__(self, use_bn: bool):
        super().__init__()
        self.linear = torch.nn.Linear(10, 3)
        self.conv = torch.nn.Conv2d(3, 3, 3)
        self.bn = torch.nn.BatchNorm2d(3)
        self.relu = torch.nn.ReLU()
        self.sigmoid = torch.nn.Sigmoid()
        self.use_bn = use_bn

    def forward(self, x):
        x = self.linear(x)
        x = self.conv(x)
        if self.use_bn:
            x = self.bn(x)
        x = self.relu(x)
        x = self.sigmoid(x)
        return x


torch.manual_seed(0)
example_inputs = (torch.rand(1, 3, 10, 10, dtype=torch.float),)
x = torch.rand(2, 3, 10, 10)
results = {}
experiments = {
    "conv_relu": (False, qconfig_mapping),
    "conv_bn_relu": (True, qconfig_mapping),  # not in the backend: stays float
    "default_mapping": (False, get_default_qconfig_mapping()),  # fails the constraints
}
for experiment, (use_bn, mapping) in experiments.items():
    torch.manual_seed(0)
    model = MyModel(use_bn=use_bn).eval()
    prepared = prepare_fx(model, mapping, example_inputs, backend_config=backend_config)
    prepared(*example_inputs)  # calibrate
    converted = convert_fx(prepared, backend_config=backend_config)
    results[experiment] = (model, converted)
"""


# The quantize_fx docstrings' examples, completed so that they run: the data the comments
# leave to the reader (a data loader, sample data), and the convert calls of convert_fx's
# and convert_to_reference_fx's docstrings (on copies: torch.ao converts in place).
# prepare_qat_fx's example calls
# get_default_qat_qconfig("fbgemm") where it imports get_default_qat_qconfig_mapping (a
# NameError on torch.ao too): the mapping it imports is what it means.
DOCSTRING_EXAMPLES = """\
import copy

import torch
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization import get_default_qat_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_fx, convert_to_reference_fx
from torch.ao.quantization.quantize_fx import fuse_fx, prepare_fx, prepare_qat_fx


class Submodule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(5, 5)

    def forward(self, x):
        x = self.linear(x)
        return x


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(5, 5)
        self.sub = Submodule()

    def forward(self, x):
        x = self.linear(x)
        x = self.sub(x) + x
        return x


torch.manual_seed(0)
example_inputs = (torch.randn(1, 5),)
sample_inference_data = [(torch.randn(8, 5), None) for _ in range(4)]

# fuse_fx
fused = fuse_fx(M().eval())

# prepare_fx, then convert_fx and convert_to_reference_fx
float_model = M().eval()


def calibrate(model, data_loader):
    model.eval()
    with torch.no_grad():
        for image, target in data_loader:
            model(image)


qconfig_mapping = get_default_qconfig_mapping("fbgemm")
prepared_model = prepare_fx(float_model, qconfig_mapping, example_inputs)
calibrate(prepared_model, sample_inference_data)
# torch.ao converts in place: each convert gets its own copy
reference_quantized_model = convert_to_reference_fx(copy.deepcopy(prepared_model))
quantized_model = convert_fx(prepared_model)

# prepare_qat_fx
torch.manual_seed(1)
qat_model = M().train()


def train_loop(model, train_data):
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for image, target in train_data:
        loss = model(image).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


qat_mapping = get_default_qat_qconfig_mapping("fbgemm")
prepared_qat = prepare_qat_fx(qat_model, qat_mapping, example_inputs)
train_loop(prepared_qat, sample_inference_data)
quantized_qat = convert_fx(prepared_qat.eval())

x = torch.randn(4, 5)
"""
