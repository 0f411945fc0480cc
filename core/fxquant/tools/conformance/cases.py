"""The single-op cases ``fxquant check`` adds to the test kit's, and the deployed ones."""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fxquant.config.qconfig import QConfig
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.numerics import observer
from fxquant.tools import testing

# the kit's own input shapes (image, two images, sequence, vector) and function wrapper
from fxquant.tools.testing.cases import _fn, _img, _img2, _seq, _vec

__all__ = ["DEPLOYED_CASES", "VARIANT_CASES"]


def _vol(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, c, 2, s, s)]


def _rnn_sequence(b: int, c: int, s: int) -> list[tuple[int, ...]]:
    return [(b, s, c)]  # batch first


class _LastState(nn.Module):
    """A recurrent module's output tensor (an LSTM's or GRU's sequence, a cell's state)."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        # decided here: tracing cannot tell a module's tuple output from a tensor
        self.first = not isinstance(rnn, (nn.GRUCell, nn.RNNCell))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.rnn(x)
        return out[0] if self.first else out  # type: ignore[no-any-return]  # a module call


def _dynamic_recurrent(backend: str) -> object:
    # 7-bit dynamic activations (torch's reduce_range), full range on qnnpack (its kernels
    # ignore reduce_range): what the engines' recurrent kernels run exactly on any CPU
    activation = observer.PlaceholderObserver.with_args(
        dtype=torch.uint8,
        quant_min=0,
        quant_max=255 if backend == "qnnpack" else 127,
        is_dynamic=True,
    )
    qconfig = QConfig(activation=activation, weight=observer.default_weight_observer)
    mapping = QConfigMapping()
    for cls in (nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell, nn.RNNCell):
        mapping.set_object_type(cls, qconfig)
    return mapping


def _binary(op: Callable[..., torch.Tensor], relu: bool = False) -> Callable[[int, int], nn.Module]:
    return lambda i, o: testing.Binary(op, relu=relu)


VARIANT_CASES: tuple[testing.Case, ...] = (
    testing.Case("operator_add", _binary(operator.add), _img2),
    testing.Case("operator_add_relu", _binary(operator.add, relu=True), _img2),
    testing.Case("operator_mul", _binary(operator.mul), _img2),
    testing.Case("matmul", _binary(torch.matmul), _img2),
    testing.Case("stack", _fn(lambda x: torch.stack([x, x], 1)), _img),
    testing.Case("conv1d_relu", lambda i, o: nn.Sequential(nn.Conv1d(i, o, 3), nn.ReLU()), _seq),
    testing.Case("conv3d_relu", lambda i, o: nn.Sequential(nn.Conv3d(i, o, 1), nn.ReLU()), _vol),
    testing.Case("conv_transpose1d", lambda i, o: nn.ConvTranspose1d(i, o, 2, stride=2), _seq),
    testing.Case("max_pool1d", lambda i, o: nn.MaxPool1d(2), _seq),
    testing.Case("avg_pool1d", lambda i, o: nn.AvgPool1d(2), _seq),
    testing.Case("max_pool3d", lambda i, o: nn.MaxPool3d((1, 2, 2)), _vol),
    testing.Case("f_max_pool2d", _fn(lambda x: F.max_pool2d(x, 2)), _img),
    testing.Case("f_avg_pool2d", _fn(lambda x: F.avg_pool2d(x, 2)), _img),
    testing.Case("f_relu", _fn(F.relu), _img),
    testing.Case("f_hardtanh", _fn(F.hardtanh), _img),
    testing.Case("f_hardswish", _fn(F.hardswish), _img),
    testing.Case("f_leaky_relu", _fn(lambda x: F.leaky_relu(x, 0.2)), _img),
    testing.Case("f_elu", _fn(F.elu), _img),
    testing.Case("clamp", _fn(lambda x: torch.clamp(x, -1.0, 1.0)), _img),
    testing.Case("torch_tanh", _fn(torch.tanh), _img),
    testing.Case("sigmoid_module", lambda i, o: nn.Sigmoid(), _img),
    testing.Case("torch_mean", _fn(lambda x: torch.mean(x, (2, 3))), _img),
    testing.Case("method_relu", _fn(lambda x: x.relu()), _img),
    testing.Case("method_sigmoid", _fn(lambda x: x.sigmoid()), _img),
    testing.Case("method_flatten", _fn(lambda x: x.flatten(1)), _img),
    testing.Case("method_view", _fn(lambda x: x.view(x.shape[0], -1)), _img),
    testing.Case("permute", _fn(lambda x: x.permute(0, 2, 3, 1)), _img),
    testing.Case("transpose", _fn(lambda x: torch.transpose(x, 2, 3)), _img),
    testing.Case("unsqueeze", _fn(lambda x: x.unsqueeze(1)), _img),
    testing.Case("contiguous", _fn(lambda x: x.contiguous()), _img),
    testing.Case("pixel_shuffle", lambda i, o: nn.PixelShuffle(1), _img),
    testing.Case("flatten_module", lambda i, o: nn.Flatten(), _img),
    testing.Case("instance_norm1d", lambda i, o: nn.InstanceNorm1d(i), _seq),
    testing.Case("prelu", lambda i, o: nn.PReLU(), _img),
    testing.Case(
        "lstm_dynamic",
        lambda i, o: _LastState(nn.LSTM(i, o, batch_first=True)),
        _rnn_sequence,
        _dynamic_recurrent,
    ),
    testing.Case(
        "gru_dynamic",
        lambda i, o: _LastState(nn.GRU(i, o, batch_first=True, bidirectional=True)),
        _rnn_sequence,
        _dynamic_recurrent,
    ),
    testing.Case(
        "lstm_cell_dynamic", lambda i, o: _LastState(nn.LSTMCell(i, o)), _vec, _dynamic_recurrent
    ),
    testing.Case(
        "gru_cell_dynamic", lambda i, o: _LastState(nn.GRUCell(i, o)), _vec, _dynamic_recurrent
    ),
    testing.Case(
        "rnn_cell_dynamic", lambda i, o: _LastState(nn.RNNCell(i, o)), _vec, _dynamic_recurrent
    ),
)
"""Single-op cases beyond the kit's: the spellings of the same ops (``operator.add``,
``F.relu``, ``x.relu()``...) and the other ranks, so more of each backend's rules are
reached. ``fxquant check`` runs them after :data:`fxquant.tools.testing.LOWERING_CASES`."""

DEPLOYED_CASES = ("conv2d", "linear", "add")
"""The cases a deployed backend runs (exporting and deploying takes seconds a case)."""
