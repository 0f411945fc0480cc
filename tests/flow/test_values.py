"""The value kinds and the attention-mask rule of fxquant.flow.values (its docstring's rules)."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable

import fxquant
import pytest
import torch
from fxquant.errors import CalibrationWarning
from fxquant.flow import explain, prepare_fx
from fxquant.flow.values import (
    MASK_FILL_MAX,
    ValueKind,
    constant_nodes,
    fills_a_mask,
    value_kinds,
)
from fxquant.numerics.observer import MinMaxObserver
from hypothesis import given
from hypothesis import strategies as st
from torch import fx, nn


def kinds(model: nn.Module, *inputs: torch.Tensor) -> dict[str, ValueKind]:
    gm = fx.symbolic_trace(model)
    found = value_kinds(gm, dict(gm.named_modules()), inputs)
    return {node.name: kind for node, kind in found.items() if node.op != "output"}


class Filled(nn.Module):
    """Attention scores with positions filled by ``fill`` where the key is padding."""

    def __init__(self, fill: float, *, method: bool = True) -> None:
        super().__init__()
        self.fill, self.method = fill, method

    def forward(self, scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        padding = keep == 0
        if self.method:
            filled = scores.masked_fill(padding, self.fill)
        else:
            filled = torch.masked_fill(scores, padding, self.fill)
        return torch.softmax(filled, -1)


SCORES, KEEP = torch.randn(2, 5, 5), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])


@pytest.mark.parametrize("fill", [-1e9, float("-inf"), torch.finfo(torch.float32).min, -1e3])
@pytest.mark.parametrize("method", [True, False], ids=["method", "function"])
def test_a_fill_standing_for_minus_infinity_masks_the_scores_until_softmax(
    fill: float, method: bool
) -> None:
    found = kinds(Filled(fill, method=method), SCORES, KEEP)
    filled = next(name for name in found if name.startswith("masked_fill"))
    assert found[filled] == ValueKind.MASKED
    assert found["softmax"] == ValueKind.FLOAT


@pytest.mark.parametrize("fill", [-999.0, -10.0, 0.0, 1e4])
def test_an_ordinary_fill_value_leaves_a_plain_float(fill: float) -> None:
    found = kinds(Filled(fill), SCORES, KEEP)
    assert found["masked_fill"] == ValueKind.FLOAT


@given(fill=st.floats(allow_nan=False, width=32))
def test_masked_fill_masks_exactly_when_its_value_is_at_most_the_bound(fill: float) -> None:
    gm = fx.symbolic_trace(Filled(fill))
    (node,) = [n for n in gm.graph.nodes if n.target == "masked_fill"]
    assert fills_a_mask(node) == (fill <= MASK_FILL_MAX)


def test_a_fill_given_by_keyword_counts_too() -> None:
    class Keyword(nn.Module):
        def forward(self, scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return scores.masked_fill(keep == 0, value=-1e4)

    assert kinds(Keyword(), SCORES, KEEP)["masked_fill"] == ValueKind.MASKED


class Additive(nn.Module):
    """BERT's extended attention mask: (1 - mask) * -10000 added to the scores."""

    def forward(self, scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        additive = (1.0 - keep[:, None, :].float()) * -10000.0
        return torch.softmax(scores + additive, -1) * keep[:, None, :].float()


def test_a_float_computed_from_integers_is_a_mask_and_adding_it_masks_the_scores() -> None:
    found = kinds(Additive(), SCORES, KEEP)
    assert [found[name] for name in ("getitem", "float_1", "sub", "mul")] == [
        ValueKind.INT,
        ValueKind.MASK,
        ValueKind.MASK,
        ValueKind.MASK,
    ]
    assert found["add"] == ValueKind.MASKED
    assert found["softmax"] == ValueKind.FLOAT
    assert found["mul_1"] == ValueKind.FLOAT  # a product with a mask is no additive mask


def test_kinds_are_enum_members_equal_to_their_strings() -> None:
    found = kinds(Additive(), SCORES, KEEP)
    assert found["add"] == "masked"
    assert all(isinstance(kind, ValueKind) for kind in found.values())


def test_a_masked_fill_keeps_minus_infinity_away_from_every_observer() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(5, 5)

        def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            scores = self.q(x).masked_fill(keep[:, None, :] == 0, -1e9)
            return torch.softmax(scores, -1)

    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = prepare_fx(Model().eval(), mapping, (SCORES, KEEP))
    prepared(SCORES, KEEP)
    minima = [float(m.min_val) for m in prepared.modules() if isinstance(m, MinMaxObserver)]
    assert minima
    assert min(minima) > -100  # no -1e9 reached an observer
    codes = {e.node: e.reason.code for e in explain(prepared, show=False).entries() if e.reason}
    assert codes["softmax"] == "additive_mask"


def test_finfo_of_a_dtype_is_a_scalar_not_a_float_tensor() -> None:
    # transformers' T5: ``(1.0 - mask) * torch.finfo(dtype).min``; an observer on the float
    # it gives failed calibration with "'float' object has no attribute 'numel'" (#20)
    graph = fx.Graph()
    x = graph.placeholder("x")
    info = graph.call_function(torch.finfo, (torch.float32,))
    low = graph.call_function(getattr, (info, "min"))
    out = graph.call_function(operator.mul, (x, low))
    graph.output(out)
    kinds = value_kinds(fx.GraphModule(nn.Module(), graph), {}, (torch.randn(2),))
    assert kinds[info] == ValueKind.SCALAR
    assert kinds[low] == ValueKind.SCALAR
    assert kinds[out] == ValueKind.FLOAT


class WhereMasked(nn.Module):
    """GPT-2's eager attention: a constant mask built by ``torch.where``, scores filled by one."""

    def forward(self, scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        minimum = torch.finfo(torch.float32).min  # a traced finfo node: see test_gpt2.py
        mask = torch.where(keep.bool(), torch.tensor(0.0), minimum)  # transformers' eager_mask
        causal = torch.ones(5, 5).tril().bool()
        filled = torch.where(causal, scores, scores.new_full((), minimum))
        return torch.softmax(filled + mask, -1)


def test_where_with_finfo_min_is_a_mask_or_masks_the_scores() -> None:
    found = kinds(WhereMasked(), SCORES, KEEP)
    assert found["where"] == ValueKind.MASK
    assert found["where_1"] == ValueKind.MASKED
    assert found["add"] == ValueKind.MASKED
    assert found["softmax"] == ValueKind.FLOAT


@pytest.mark.parametrize(("fill", "kind"), [(-1e4, ValueKind.MASKED), (-10.0, ValueKind.FLOAT)])
def test_where_with_a_number_masks_only_below_the_bound(fill: float, kind: ValueKind) -> None:
    class Where(nn.Module):
        def forward(self, scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            return torch.where(keep == 1, scores, fill)

    assert kinds(Where(), SCORES, KEEP)["where"] == kind


class ConstantMask(nn.Module):
    """A causal mask held as a constant: a registered buffer, or a full() made in forward."""

    def __init__(self, fill: float, *, made_in_forward: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.o = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.fill, self.made_in_forward = fill, made_in_forward
        self.register_buffer("causal", torch.full((6, 6), fill).triu(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        if self.made_in_forward:  # the size comes from x: traced, not folded into a constant
            mask = torch.full((x.size(1), x.size(1)), self.fill).triu(1)
        else:
            mask = self.causal
        return self.o(torch.softmax(scores + mask, -1) @ x)


@pytest.mark.parametrize("made_in_forward", [False, True], ids=["buffer", "full"])
@pytest.mark.parametrize("fill", [-1e4, torch.finfo(torch.float32).min, float("-inf")])
def test_a_constant_mask_of_minus_infinity_keeps_the_scores_float(
    fill: float, made_in_forward: bool
) -> None:
    # before: the add's observer saw the mask (-1e4 .. -3.4e38), its step swallowed every
    # score: softmax gave equal weights, 16 dB from the float model with no warning (-inf:
    # 4 dB, warned only that non-finite values were ignored)
    torch.manual_seed(0)
    model, x = ConstantMask(fill, made_in_forward=made_in_forward).eval(), torch.randn(2, 6, 8)
    weight = MinMaxObserver.with_args(dtype=torch.qint8)
    qconfig = fxquant.QConfig(activation=MinMaxObserver, weight=weight)
    mapping = fxquant.get_default_qconfig_mapping("reference").set_global(qconfig)
    prepared = prepare_fx(model, mapping, (x,))
    for scale in (1.0, 1.5):
        prepared(x * scale)
    minima = [float(m.min_val) for m in prepared.modules() if isinstance(m, MinMaxObserver)]
    assert min(minima) > -100  # no mask value reached an observer
    reference = fxquant.convert_to_reference_fx(prepared)
    with torch.no_grad():
        expected, got = model(x), reference(x)
    sqnr = 10 * torch.log10(expected.pow(2).mean() / (expected - got).pow(2).mean())
    assert sqnr > 25


class MaskInput(ConstantMask):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]  # the mask is an input here
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        return self.o(torch.softmax(scores + mask, -1) @ x)


@pytest.mark.parametrize("fill", [-1e9, float("-inf")])
def test_a_mask_given_as_an_input_keeps_the_scores_float(fill: float) -> None:
    # before: forward(x, generate_square_subsequent_mask(n)) on the reference backend: the
    # mask input and the add were observed (15.1 dB with -1e9, no warning; 3.7 with -inf)
    torch.manual_seed(0)
    model, x = MaskInput(fill).eval(), torch.randn(2, 6, 8)
    mask = torch.full((6, 6), fill).triu(1)
    assert kinds(model, x, mask)["mask"] == ValueKind.MASK
    prepared = prepare_fx(model, fxquant.get_default_qconfig_mapping("reference"), (x, mask))
    for scale in (1.0, 1.5):
        prepared(x * scale, mask)
    minima = [float(m.min_val) for m in prepared.modules() if isinstance(m, MinMaxObserver)]
    assert min(minima) > -100  # no mask value reached an observer
    converted = fxquant.convert_fx(prepared)
    with torch.no_grad():
        expected, got = model(x, mask), converted(x, mask)
    assert 10 * torch.log10(expected.pow(2).mean() / (expected - got).pow(2).mean()) > 25


def test_an_input_with_positive_values_is_data_however_negative_its_minimum() -> None:
    audio = torch.linspace(-30000, 30000, 12).view(2, 6)  # unnormalized samples
    assert kinds(nn.Linear(6, 2), audio)["input_1"] == ValueKind.FLOAT


class ChunksReversed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.cat(y.chunk(2, 1)[::-1], 1) + y.split(2, 1)[0].sum(1, keepdim=True)


def test_a_slice_of_a_split_is_a_tuple_never_observed_an_index_is_a_tensor() -> None:
    assert kinds(ChunksReversed(), torch.randn(1, 3, 4, 4)) == {
        "x": ValueKind.FLOAT,
        "conv": ValueKind.FLOAT,
        "chunk": ValueKind.FLOAT,
        "getitem": ValueKind.SCALAR,  # chunk(...)[::-1]: a tuple
        "cat": ValueKind.FLOAT,
        "split": ValueKind.FLOAT,
        "getitem_1": ValueKind.FLOAT,  # split(...)[0]: a tensor
        "sum_1": ValueKind.FLOAT,
        "add": ValueKind.FLOAT,
    }


@pytest.mark.parametrize("backend", ["reference", "x86", "fbgemm", "executorch"])
def test_a_model_slicing_the_tuple_of_a_chunk_calibrates_and_converts(backend: str) -> None:
    # before: an observer was put on `y.chunk(2, 1)[::-1]` and calibration failed with
    # "AttributeError: 'tuple' object has no attribute 'numel'"
    torch.manual_seed(0)
    model, x = ChunksReversed().eval(), torch.randn(2, 3, 8, 8)
    prepared = prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping(backend),
        (x,),
        backend_config=fxquant.get_backend_config(backend),
    )
    prepared(x)
    converted = fxquant.convert_fx(prepared)
    with torch.no_grad():
        expected, got = model(x), converted(x)
    assert float(10 * torch.log10(expected.pow(2).sum() / (expected - got).pow(2).sum())) > 25


class UnsafeChunksJoined(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.conv(x).unsafe_chunk(2, 1), 1)


def test_a_cat_of_the_tuple_of_unsafe_chunk_calibrates_and_converts() -> None:
    # the tuple unsafe_chunk returns has no range: an observer on cat's input (the tuple)
    # failed at calibration with "AttributeError: 'tuple' object has no attribute 'numel'"
    torch.manual_seed(0)
    model, x = UnsafeChunksJoined().eval(), torch.randn(2, 3, 8, 8)
    reference = fxquant.get_backend_config("reference")
    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = prepare_fx(model, mapping, (x,), backend_config=reference)
    prepared(x)
    converted = fxquant.convert_fx(prepared)
    with torch.no_grad():
        expected, got = model(x), converted(x)
    assert float(10 * torch.log10(expected.pow(2).sum() / (expected - got).pow(2).sum())) > 25


class PositionFeature(nn.Module):
    """Embeddings plus a feature computed from the integer ids: no mask anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.fc = nn.Embedding(20, 8), nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embed(ids) + ids.float().unsqueeze(-1) * 0.1)


def test_a_float_made_from_integers_without_minus_infinity_is_added_as_data() -> None:
    # before: `ids.float() * 0.1` was a mask by rule 1, its add "masked": fc and everything
    # after it stayed float, explain said additive_mask (no quantization, SQNR inf)
    ids = torch.randint(0, 20, (4, 6))
    assert kinds(PositionFeature(), ids)["add"] == ValueKind.FLOAT
    assert kinds(Additive(), SCORES, KEEP)["add"] == ValueKind.MASKED  # -10000: still a mask
    prepared = prepare_fx(
        PositionFeature().eval(),
        fxquant.get_default_qconfig_mapping("x86"),
        (ids,),
        backend_config=fxquant.get_backend_config("x86"),
    )
    prepared(ids)
    entries = {e.node: e for e in explain(fxquant.convert_fx(prepared), show=False).entries()}
    assert entries["fc"].status == "lowered"


def test_a_weight_slice_reads_no_activation_and_a_deep_chain_of_ops_does() -> None:
    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(3000):  # deeper than Python's recursion limit
                x = x.neg()
            return nn.functional.linear(x, self.weight[:2])

    gm = fx.symbolic_trace(Deep())
    by_name = {n.name: n for n in gm.graph.nodes}
    constants = constant_nodes(gm.graph)
    assert by_name["getitem"] in constants
    assert by_name["linear"] not in constants


class Fills(nn.Module):
    """Tensors of one value made in an activation's shape, then ops no pattern matches."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        zeros = torch.zeros_like(y)
        half = y.new_empty(y.shape)
        half.fill_(0.5)  # made on_copy("fill_", ...) at capture
        return self.fc(y + zeros.exp()) * half.cos()


def test_a_fill_reads_no_values_so_prepare_calls_it_constant_and_convert_names_it_nowhere() -> None:
    # torch.zeros_like(y) holds zeros whatever y holds: prepare reported it and the ops on it
    # no_pattern (skipped: strict mode refused the model), convert called it one value by
    # design. One rule now: a constant for both
    reference = fxquant.get_backend_config("reference")
    mapping = fxquant.get_default_qconfig_mapping("reference")
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    prepared = prepare_fx(Fills().eval(), mapping, (x,), backend_config=reference, strict=True)
    entries = {e.node: e for e in explain(prepared, show=False).entries()}
    for name in ("zeros_like", "exp", "new_empty", "fill_", "cos"):
        assert entries[name].status == "float"
        assert entries[name].reason is not None
        assert entries[name].reason.code == "constant"
    assert entries["add"].status == entries["mul"].status == "quantized"
    prepared(x)  # the add's and the mul's input observers see 1.0 and cos(0.5) only
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        fxquant.convert_fx(prepared)


def test_a_value_read_a_number_input_or_reversed_pieces_are_no_constant() -> None:
    # .item() reads an activation's values, a Python number passed to forward is an input,
    # and chunk(...)[::-1] holds the activation's pieces: a tensor computed from any of them
    # changes from call to call (the value kinds call all three scalars)
    g = fx.Graph()
    x, k = g.placeholder("x"), g.placeholder("k")
    ones = g.call_function(torch.ones, (4,))
    read = g.call_function(operator.mul, (g.call_method("item", (g.call_method("sum", (x,)),)), 2))
    scaled, times_k = g.call_method("mul", (ones, read)), g.call_method("mul", (ones, k))
    reversed_pieces = g.call_function(
        operator.getitem, (g.call_method("chunk", (x, 2)), slice(None, None, -1))
    )
    joined = g.call_function(torch.cat, (reversed_pieces,))
    shape = g.call_method("mul", (ones, g.call_method("size", (x, 0))))
    g.output((scaled, times_k, joined, shape))
    assert constant_nodes(g) == {ones, shape.args[1], shape}


def test_a_fill_of_an_activations_value_or_a_users_function_named_ones_is_no_constant() -> None:
    # torch.full_like(x, v) reads v's values (x's shape only): with v from an activation it
    # changes from call to call; a function of the user's that is called ``ones`` is no fill
    g = fx.Graph()
    x = g.placeholder("x")
    peak = g.call_method("max", (x,))
    full_like = g.call_function(torch.full_like, (x, peak))
    filled = g.call_method("fill_", (g.call_method("clone", (x,)), peak))
    new_full = g.call_method("new_full", (x, (2,), 0.5))
    zeros = g.call_function(
        torch.zeros_like, (x,), {"dtype": g.call_function(getattr, (x, "dtype"))}
    )

    def ones(t: torch.Tensor) -> torch.Tensor:
        return t * 3

    users = g.call_function(ones, (x,))
    g.output((full_like, filled, new_full, zeros, users))
    assert constant_nodes(g) == {new_full, zeros, zeros.kwargs["dtype"]}


def _graph(build: Callable[[fx.Graph], None]) -> fx.GraphModule:
    graph = fx.Graph()
    build(graph)
    return fx.GraphModule(nn.Module(), graph)


def _padding_mask(graph: fx.Graph) -> None:
    """transformers' eager DistilBERT: ``scores.masked_fill(mask.expand_as(scores),
    torch.tensor(torch.finfo(scores.dtype).min))`` and BERT's ``ones(shape)``-built mask."""
    scores, keep = graph.placeholder("scores"), graph.placeholder("keep")
    shape = graph.call_method("size", (keep,))
    ones = graph.call_function(torch.ones, (shape,))
    mask = graph.call_method("expand_as", (graph.call_function(operator.eq, (keep, 0)), scores))
    dtype = graph.call_function(getattr, (scores, "dtype"))
    low = graph.call_function(getattr, (graph.call_function(torch.finfo, (dtype,)), "min"))
    fill = graph.call_function(torch.tensor, (low,))
    masked = graph.call_method("masked_fill", (scores, mask, fill))
    cast = graph.call_method("to", (keep, dtype))
    attention = graph.call_function(torch.nn.functional.scaled_dot_product_attention)
    attention.args = (scores, scores, scores)
    attention.kwargs = {"attn_mask": masked}
    graph.output((ones, cast, attention))


def test_a_mask_written_as_transformers_writes_it_is_classified_as_one() -> None:
    gm = _graph(_padding_mask)
    kinds = value_kinds(gm, {}, (torch.randn(2, 4, 4), torch.ones(2, 4, 4, dtype=torch.long)))
    found = {n.name: kinds[n] for n in gm.graph.nodes}
    by_name = {n.name: n for n in gm.graph.nodes}
    assert found["expand_as"] == ValueKind.INT  # the mask's values, in the scores' shape
    assert fills_a_mask(by_name["masked_fill"])  # a tensor of finfo.min stands for -inf
    assert found["masked_fill"] == ValueKind.MASKED
    assert found["to"] == ValueKind.MASK  # cast to the scores' traced dtype: a float mask
    assert found["scaled_dot_product_attention"] == ValueKind.FLOAT  # sdpa takes the mask in
    constants = constant_nodes(gm.graph)
    assert by_name["ones"] in constants  # made in the input's shape
    assert by_name["masked_fill"] not in constants
