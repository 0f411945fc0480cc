from __future__ import annotations

import operator

import fxquant
import pytest
import torch
import torch.nn.functional as F
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow import fuse_fx, prepare_fx
from fxquant.flow.report import Report
from fxquant.nn import intrinsic
from fxquant.nn.intrinsic import qat as intrinsic_qat
from fxquant.numerics.observer import MinMaxObserver, default_weight_observer
from torch import nn


def cbr() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU())
    model[1].running_mean.uniform_(-1, 1)
    return model


def test_eval_conv_bn_relu_folds_into_conv_relu_with_the_same_output() -> None:
    model = cbr().eval()
    fused = fuse_fx(model)
    assert isinstance(fused.get_submodule("0"), intrinsic.ConvReLU2d)
    x = torch.randn(2, 2, 6, 6)
    torch.testing.assert_close(fused(x), model(x), atol=1e-5, rtol=1e-5)


def test_qat_keeps_a_trainable_conv_bn_module() -> None:
    gm = fxquant.flow.prepare_qat_fx(
        cbr().train(),
        fxquant.get_default_qconfig_mapping("reference", is_qat=True),
        (torch.randn(1, 2, 6, 6),),
    )
    assert isinstance(gm.get_submodule("0"), intrinsic_qat.ConvBnReLU2d)


def test_fusion_uses_only_the_backend_config() -> None:
    empty = fxquant.BackendConfig("nothing")
    gm = fuse_fx(cbr().eval(), backend_config=empty)
    assert [type(m).__name__ for m in gm.children()] == ["Conv2d", "BatchNorm2d", "ReLU"]


def test_a_pattern_with_different_qconfigs_falls_back_to_a_shorter_fusion() -> None:
    # conv -> bn -> relu with a float relu: conv -> bn still fuses (BN folded) and is
    # quantized; the relu stays float because the user said so
    qmap: QConfigMapping = fxquant.get_default_qconfig_mapping("reference")
    qmap.set_module_name("2", None)
    gm = prepare_fx(cbr().eval(), qmap, (torch.randn(1, 2, 6, 6),))
    report: Report = fxquant.flow.explain(gm, show=False)
    assert type(gm.get_submodule("0")) is nn.Conv2d  # the folded conv, no ReLU inside
    assert not hasattr(gm, "1")  # the BN was folded away
    conv, relu = report.entry("_0"), report.entry("_2")
    assert conv is not None
    assert conv.status == "quantized"
    assert relu is not None
    assert relu.reason is not None
    assert relu.reason.code == "qconfig_none"


def test_a_pattern_with_different_qconfigs_and_nothing_shorter_says_why() -> None:
    # a backend that runs linear only fused with relu (as the seed tutorial's conv-relu):
    # two different qconfigs leave neither node quantizable, and the report says why
    from fxquant.nn.fusers import fuse_linear_relu
    from fxquant.patterns.generic import weighted_dtype_configs

    backend = fxquant.BackendConfig("fused_only").set_backend_pattern_configs(
        [
            fxquant.BackendPatternConfig((nn.Linear, nn.ReLU))
            .set_fuser_method(fuse_linear_relu)
            .set_fused_module(intrinsic.LinearReLU),
            fxquant.BackendPatternConfig(intrinsic.LinearReLU)
            .set_dtype_configs(weighted_dtype_configs())
            .set_root_module(nn.Linear),
        ]
    )
    base = fxquant.get_default_qconfig_mapping("reference")
    other = fxquant.QConfig(activation=MinMaxObserver, weight=default_weight_observer)
    qmap = QConfigMapping().set_global(base.qconfig_for("0", nn.Linear)).set_module_name("1", other)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    gm = prepare_fx(model, qmap, (torch.randn(2, 4),), backend_config=backend)
    report = fxquant.flow.explain(gm, show=False)
    for name in ("_0", "_1"):
        entry = report.entry(name)
        assert entry is not None
        assert entry.reason is not None
        assert entry.reason.code == "fusion_qconfig_mismatch"
        assert "nodes _0, _1 have different qconfigs" in entry.reason.words
    assert type(gm.get_submodule("0")) is nn.Linear


