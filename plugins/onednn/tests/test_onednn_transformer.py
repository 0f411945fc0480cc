"""Transformer kernels of the onednn backend (#12): float attention as one SDPA call, dynamic
linears that share an input quantize it once, a GELU after a dynamic linear as its post op."""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Iterator
from typing import Any

import fxquant
import fxquant.numerics.observer
import pytest
import torch
import torch.nn.functional as F
from fxquant.config.defaults import default_dynamic_qconfig
from fxquant_onednn.attention import Attention
from fxquant_onednn.qconfig import per_channel_weight
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class SelfAttention(nn.Module):
    """BERT's self-attention written out: q/k/v linears, scores, mask, softmax, context."""

    def __init__(
        self,
        hidden: int = 16,
        heads: int = 2,
        *,
        divide: bool = True,
        softmax: Callable[[torch.Tensor], torch.Tensor] = lambda s: F.softmax(s, dim=-1),
    ) -> None:
        super().__init__()
        self.heads, self.head = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.dropout = nn.Dropout(0.1)
        self.out = nn.Linear(hidden, hidden)
        self.divide, self.softmax = divide, softmax

    def split(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens = x.shape[0], x.shape[1]
        return x.view(batch, tokens, self.heads, self.head).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split(f(x)) for f in (self.query, self.key, self.value))
        scores = torch.matmul(q, k.transpose(-1, -2))
        scores = scores / self.head**0.5 if self.divide else scores * self.head**-0.5
        probs = self.dropout(self.softmax(scores + mask))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3)
        return self.out(context.reshape(x.shape[0], x.shape[1], -1))


def inputs(batch: int = 2, tokens: int = 5, hidden: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros(batch, 1, 1, tokens)
    mask[..., -1] = torch.finfo(torch.float32).min  # the last token is padding
    return torch.randn(batch, tokens, hidden), mask


def lower(model: nn.Module, mapping: Any, example: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    prepared = fxquant.prepare_fx(
        model.eval(), mapping, example, backend_config=fxquant.get_backend_config("onednn")
    )
    with torch.no_grad():
        prepared(*example)
    return fxquant.convert_fx(prepared)


def kernels(gm: fx.GraphModule) -> list[str]:
    modules = dict(gm.named_modules())
    return [type(modules[n.target]).__name__ for n in gm.graph.nodes if n.op == "call_module"]


@settings(deadline=None, max_examples=10)
@given(
    divide=st.booleans(),
    softmax=st.sampled_from(["F.softmax", "method", "nn.Softmax", "torch.softmax"]),
    batch=st.integers(1, 3),
    tokens=st.integers(1, 9),
)
def test_float_attention_runs_as_one_sdpa_kernel_with_the_float_ops_results(
    divide: bool, softmax: str, batch: int, tokens: int
) -> None:
    torch.manual_seed(0)
    softmaxes: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "F.softmax": lambda s: F.softmax(s, dim=-1),
        "method": lambda s: s.softmax(-1),
        "nn.Softmax": nn.Softmax(dim=-1),
        "torch.softmax": lambda s: torch.softmax(s, -1),
    }
    model = SelfAttention(divide=divide, softmax=softmaxes[softmax]).eval()
    example = inputs(batch, tokens)
    lowered = lower(copy.deepcopy(model), default_dynamic_mapping(), example)
    assert "Attention" in kernels(lowered), lowered.graph
    with torch.no_grad():
        assert torch.allclose(lowered(*example), lower_reference(model, example), atol=1e-2)


def default_dynamic_mapping() -> Any:
    return fxquant.QConfigMapping().set_object_type(nn.Linear, default_dynamic_qconfig)


def lower_reference(model: nn.Module, example: tuple[torch.Tensor, ...]) -> torch.Tensor:
    prepared = fxquant.prepare_fx(
        copy.deepcopy(model).eval(),
        default_dynamic_mapping(),
        example,
        backend_config=fxquant.get_backend_config("onednn"),
    )
    return fxquant.convert_to_reference_fx(prepared)(*example)  # type: ignore[no-any-return]


def test_attention_kernel_equals_the_float_ops_it_replaces() -> None:
    torch.manual_seed(0)
    model = SelfAttention().eval()
    example = inputs(3, 7)
    lowered = lower(copy.deepcopy(model), fxquant.QConfigMapping(), example)
    assert kernels(lowered).count("Attention") == 1
    with torch.no_grad():
        assert torch.allclose(lowered(*example), model(*example), atol=1e-5)


def test_a_softmax_over_another_axis_replays_the_ops_instead_of_sdpa() -> None:
    torch.manual_seed(0)
    model = SelfAttention(softmax=lambda s: F.softmax(s, dim=-2)).eval()
    example = inputs(2, 4)
    lowered = lower(copy.deepcopy(model), fxquant.QConfigMapping(), example)
    (attention,) = (m for m in lowered.modules() if isinstance(m, Attention))
    assert attention.roles.softmax_dim == -2
    with torch.no_grad():
        assert torch.allclose(lowered(*example), model(*example), atol=1e-5)


def test_quantized_matmuls_are_left_to_the_quantized_rules() -> None:
    # every op int8: the float attention rule must not take quantized matmuls
    torch.manual_seed(0)
    minmax = fxquant.QConfig(
        activation=fxquant.observer.MinMaxObserver,
        weight=per_channel_weight(is_qat=False),  # 7 bits without VNNI: exact there
    )
    mapping = fxquant.get_default_qconfig_mapping("reference").set_global(minmax)
    lowered = lower(SelfAttention(), mapping, inputs())
    assert "Attention" not in kernels(lowered)


def test_dynamic_query_key_value_quantize_their_shared_input_once() -> None:
    torch.manual_seed(0)
    model = SelfAttention().eval()
    example = inputs(2, 6)
    lowered = lower(copy.deepcopy(model), default_dynamic_mapping(), example)
    assert kernels(lowered).count("SharedInputDynamicQLinear") == 1
    assert kernels(lowered).count("DynamicQLinear") == 1  # the output projection
    with torch.no_grad():
        assert torch.allclose(lowered(*example), lower_reference(model, example), atol=1e-4)


@pytest.mark.parametrize("gelu", [nn.GELU(), F.gelu, nn.GELU(approximate="tanh")])
def test_a_gelu_after_a_dynamic_linear_runs_as_its_post_op(gelu: Any) -> None:
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 32)
            self.gelu = gelu

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.gelu(self.fc(x))

    model, x = Block().eval(), torch.randn(4, 16)
    lowered = lower(copy.deepcopy(model), default_dynamic_mapping(), (x,))
    assert kernels(lowered) == ["DynamicQLinear"]
    assert lowered.get_submodule("fc").post_op == "gelu"
    with torch.no_grad():
        assert torch.allclose(lowered(x), lower_reference(model, (x,)), atol=1e-4)


