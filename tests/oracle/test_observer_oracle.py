"""fxquant's observers against torch.ao's: same settings, same data, bit-identical qparams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from fxquant.dtypes import qscheme_name
from fxquant.errors import ConfigError
from fxquant.numerics import observer as fxobs
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests import oracle

torch.set_num_threads(1)

ao = oracle.load()

DTYPES = {  # plain spelling -> torch.ao's spelling
    torch.uint8: torch.quint8,
    torch.int8: torch.qint8,
}
QUANTIZED_NAMES = {torch.uint8: "quint8", torch.int8: "qint8"}

# Every float32 magnitude from subnormal to 2**100 (larger ones overflow max - min to inf).
finite_floats = st.floats(min_value=-(2.0**100), max_value=2.0**100, width=32, allow_nan=False)
special_batches = st.sampled_from(
    [
        torch.zeros(7),
        torch.full((5,), 3.5),
        torch.full((5,), -2.0),
        torch.tensor([1e-38, 0.0, -1e-38]),
        torch.tensor([0.0, 1.0]),
    ]
)


@st.composite
def batch(draw: Any, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if shape is None and draw(st.integers(0, 5)) == 0:
        return draw(special_batches).clone()
    if shape is None:
        shape = (draw(st.integers(1, 40)),)
    numel = 1
    for size in shape:
        numel *= size
    if draw(st.booleans()):
        values = draw(st.lists(finite_floats, min_size=numel, max_size=numel))
        return torch.tensor(values, dtype=torch.float32).reshape(shape)
    # typical activations: a normal sample at a drawn magnitude
    seed = draw(st.integers(0, 2**31 - 1))
    magnitude = 10.0 ** draw(st.integers(-20, 20))
    offset = draw(st.sampled_from([0.0, 1.0, -3.0]))
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) + offset) * magnitude


@dataclass(frozen=True)
class Settings:
    """One observer configuration, expressed for fxquant and for torch.ao."""

    dtype: torch.dtype
    quantized_name: bool
    qscheme: str
    qscheme_as_string: bool
    reduce_range: bool
    quant_range: tuple[int, int] | None
    eps: float

    def mine(self) -> dict[str, Any]:
        dtype = getattr(torch, QUANTIZED_NAMES[self.dtype]) if self.quantized_name else self.dtype
        qscheme: object = self.qscheme if self.qscheme_as_string else getattr(torch, self.qscheme)
        return self._common(dtype=dtype, qscheme=qscheme)

    def theirs(self) -> dict[str, Any]:
        return self._common(dtype=DTYPES[self.dtype], qscheme=getattr(torch, self.qscheme))

    def _common(self, **kwargs: Any) -> dict[str, Any]:
        kwargs.update(reduce_range=self.reduce_range, eps=self.eps)
        if self.quant_range is not None:
            kwargs.update(quant_min=self.quant_range[0], quant_max=self.quant_range[1])
        return kwargs


@st.composite
def settings_for(draw: Any, qschemes: list[str]) -> Settings:
    dtype = draw(st.sampled_from(list(DTYPES)))
    low, high = (0, 255) if dtype == torch.uint8 else (-128, 127)
    quant_range = None
    if draw(st.booleans()):
        quant_min = draw(st.integers(low, 0))
        quant_max = draw(st.integers(max(quant_min + 1, 0), high))
        quant_range = (quant_min, quant_max)
    qscheme = draw(st.sampled_from(qschemes))
    return Settings(
        dtype=dtype,
        quantized_name=draw(st.booleans()),
        qscheme=qscheme,
        qscheme_as_string=draw(st.booleans()),
        reduce_range=draw(st.booleans()),
        quant_range=quant_range,
        eps=draw(st.sampled_from([torch.finfo(torch.float32).eps, 2**-12, 1e-3, 1e-12])),
    )


PER_TENSOR = ["per_tensor_affine", "per_tensor_symmetric"]
PER_CHANNEL = ["per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams"]


def build_pair(mine_cls: type, theirs_cls: type, cfg: Settings, **extra: Any) -> tuple[Any, Any]:
    """Both observers, or skip the example when fxquant rejects the settings on purpose."""
    try:
        mine = mine_cls(**cfg.mine(), **extra)
    except ConfigError:
        # fxquant rejects symmetric + reduce_range + uint8 for both spellings (torch: quint8 only)
        assume(False)
    with oracle.quiet():
        theirs = theirs_cls(**cfg.theirs(), **extra)
    return mine, theirs


def feed_and_compare(mine: Any, theirs: Any, batches: list[torch.Tensor]) -> None:
    for x in batches:
        assert mine(x) is x
        with oracle.quiet():
            theirs(x.clone())
    try:
        with oracle.quiet():
            want_scale, want_zero_point = theirs.calculate_qparams()
    except AssertionError:
        # float32 moving averages can round max below min: torch asserts, fxquant raises
        with pytest.raises(ConfigError, match="observer range is inverted"):
            mine.calculate_qparams()
        return
    scale, zero_point = mine.calculate_qparams()
    assert scale.dtype == want_scale.dtype
    assert zero_point.dtype == want_zero_point.dtype
    assert torch.equal(scale, want_scale), (scale, want_scale)
    assert torch.equal(zero_point, want_zero_point), (zero_point, want_zero_point)
    assert torch.equal(mine.min_val, theirs.min_val)
    assert torch.equal(mine.max_val, theirs.max_val)


@given(cfg=settings_for(PER_TENSOR), batches=st.lists(batch(), min_size=1, max_size=3))
def test_min_max_observer_qparams_equal_torch_ao(cfg: Settings, batches: list[torch.Tensor]):
    mine, theirs = build_pair(fxobs.MinMaxObserver, ao.MinMaxObserver, cfg)
    feed_and_compare(mine, theirs, batches)


@given(
    cfg=settings_for(PER_TENSOR),
    batches=st.lists(batch(), min_size=1, max_size=4),
    averaging_constant=st.sampled_from([0.01, 0.3, 1.0]),
)
def test_moving_average_observer_qparams_equal_torch_ao(
    cfg: Settings, batches: list[torch.Tensor], averaging_constant: float
):
    mine, theirs = build_pair(
        fxobs.MovingAverageMinMaxObserver,
        ao.MovingAverageMinMaxObserver,
        cfg,
        averaging_constant=averaging_constant,
    )
    feed_and_compare(mine, theirs, batches)


@st.composite
def channel_batches(draw: Any) -> tuple[int, list[torch.Tensor]]:
    # torch.ao's per-channel observers need 2+ dims
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=2, max_size=4)))
    ch_axis = draw(st.integers(0, len(shape) - 1))
    count = draw(st.integers(1, 3))
    return ch_axis, [draw(batch(shape)) for _ in range(count)]


@given(cfg=settings_for(PER_CHANNEL), data=channel_batches())
def test_per_channel_observer_qparams_equal_torch_ao(
    cfg: Settings, data: tuple[int, list[torch.Tensor]]
):
    ch_axis, batches = data
    mine, theirs = build_pair(
        fxobs.PerChannelMinMaxObserver, ao.PerChannelMinMaxObserver, cfg, ch_axis=ch_axis
    )
    feed_and_compare(mine, theirs, batches)


@given(
    cfg=settings_for(PER_CHANNEL),
    data=channel_batches(),
    averaging_constant=st.sampled_from([0.01, 0.5, 1.0]),
)
def test_moving_average_per_channel_observer_qparams_equal_torch_ao(
    cfg: Settings, data: tuple[int, list[torch.Tensor]], averaging_constant: float
):
    ch_axis, batches = data
    mine, theirs = build_pair(
        fxobs.MovingAveragePerChannelMinMaxObserver,
        ao.MovingAveragePerChannelMinMaxObserver,
        cfg,
        ch_axis=ch_axis,
        averaging_constant=averaging_constant,
    )
    feed_and_compare(mine, theirs, batches)


def check_histogram(cfg: Settings, batches: list[torch.Tensor], bins: int) -> None:
    mine, theirs = build_pair(fxobs.HistogramObserver, ao.HistogramObserver, cfg, bins=bins)
    feed_and_compare(mine, theirs, batches)
    assert torch.equal(mine.histogram, theirs.histogram)


@settings(max_examples=8)  # torch.ao's search takes up to ~1 s per example at 2048 bins
@given(cfg=settings_for(PER_TENSOR), batches=st.lists(batch(), min_size=1, max_size=3))
def test_histogram_observer_with_2048_bins_equals_torch_ao(
    cfg: Settings, batches: list[torch.Tensor]
):
    check_histogram(cfg, batches, bins=2048)


@settings(max_examples=8)  # few bins make torch.ao loop ~1e5 times in Python
@given(
    cfg=settings_for(PER_TENSOR),
    batches=st.lists(batch(), min_size=1, max_size=4),
    bins=st.sampled_from([128, 512, 1000]),
)
def test_histogram_observer_with_other_bin_counts_equals_torch_ao(
    cfg: Settings, batches: list[torch.Tensor], bins: int
):
    check_histogram(cfg, batches, bins)


@given(
    scale=st.floats(2.0**-20, 10.0, width=32),
    zero_point=st.integers(0, 255),
    x=batch(),
)
def test_fixed_qparams_observer_equals_torch_ao(scale: float, zero_point: int, x: torch.Tensor):
    mine = fxobs.FixedQParamsObserver(scale=scale, zero_point=zero_point)
    with oracle.quiet():
        theirs = ao.FixedQParamsObserver(scale=scale, zero_point=zero_point)
    assert mine(x) is x
    for got, want in zip(mine.calculate_qparams(), theirs.calculate_qparams(), strict=True):
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


DEFAULTS = [
    "default_observer",
    "default_weight_observer",
    "default_per_channel_weight_observer",
    "default_histogram_observer",
    "default_float_qparams_observer",
    "default_fixed_qparams_range_0to1_observer",
    "default_fixed_qparams_range_neg1to1_observer",
    "default_symmetric_fixed_qparams_observer",
    "default_affine_fixed_qparams_observer",
    "weight_observer_range_neg_127_to_127",
    "per_channel_weight_observer_range_neg_127_to_127",
]


@pytest.mark.parametrize("name", DEFAULTS)
def test_default_observer_matches_torch_ao_namesake(name: str):
    mine = getattr(fxobs, name)()
    with oracle.quiet():
        theirs = getattr(ao.observer, name)()
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(3)) * 4 + 1
    mine(x)
    with oracle.quiet():
        theirs(x)
        want = theirs.calculate_qparams()
    got = mine.calculate_qparams()
    assert (mine.quant_min, mine.quant_max) == (theirs.quant_min, theirs.quant_max)
    assert qscheme_name(mine.qscheme) == qscheme_name(theirs.qscheme)
    assert mine.dtype == {torch.quint8: torch.uint8, torch.qint8: torch.int8}[theirs.dtype]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("name", ["default_dynamic_quant_observer", "default_placeholder_observer"])
def test_placeholder_defaults_match_torch_ao_settings(name: str):
    mine = getattr(fxobs, name)()
    with oracle.quiet():
        theirs = getattr(ao.observer, name)()
    assert mine.is_dynamic == theirs.is_dynamic
    assert (mine.quant_min, mine.quant_max) == (theirs.quant_min, theirs.quant_max)
    assert str(mine.dtype).replace("quint", "uint") == str(theirs.dtype).replace("quint", "uint")


@pytest.mark.parametrize(
    ("mine_cls", "theirs_name", "kwargs"),
    [
        (fxobs.PerChannelMinMaxObserver, "PerChannelMinMaxObserver", {"ch_axis": 1}),
        (fxobs.MinMaxObserver, "MinMaxObserver", {}),
        (fxobs.HistogramObserver, "HistogramObserver", {}),
    ],
)
def test_torch_ao_state_dict_loads_into_a_fresh_fxquant_observer(
    mine_cls: type, theirs_name: str, kwargs: dict[str, Any]
):
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(0))
    with oracle.quiet():
        theirs = getattr(ao, theirs_name)(**kwargs)
        theirs(x)
        want = theirs.calculate_qparams()
    mine = mine_cls(**kwargs)
    mine.load_state_dict(theirs.state_dict())
    got = mine.calculate_qparams()
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


QCONFIG_NAMES = [
    "default_qconfig",
    "default_debug_qconfig",
    "default_per_channel_qconfig",
    "default_dynamic_qconfig",
    "float16_dynamic_qconfig",
    "float16_static_qconfig",
    "per_channel_dynamic_qconfig",
    "float_qparams_weight_only_qconfig",
    "default_qat_qconfig",
    "default_dynamic_qat_qconfig",
    "default_weight_only_qconfig",
    "default_activation_only_qconfig",
    "default_qat_qconfig_v2",
    "default_reuse_input_qconfig",
    "default_symmetric_qnnpack_qconfig",
    "default_per_channel_symmetric_qnnpack_qconfig",
    "default_symmetric_qnnpack_qat_qconfig",
    "default_per_channel_symmetric_qnnpack_qat_qconfig",
    "default_embedding_qat_qconfig",
]


def describe(module: torch.nn.Module) -> dict[str, Any]:
    """What a QConfig entry builds, with quantized dtype names made plain."""
    post = getattr(module, "activation_post_process", module)
    dtype = getattr(post, "dtype", None)
    plain = {torch.quint8: torch.uint8, torch.qint8: torch.int8}.get(dtype, dtype)
    qscheme = getattr(post, "qscheme", None)
    return {
        "class": type(module).__name__,
        "observer": type(post).__name__,
        "dtype": plain,
        "qscheme": None if qscheme is None else qscheme_name(qscheme),
        "range": (getattr(post, "quant_min", None), getattr(post, "quant_max", None)),
        "is_dynamic": getattr(post, "is_dynamic", None),
        "eps": eps.tolist() if isinstance(eps := getattr(post, "eps", None), torch.Tensor) else eps,
    }


@pytest.mark.parametrize("name", QCONFIG_NAMES)
def test_default_qconfig_builds_what_torch_ao_builds(name: str):
    from fxquant.config import defaults

    mine = getattr(defaults, name)
    with oracle.quiet():
        theirs = getattr(ao.qconfig, name)
        want = (describe(theirs.activation()), describe(theirs.weight()))
    assert (describe(mine.activation()), describe(mine.weight())) == want