def test_conv_add_fusion_uses_the_root_and_extra_input_getters() -> None:
    from fxquant.patterns import conv_add_configs
    from fxquant.patterns.generic import weighted_dtype_configs

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.relu(y) + self.conv(x)  # conv on the right, y computed first

    backend = fxquant.BackendConfig("onednn_like").set_backend_pattern_configs(
        conv_add_configs(weighted_dtype_configs())
    )
    model = M().eval()
    gm = fuse_fx(model, backend_config=backend)
    conv = next(n for n in gm.graph.nodes if n.op == "call_module")
    assert isinstance(gm.get_submodule("conv"), intrinsic.ConvAdd2d)
    assert [a.name for a in conv.args] == ["x", "relu"]  # the add's other input, appended
    x, y = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)
    torch.testing.assert_close(gm(x, y), model(x, y))


def test_fused_graph_drops_the_absorbed_modules() -> None:
    gm = fuse_fx(cbr().eval())
    assert [name for name, _ in gm.named_children()] == ["0"]


def _linear_relu_backend() -> fxquant.BackendConfig:
    from fxquant.nn.fusers import fuse_linear_relu
    from fxquant.patterns.generic import weighted_dtype_configs

    return fxquant.BackendConfig("fused_only").set_backend_pattern_configs(
        [
            fxquant.BackendPatternConfig((nn.Linear, nn.ReLU))
            .set_fuser_method(fuse_linear_relu)
            .set_fused_module(intrinsic.LinearReLU),
            fxquant.BackendPatternConfig(intrinsic.LinearReLU)
            .set_dtype_configs(weighted_dtype_configs())
            .set_root_module(nn.Linear),
        ]
    )


def test_an_entry_for_the_fused_class_quantizes_a_pattern_whose_parts_are_float() -> None:
    # relu float in general, yet quantized where a linear absorbs it (x86 does this
    # for the adds of conv + add)
    base = fxquant.get_default_qconfig_mapping("reference")
    int8 = base.qconfig_for("0", nn.Linear)
    qmap = (
        QConfigMapping()
        .set_global(int8)
        .set_object_type(nn.ReLU, None)
        .set_object_type(intrinsic.LinearReLU, int8)
    )
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.ReLU()).eval()
    gm = prepare_fx(model, qmap, (torch.randn(2, 4),), backend_config=_linear_relu_backend())
    assert type(gm.get_submodule("0")) is intrinsic.LinearReLU
    report = fxquant.flow.explain(gm, show=False)
    assert report.entry("_0").status == "quantized"
    alone = report.entry("_2")  # the second relu fuses into nothing: its own entry holds
    assert alone.reason is not None
    assert alone.reason.code == "qconfig_none"


def test_a_module_name_entry_still_outranks_the_fused_class_entry() -> None:
    base = fxquant.get_default_qconfig_mapping("reference")
    int8 = base.qconfig_for("0", nn.Linear)
    qmap = (
        QConfigMapping()
        .set_global(int8)
        .set_object_type(intrinsic.LinearReLU, int8)
        .set_module_name("1", None)
    )
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    gm = prepare_fx(model, qmap, (torch.randn(2, 4),), backend_config=_linear_relu_backend())
    assert type(gm.get_submodule("0")) is nn.Linear
    reason = fxquant.flow.explain(gm, show=False).entry("_0").reason
    assert reason is not None
    assert reason.code == "fusion_qconfig_mismatch"


class _ResidualBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) + x


def test_qat_refuses_a_fusion_without_a_qat_module_and_fuses_the_shorter_pattern() -> None:
    # conv + bn + add fuses into ConvAdd2d for PTQ, which has no QAT module: for QAT the
    # matcher falls back to conv + bn (a QAT ConvBn2d) and the add is observed on its own
    from fxquant.patterns import conv_add_configs, conv_configs
    from fxquant.patterns.generic import weighted_dtype_configs

    backend = fxquant.BackendConfig("conv_add").set_backend_pattern_configs(
        [*conv_configs(weighted_dtype_configs()), *conv_add_configs(weighted_dtype_configs())]
    )
    mapping = fxquant.get_default_qconfig_mapping("reference", is_qat=True)
    x = torch.randn(2, 4, 6, 6)
    gm = fxquant.flow.prepare_qat_fx(_ResidualBn().train(), mapping, (x,), backend_config=backend)
    assert isinstance(gm.get_submodule("conv"), intrinsic_qat.ConvBn2d)
    assert not any(isinstance(m, intrinsic.ConvAdd2d) for m in gm.modules())
    gm(x).sum().backward()  # trains
    ptq = prepare_fx(_ResidualBn().eval(), mapping, (x,), backend_config=backend)
    assert isinstance(ptq.get_submodule("conv"), intrinsic.ConvAdd2d)


