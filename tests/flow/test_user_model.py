"""prepare_fx never changes the user's model, even one left in train() mode (#18).

Before: PTQ of a model in training mode updated the user's BatchNorm
(``running_mean``, ``running_var``, ``num_batches_tracked``) during calibration,
without a word. Now the prepared model shares the user's parameters and owns
copies of the buffers, and a train-mode model with BatchNorm or dropout gets
one ``CalibrationWarning`` naming the fix (``model.eval()``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import fxquant
import pytest
import torch
from fxquant.errors import CalibrationWarning, ConfigError, ConfigTypeError
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn


def _model() -> nn.Module:
    # BatchNorm after the ReLU: not folded into the conv, so it runs during calibration
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.BatchNorm2d(4), nn.Dropout(0.2), nn.Conv2d(4, 2, 1)
    )


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _prepare(model: nn.Module, backend: str = "fbgemm") -> torch.fx.GraphModule:
    return fxquant.prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping(backend),
        (torch.randn(2, 3, 8, 8),),
        backend_config=fxquant.get_backend_config(backend),
    )


@settings(max_examples=10)
@given(seed=st.integers(0, 2**16), batches=st.integers(1, 4))
def test_calibrating_a_train_mode_model_leaves_its_buffers_alone(seed: int, batches: int) -> None:
    torch.manual_seed(seed)
    model = _model().train()
    before = _snapshot(model)
    with pytest.warns(CalibrationWarning, match=r"model\.eval\(\)") as caught:
        prepared = _prepare(model)
    assert len(caught) == 1
    assert "BatchNorm2d" in str(caught[0].message)
    for _ in range(batches):
        prepared(torch.randn(2, 3, 8, 8) * 3 + 1)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    assert model.training  # the user's mode, untouched too
    assert int(prepared.get_submodule("2").num_batches_tracked) == batches  # its own copy


def test_prepared_model_shares_parameters_and_owns_buffers() -> None:
    model = _model().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eval mode: no warning
        prepared = _prepare(model)
    bn = prepared.get_submodule("2")
    assert bn.weight is model[2].weight  # no second copy of the weights
    assert bn.running_mean is not model[2].running_mean
    before = _snapshot(model)
    prepared.train()  # a user switching the prepared model to train() later
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CalibrationWarning)
        prepared(torch.randn(2, 3, 8, 8))
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_train_mode_model_without_mode_dependent_modules_gets_no_warning() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxquant.prepare_fx(
            model, fxquant.get_default_qconfig_mapping("reference"), (torch.randn(2, 4),)
        )


def test_qat_training_leaves_the_users_bn_and_weights_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    before = _snapshot(model)
    prepared = fxquant.prepare_qat_fx(
        model,
        fxquant.get_default_qconfig_mapping("fbgemm", is_qat=True),
        (torch.randn(2, 3, 8, 8),),
        backend_config=fxquant.get_backend_config("fbgemm"),
    )
    optimizer = torch.optim.SGD(prepared.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        prepared(torch.randn(2, 3, 8, 8)).sum().backward()
        optimizer.step()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["reference", "fbgemm"])
def test_converting_a_model_left_in_training_mode_warns_naming_the_modules(backend: str) -> None:
    # before: `prepared.train(); convert_fx(prepared)` gave a converted model whose dropout
    # dropped values and whose batch norm used batch statistics: 1.6 dB from the float
    # model, a different answer on every call, and no warning
    torch.manual_seed(0)
    model, x = _model().eval(), torch.randn(4, 3, 8, 8)
    prepared = _prepare(model, backend)
    prepared(x)
    prepared.train()
    with pytest.warns(CalibrationWarning, match=r"training mode.*'3' \(Dropout\).*\.eval\(\)"):
        converted = fxquant.convert_fx(prepared)
    assert converted.training  # the mode is the user's to choose; the warning names the fix
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxquant.convert_fx(_calibrated(model, backend, x))  # eval mode: no warning


def _calibrated(model: nn.Module, backend: str, x: torch.Tensor) -> torch.fx.GraphModule:
    prepared = _prepare(model, backend)
    prepared(x)
    return prepared.eval()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qat", [False, True])
def test_a_model_that_is_not_float32_is_refused_at_prepare_naming_the_tensor(
    dtype: torch.dtype, qat: bool
) -> None:
    # before: prepare and calibration ran, then the converted reference model failed with
    # torch's "mat1 and mat2 must have the same dtype, but got Float and Double" (the
    # quantize/dequantize ops give float32), and x86/fbgemm silently returned float32
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to(dtype)
    x = torch.randn(2, 4, dtype=dtype)
    prepare = fxquant.prepare_qat_fx if qat else fxquant.prepare_fx
    step = "prepare_qat_fx" if qat else "prepare_fx"
    name = str(dtype).removeprefix("torch.")
    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=qat)
    with pytest.raises(fxquant.errors.ConfigTypeError) as info:
        prepare(model.train(qat), mapping, (x,))
    words = str(info.value)
    assert f"{step} quantizes float32 models" in words
    assert f"'0.weight' ({name})" in words
    assert "model.float()" in words
    prepared = prepare(model.float().train(qat), mapping, (x.float(),))  # the fix works
    prepared(x.float())
    assert fxquant.convert_fx(prepared.eval())(x.float()).dtype == torch.float32


def test_a_float32_model_with_a_float64_buffer_is_refused_naming_the_buffer() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4, dtype=torch.float64))
            self.register_buffer("ids", torch.arange(4))  # integer buffers are fine

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) * self.scale

    with pytest.raises(fxquant.errors.ConfigTypeError, match=r"'scale' \(float64\)") as info:
        fxquant.prepare_fx(
            Scaled().eval(), fxquant.get_default_qconfig_mapping("x86"), (torch.randn(2, 4),)
        )
    assert "ids" not in str(info.value)


def _sqnr(expected: torch.Tensor, got: torch.Tensor) -> float:
    noise = (expected - got).pow(2).sum()
    return float(10 * torch.log10(expected.pow(2).sum() / noise))


@pytest.mark.parametrize("backend", ["reference", "x86", "fbgemm"])
def test_calibrating_in_training_mode_then_eval_warns_at_convert(backend: str) -> None:
    # before: prepared.train(); calibrate; prepared.eval(); convert_fx said nothing, and the
    # BatchNorm left unfused (after the ReLU) had moved its running statistics toward the
    # calibration batches': 12.8 dB from the float model on x86 against 40.5 calibrated in
    # eval mode (the prepared model alone, before quantizing: 14.4 dB)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.BatchNorm1d(32), nn.Linear(32, 8))
    model[2].running_mean.uniform_(-1, 1)
    model[2].running_var.uniform_(0.5, 2)
    model.eval()
    batches, x = [torch.randn(64, 16) for _ in range(4)], torch.randn(64, 16)
    mapping = fxquant.get_default_qconfig_mapping(backend)
    config = fxquant.get_backend_config(backend)
    converted = {}
    for mode in (True, False):
        prepared = fxquant.prepare_fx(model, mapping, (x,), backend_config=config)
        prepared.train(mode)
        for batch in batches:
            prepared(batch)
        prepared.eval()
        if mode:
            with pytest.warns(CalibrationWarning, match=r"calibrated in training mode") as caught:
                converted[mode] = fxquant.convert_fx(prepared)
            assert len(caught) == 1
            assert "'2' (BatchNorm1d)" in str(caught[0].message)
            assert "prepared.eval()" in str(caught[0].message)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                converted[mode] = fxquant.convert_fx(prepared)
    with torch.no_grad():
        expected = model(x)
        assert _sqnr(expected, converted[True](x)) < 20
        assert _sqnr(expected, converted[False](x)) > 30


def test_training_mode_calibration_of_a_model_without_mode_dependent_modules_is_silent() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    prepared = _prepare_linear(model, "fbgemm")
    prepared.train()
    prepared(torch.randn(8, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxquant.convert_fx(prepared.eval())  # the same numbers in both modes: nothing to say


def test_dropout_calibrated_in_training_mode_is_named_and_reset_forgets_it() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)).eval()
    prepared = _prepare_linear(model, "x86")
    observers = [m for m in prepared.modules() if hasattr(m, "observed_in_training")]
    assert observers
    assert not any(m.training for m in observers)  # they follow the model's mode
    prepared.train()
    prepared(torch.randn(8, 4))
    with pytest.warns(CalibrationWarning, match=r"'1' \(Dropout\)"):
        fxquant.convert_fx(prepared.eval())
    for observer in observers:  # calibrate again, in eval mode: nothing to say
        observer.reset_min_max_vals()
    prepared(torch.randn(8, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fxquant.convert_fx(prepared)


def _prepare_linear(model: nn.Module, backend: str) -> torch.fx.GraphModule:
    return fxquant.prepare_fx(
        model,
        fxquant.get_default_qconfig_mapping(backend),
        (torch.randn(2, 4),),
        backend_config=fxquant.get_backend_config(backend),
    )


def _prepared_and_converted() -> tuple[nn.Module, fx.GraphModule, fx.GraphModule]:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    prepared = fxquant.prepare_fx(model, fxquant.get_default_qconfig_mapping("x86"), (x,))
    prepared(x)
    return model, prepared, fxquant.convert_fx(prepared)


@pytest.mark.parametrize("step", ["prepare_fx", "prepare_qat_fx"])
def test_preparing_a_prepared_or_converted_model_says_what_it_is_and_what_to_pass(
    step: str,
) -> None:
    model, prepared, converted = _prepared_and_converted()
    prepare = getattr(fxquant, step)
    x = (torch.randn(2, 3, 8, 8),)
    mapping = fxquant.get_default_qconfig_mapping("x86", is_qat=step == "prepare_qat_fx")
    expected = {
        prepared: f"^{step}: the model is already prepared \\(prepare_fx or prepare_qat_fx "
        "returned it, with its observers\\); .* or calibrate the prepared model and pass it "
        "to convert_fx$",
        converted: f"^{step}: the model is already converted \\(convert_fx or "
        f"convert_to_reference_fx returned it\\); {step} takes the float model. Pass the "
        "float model to prepare it again .* or use the converted model as it is$",
    }
    for flow_model, message in expected.items():
        with pytest.raises(ConfigTypeError, match=message):
            prepare(flow_model.train() if step == "prepare_qat_fx" else flow_model, mapping, x)
    assert prepare(model.train() if step == "prepare_qat_fx" else model, mapping, x) is not None


def test_fusing_a_prepared_or_converted_model_says_what_it_is_and_what_to_pass() -> None:
    model, prepared, converted = _prepared_and_converted()
    expected = {
        prepared: "^fuse_fx: the model is already prepared \\(prepare_fx or prepare_qat_fx "
        "returned it, with its observers\\); fuse_fx takes the float model. Pass the float "
        "model to fuse it again .* or calibrate the prepared model and pass it to convert_fx$",
        converted: "^fuse_fx: the model is already converted \\(convert_fx or "
        "convert_to_reference_fx returned it\\); fuse_fx takes the float model. .* or use "
        "the converted model as it is$",
    }
    for flow_model, message in expected.items():
        with pytest.raises(ConfigTypeError, match=message):
            fxquant.fuse_fx(flow_model)
    assert type(fxquant.fuse_fx(model).get_submodule("0")).__name__ == "ConvReLU2d"


@pytest.mark.parametrize("convert", [fxquant.convert_fx, fxquant.convert_to_reference_fx])
def test_converting_a_converted_model_says_to_pass_the_prepared_one(
    convert: Callable[..., fx.GraphModule],
) -> None:
    _, prepared, converted = _prepared_and_converted()
    for done in (converted, fxquant.convert_to_reference_fx(prepared)):
        with pytest.raises(ConfigTypeError) as info:
            convert(done)
        assert str(info.value) == (
            f"{convert.__name__} expects a prepared model, got one that convert_fx or "
            "convert_to_reference_fx already converted; pass the prepared model (convert "
            "leaves it unchanged, so it converts again) or use the converted model as it is"
        )
    assert fxquant.explain(convert(prepared), show=False).entries()  # the prepared one converts


@pytest.mark.parametrize(
    ("modules", "phrase"),
    [
        ((nn.Dropout(),), "where Dropout computes differently"),
        ((nn.BatchNorm1d(3), nn.Dropout()), "where BatchNorm1d, Dropout compute differently"),
    ],
)
def test_the_training_mode_warning_names_the_modules_in_a_sentence(
    modules: tuple[nn.Module, ...], phrase: str
) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), *modules)  # no BatchNorm to fold
    mapping = fxquant.get_default_qconfig_mapping("x86")
    with pytest.warns(CalibrationWarning, match=f"in training mode, {phrase} "):
        fxquant.prepare_fx(model, mapping, (torch.randn(4, 3),))


def test_a_conv_bn_model_in_training_mode_is_refused_as_the_ptq_guide_says() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    mapping = fxquant.get_default_qconfig_mapping("x86")
    config = fxquant.get_backend_config("x86")
    x = (torch.randn(2, 3, 8, 8),)
    with (
        pytest.warns(CalibrationWarning, match="in training mode"),
        pytest.raises(ConfigError, match=r"^fold_bn_into_conv: BatchNorm2d\(.* call model.eval"),
    ):
        fxquant.prepare_fx(model, mapping, x, backend_config=config)
