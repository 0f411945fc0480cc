from __future__ import annotations

import pytest
import torch
from fxquant.config.backend import BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from fxquant.config.qconfig import QConfig
from fxquant.flow.dtype_check import QConfigProbe, select_dtype_config
from fxquant.numerics.observer import FixedQParamsObserver, MinMaxObserver, default_weight_observer


def probe(**kwargs: object) -> QConfigProbe:
    return QConfigProbe.of(
        QConfig(activation=MinMaxObserver.with_args(**kwargs), weight=default_weight_observer)
    )


def config(act: object, **extra: object) -> BackendPatternConfig:
    dtype = DTypeConfig(input_dtype=act, output_dtype=act, **extra)  # type: ignore[arg-type]
    return BackendPatternConfig(torch.nn.ReLU).add_dtype_config(dtype)


def test_quint8_qconfig_is_accepted_by_a_uint8_config() -> None:
    chosen = select_dtype_config(config(torch.uint8), probe(dtype=torch.quint8), "relu")
    assert isinstance(chosen, DTypeConfig)


@pytest.mark.parametrize(
    ("constraint", "kwargs", "code", "field"),
    [
        (
            DTypeWithConstraints(torch.quint8, quant_max_upper_bound=127),
            {},
            "quant_range",
            "quant_max_upper_bound",
        ),
        (
            DTypeWithConstraints(torch.quint8, quant_min_lower_bound=1),
            {},
            "quant_range",
            "quant_min_lower_bound",
        ),
        (
            DTypeWithConstraints(torch.quint8, scale_min_lower_bound=1e-3),
            {},
            "scale_min",
            "scale_min_lower_bound",
        ),
        (DTypeWithConstraints(torch.qint8), {}, "dtype_mismatch", "activation_dtype"),
    ],
)
def test_failed_constraint_names_its_field_and_bound(
    constraint: DTypeWithConstraints, kwargs: dict[str, object], code: str, field: str
) -> None:
    reason = select_dtype_config(config(constraint), probe(**kwargs), "relu")
    assert not isinstance(reason, DTypeConfig)
    assert (reason.code, reason.field) == (code, field)


def test_fixed_qparams_must_match_exactly() -> None:
    grid = DTypeWithConstraints(
        torch.quint8, 0, 255, scale_exact_match=1 / 256, zero_point_exact_match=0
    )
    wrong = QConfig(
        activation=FixedQParamsObserver.with_args(scale=2 / 256, zero_point=128),
        weight=default_weight_observer,
    )
    reason = select_dtype_config(config(grid), QConfigProbe.of(wrong), "sigmoid")
    assert not isinstance(reason, DTypeConfig)
    assert reason.code == "fixed_qparams"
    plain = select_dtype_config(config(grid), probe(), "sigmoid")
    assert not isinstance(plain, DTypeConfig)
    assert "not a FixedQParamsObserver" in plain.words


def test_static_qconfig_is_refused_by_a_dynamic_config() -> None:
    reason = select_dtype_config(config(torch.uint8, is_dynamic=True), probe(), "linear")
    assert not isinstance(reason, DTypeConfig)
    assert reason.code == "is_dynamic"


@pytest.mark.parametrize(
    ("dtype", "qscheme", "quant_range", "zero_point", "accepted"),
    [
        (torch.int8, torch.per_tensor_symmetric, (-128, 127), 0, True),
        (torch.int8, torch.per_tensor_affine, (-128, 127), 0, False),
        (torch.uint8, torch.per_tensor_symmetric, (0, 255), 128, True),
        (torch.uint8, torch.per_tensor_symmetric, (0, 255), 0, False),
    ],
)
def test_zero_point_alone_asks_for_symmetric_quantization(
    dtype: torch.dtype,
    qscheme: torch.qscheme,
    quant_range: tuple[int, int],
    zero_point: int,
    accepted: bool,
) -> None:
    constraint = DTypeWithConstraints(dtype, zero_point_exact_match=zero_point)
    low, high = quant_range
    found = select_dtype_config(
        config(constraint),
        probe(dtype=dtype, qscheme=qscheme, quant_min=low, quant_max=high),
        "relu",
    )
    if accepted:
        assert isinstance(found, DTypeConfig)
        return
    assert not isinstance(found, DTypeConfig)
    assert (found.code, found.field, found.bound) == ("zero_point", "zero_point_exact_match", 0)
    assert "use a *_symmetric qscheme" in found.words