class _Doubled(nn.Module):
    """A conv's output added to itself: conv -> add matches with the conv as the add's other
    operand, which a fused conv-add module could only read before computing it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y + y


def test_a_conv_added_to_itself_is_not_fused_into_a_conv_add_and_stays_right() -> None:
    from fxquant.patterns import conv_add_configs, conv_configs
    from fxquant.patterns.generic import weighted_dtype_configs

    backend = fxquant.BackendConfig("conv_add").set_backend_pattern_configs(
        [*conv_configs(weighted_dtype_configs()), *conv_add_configs(weighted_dtype_configs())]
    )
    torch.manual_seed(0)
    model, x = _Doubled().eval(), torch.randn(2, 3, 8, 8)
    fused = fuse_fx(model, backend_config=backend)
    assert not any(isinstance(m, intrinsic.ConvAdd2d) for m in fused.modules())
    assert torch.equal(fused(x), model(x))
    mapping = fxquant.get_default_qconfig_mapping("reference")
    prepared = prepare_fx(model, mapping, (x,), backend_config=backend)
    prepared(x)
    reference = fxquant.convert_to_reference_fx(prepared)
    assert torch.allclose(reference(x), model(x), atol=0.1)


def _per_tensor(mapping: QConfigMapping) -> fxquant.QConfig:
    activation = mapping.global_qconfig.activation
    return fxquant.QConfig(activation=activation, weight=default_weight_observer)


def _fused_types(gm: torch.fx.GraphModule) -> list[str]:
    return [type(m).__name__ for m in gm.modules() if isinstance(m, intrinsic.FusedModule)]


def test_an_object_type_qconfig_on_the_conv_is_the_fused_modules_qconfig() -> None:
    # the user names nn.Conv2d; the BN folds into it and the ReLU is its output: the fused
    # module takes the conv's qconfig instead of the pattern falling apart
    mapping = fxquant.get_default_qconfig_mapping("x86")
    per_tensor = _per_tensor(mapping)
    mapping.set_object_type(nn.Conv2d, per_tensor)
    x = torch.randn(2, 2, 6, 6)
    gm = prepare_fx(cbr().eval(), mapping, (x,), backend_config=fxquant.get_backend_config("x86"))
    assert _fused_types(gm) == ["ConvReLU2d"]
    entry = fxquant.flow.explain(gm, show=False).entry("_0")
    assert entry is not None
    assert entry.status == "quantized"
    assert entry.pattern is not None
    assert entry.pattern.startswith("ConvReLU2d")
    gm(x)
    converted = fxquant.convert_to_reference_fx(gm)
    weight = next(m for m in converted.modules() if hasattr(m, "weight_qscheme"))
    # the conv's entry, applied (the default is per channel)
    assert weight.weight_qscheme in (torch.per_tensor_affine, torch.per_tensor_symmetric)


def test_a_module_named_part_with_its_own_qconfig_refuses_fusion_and_explain_notes_it() -> None:
    # an entry naming the ReLU's module is the user speaking for that part: the pattern is
    # not fused, both parts are quantized on their own, and explain says what was lost
    mapping = fxquant.get_default_qconfig_mapping("reference")
    mapping.set_module_name("2", _per_tensor(mapping))
    gm = prepare_fx(cbr().eval(), mapping, (torch.randn(1, 2, 6, 6),))
    assert type(gm.get_submodule("0")) is nn.Conv2d
    report = fxquant.flow.explain(gm, show=False)
    assert [e.status for e in report.entries() if e.node in ("_0", "_2")] == ["quantized"] * 2
    [note] = [n for n in report.notes() if n.startswith("not fused")]
    assert note.startswith("not fused: (Conv2d, BatchNorm2d, ReLU)")
    assert "(_2 differs)" in note
    gm(torch.randn(1, 2, 6, 6))
    for converted in (fxquant.convert_to_reference_fx(gm), fxquant.convert_fx(gm)):
        # the converted model's report keeps saying what was lost, as docs/design.md promises
        notes = fxquant.flow.explain(converted, show=False).notes()
        assert [n for n in notes if n.startswith("not fused")] == [note]


def test_the_batch_norms_qconfig_does_not_stop_fusion_and_a_float_activation_does() -> None:
    # the BN's qconfig is never observed (folded into the conv's weights), so conv + BN +
    # ReLU fuse whatever it says; None on the activation keeps it float (the user's intent)
    mapping = fxquant.get_default_qconfig_mapping("reference").set_object_type(nn.BatchNorm2d, None)
    gm = prepare_fx(cbr().eval(), mapping, (torch.randn(1, 2, 6, 6),))
    assert _fused_types(gm) == ["ConvReLU2d"]
    mapping = fxquant.get_default_qconfig_mapping("reference").set_object_type(nn.ReLU, None)
    gm = prepare_fx(cbr().eval(), mapping, (torch.randn(1, 2, 6, 6),))
    assert _fused_types(gm) == []  # the conv, with the BN folded in
    report = fxquant.flow.explain(gm, show=False)
    assert report.entry("_0").status == "quantized"
    assert report.entry("_2").reason.code == "qconfig_none"
    assert not [n for n in report.notes() if n.startswith("not fused")]


def test_a_per_tensor_conv_entry_keeps_mobilenet_v3_fused_and_near_the_default() -> None:
    # the new-user move on x86: per-tensor weights for nn.Conv2d; every conv + BN (+ act)
    # of torchvision's MobileNetV3 still fuses, and the output stays near the default's
    from tests.zoo.runner import ZOO, images
    from tests.zoo.torchvision_models import require

    require()
    zoo = ZOO["tv_mobilenet_v3_small"]
    model, backend = zoo.build(), fxquant.get_backend_config("x86")
    held = torch.cat([images(seed)[0] for seed in (99, 100)])
    expected = model(held)

    def cosine(mapping: QConfigMapping) -> tuple[float, torch.fx.GraphModule]:
        gm = prepare_fx(model, mapping, images(0), backend_config=backend)
        for seed in (1, 2):
            gm(*images(seed))
        got = fxquant.convert_to_reference_fx(gm)(held)
        return F.cosine_similarity(got.flatten(), expected.flatten(), dim=0).item(), gm

    default_cosine, default = cosine(fxquant.get_default_qconfig_mapping("x86"))
    mapping = fxquant.get_default_qconfig_mapping("x86")
    custom_cosine, custom = cosine(mapping.set_object_type(nn.Conv2d, _per_tensor(mapping)))
    assert _fused_types(custom) == _fused_types(default)
    assert len(_fused_types(custom)) >= 20
    assert custom_cosine >= default_cosine - 1e-3
    report = fxquant.flow.explain(custom, show=False)
    assert not [n for n in report.notes() if n.startswith("not fused")]


def test_an_object_type_entry_for_a_part_is_the_user_speaking_for_it_and_refuses() -> None:
    # the global qconfig of a part defers to the conv's; an entry for the part's own type
    # does not (torch.ao raises here): both are quantized on their own, and explain says so
    mapping = fxquant.get_default_qconfig_mapping("reference")
    mapping.set_object_type(nn.ReLU, _per_tensor(mapping))
    gm = prepare_fx(cbr().eval(), mapping, (torch.randn(1, 2, 6, 6),))
    assert _fused_types(gm) == []
    report = fxquant.flow.explain(gm, show=False)
    [note] = [n for n in report.notes() if n.startswith("not fused")]
    assert "(_2 differs)" in note


class ResidualBlock(nn.Module):
    """ResNet's block tail: conv + BN, the residual add, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)) + x)