def linear_only_mapping() -> Any:
    """Linears int8, everything else float: x86's transformer mapping with min/max observers."""
    qconfig = fxquant.QConfig(
        activation=fxquant.observer.MinMaxObserver,
        weight=per_channel_weight(is_qat=False),  # 7 bits without VNNI: exact there
    )
    return fxquant.QConfigMapping().set_object_type(nn.Linear, qconfig)


class Residual(nn.Module):
    """``norm(residual + dropout(linear(x)))`` with the add spelled ``spelling``; the residual
    is read again after the add, and ``residual`` may broadcast."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.linear, self.dropout, self.norm = nn.Linear(16, 16), nn.Dropout(), nn.LayerNorm(16)
        self.spelling = spelling

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        y = self.dropout(self.linear(x))
        if self.spelling == "residual + y":
            total = residual + y
        elif self.spelling == "torch.add":
            total = torch.add(y, residual)
        else:
            total = y + residual
        return self.norm(total) * residual


@pytest.mark.parametrize("spelling", ["y + residual", "residual + y", "torch.add"])
@pytest.mark.parametrize("residual_shape", [(3, 5, 16), (16,)])
def test_a_residual_add_runs_inside_the_linear_within_one_step(
    spelling: str, residual_shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    model = Residual(spelling).eval()
    example = (torch.randn(3, 5, 16), torch.randn(residual_shape))
    lowered = lower(copy.deepcopy(model), linear_only_mapping(), example)
    prepared = fxquant.prepare_fx(
        copy.deepcopy(model), linear_only_mapping(), example,
        backend_config=fxquant.get_backend_config("onednn"),
    )  # fmt: skip
    with torch.no_grad():
        prepared(*example)
    reference = fxquant.convert_to_reference_fx(prepared)
    assert lowered.get_submodule("linear").adds_input
    adds = [n for n in lowered.graph.nodes if n.target in (torch.add, operator.add)]
    assert adds == []
    residual_before = example[1].clone()
    with torch.no_grad():
        got, want = lowered(*example), reference(*example)
    assert torch.equal(example[1], residual_before)  # the add is in place on the kernel's own
    # the linear's output within one step of the reference (~0.005 here), through LayerNorm
    assert torch.allclose(got, want, atol=0.05)


def test_a_kernel_that_added_a_value_takes_no_later_step() -> None:
    # linear -> + residual -> linear: the first kernel must not quantize before the add
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.second(self.first(x) + x)

    model, x = Block().eval(), torch.randn(6, 8)
    lowered = lower(copy.deepcopy(model), linear_only_mapping(), (x,))
    first = lowered.get_submodule("first")
    assert first.adds_input
    assert first.out_dtype == torch.float32
    prepared = fxquant.prepare_fx(
        copy.deepcopy(model), linear_only_mapping(), (x,),
        backend_config=fxquant.get_backend_config("onednn"),
    )  # fmt: skip
    with torch.no_grad():
        prepared(x)
        reference = fxquant.convert_to_reference_fx(prepared)
        assert torch.allclose(lowered(x), reference(x), atol=0.05)


def test_a_residual_add_after_a_dynamic_linear_runs_inside_it() -> None:
    torch.manual_seed(0)
    model = Residual("residual + y").eval()
    example = (torch.randn(3, 5, 16), torch.randn(3, 5, 16))
    lowered = lower(copy.deepcopy(model), default_dynamic_mapping(), example)
    assert lowered.get_submodule("linear").adds_input
    assert [n for n in lowered.graph.nodes if n.target in (torch.add, operator.add)] == []
    with torch.no_grad():
        assert torch.allclose(lowered(*example), lower_reference(model, example), atol=1e-4)