def test_a_symmetric_weight_constraint_refuses_affine_per_channel_weights() -> None:
    from fxquant.numerics.observer import PerChannelMinMaxObserver

    weight = DTypeWithConstraints(torch.int8, zero_point_exact_match=0)
    dtype = DTypeConfig(torch.uint8, torch.uint8, weight, torch.float)
    linear = BackendPatternConfig(torch.nn.Linear).add_dtype_config(dtype)
    affine = QConfig(
        activation=MinMaxObserver,
        weight=PerChannelMinMaxObserver.with_args(
            dtype=torch.int8, qscheme=torch.per_channel_affine
        ),
    )
    reason = select_dtype_config(linear, QConfigProbe.of(affine), "fc")
    assert not isinstance(reason, DTypeConfig)
    assert reason.words == (
        "fc: the backend needs weight zero point 0 (symmetric quantization) but the qconfig "
        "weight observer has qscheme per_channel_affine; use a *_symmetric qscheme"
    )
    symmetric = QConfig(
        activation=MinMaxObserver,
        weight=PerChannelMinMaxObserver.with_args(
            dtype=torch.int8, qscheme=torch.per_channel_symmetric
        ),
    )
    assert isinstance(select_dtype_config(linear, QConfigProbe.of(symmetric), "fc"), DTypeConfig)


@pytest.mark.parametrize("reduced", [torch.bfloat16, torch.float16])
def test_an_int8_qconfig_on_a_reduced_float_only_op_says_it_stays_float_and_the_fix(
    reduced: torch.dtype,
) -> None:
    # x86 offers truediv only as a bfloat16 op: "qconfig activation dtype uint8 is not the
    # backend's bfloat16" told a user of the int8 mapping nothing they could act on
    reason = select_dtype_config(config(reduced), probe(dtype=torch.quint8), "truediv")
    assert not isinstance(reason, DTypeConfig)
    name = str(reduced)
    assert reason.code == "dtype_mismatch"
    assert reason.words == (
        f"truediv: the backend runs this op only in {name}, with no kernel for the qconfig's "
        f"torch.uint8 activations, so it stays float32; give it a {name} qconfig to run it "
        f"in {name}, or qconfig None to keep it float32 without this entry"
    )


def test_an_int8_qconfig_on_a_weight_only_op_asks_for_a_weight_only_qconfig() -> None:
    weight_only = DTypeConfig(torch.float32, torch.float32, weight_dtype=torch.uint8)
    pattern = BackendPatternConfig(torch.nn.Embedding).add_dtype_config(weight_only)
    reason = select_dtype_config(pattern, probe(dtype=torch.quint8), "emb")
    assert not isinstance(reason, DTypeConfig)
    assert reason.words.startswith("emb: the backend takes this op's activations in torch.float32")
    assert "weight-only qconfig (float_qparams_weight_only_qconfig" in reason.words


def test_electra_on_x86_says_why_its_attention_truediv_stays_float(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("transformers")
    import fxquant

    # a CPU without bfloat16 arithmetic: on one with it, x86's attention_bf16 mode runs the
    # division in bfloat16 (plugins/x86/tests/test_graph_mode.py)
    monkeypatch.setenv("FXQUANT_X86_BF16", "0")

    from tests.zoo.runner import ZOO

    zoo = ZOO["electra"]
    x86 = fxquant.get_backend_config("x86")
    prepared = fxquant.prepare_fx(
        zoo.build(), fxquant.get_default_qconfig_mapping("x86"), zoo.inputs(0), backend_config=x86
    )
    entries = [e for e in fxquant.explain(prepared, show=False).entries() if "truediv" in e.node]
    assert entries  # the attention scores' division by sqrt(head size)
    for entry in entries:
        assert entry.reason is not None
        assert "is not the backend's" not in entry.reason.words
        if entry.reason.code == "dtype_mismatch":  # a host whose x86 runs it in bfloat16
            assert "only in torch.bfloat16" in entry.reason.words
            assert "qconfig None to keep it float32" in entry.reason.words