def _unfused_notes(backend: str, mapping: QConfigMapping) -> list[str]:
    torch.manual_seed(0)
    config = fxquant.get_backend_config(backend)
    gm = prepare_fx(
        ResidualBlock().eval(), mapping, (torch.randn(1, 3, 6, 6),), backend_config=config
    )
    return [n for n in fxquant.flow.explain(gm, show=False).notes() if n.startswith("not fused")]


@pytest.mark.parametrize("backend", ["qnnpack", "fbgemm"])
def test_a_residual_add_the_default_keeps_float_is_noted_without_advising_one_qconfig(
    backend: str,
) -> None:
    # the engines' defaults keep residual adds float on purpose (accuracy): the note says
    # the conv + add + relu fusion is lost because the add is kept float, and does not
    # advise giving the parts one qconfig, which would undo the default's choice
    [note] = _unfused_notes(backend, fxquant.get_default_qconfig_mapping(backend))
    assert "add kept float by the mapping (qconfig None)" in note
    assert "give them one qconfig" not in note


def test_parts_given_different_int8_qconfigs_are_advised_one_and_the_advice_fuses() -> None:
    mapping = fxquant.get_default_qconfig_mapping("qnnpack")
    for add in (operator.add, torch.add):
        mapping.set_object_type(add, mapping.global_qconfig)
    mapping.set_module_name("relu", _per_tensor(mapping))
    [note] = _unfused_notes("qnnpack", mapping)
    assert note.endswith("give them one qconfig to fuse and quantize them")
    mapping.set_module_name("relu", mapping.global_qconfig)  # one qconfig: the advice followed
    assert _unfused_notes("qnnpack", mapping) == []
