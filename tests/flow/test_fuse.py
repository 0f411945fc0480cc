from __future__ import annotations

import fxquant
import torch
from fxquant.config.qconfig_mapping import QConfigMapping
from fxquant.flow import fuse_fx, prepare_fx
from fxquant.flow.report import Report
from fxquant.nn import intrinsic
from fxquant.nn.intrinsic import qat as intrinsic_qat
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


def test_different_qconfigs_in_one_pattern_block_fusion_with_a_reason() -> None:
    qmap: QConfigMapping = fxquant.get_default_qconfig_mapping("reference")
    qmap.set_module_name("2", None)
    gm = prepare_fx(cbr().eval(), qmap, (torch.randn(1, 2, 6, 6),))
    report: Report = fxquant.flow.explain(gm, show=False)
    entry = report.entry("_2")
    assert entry is not None
    assert entry.reason is not None
    assert entry.reason.code == "fusion_qconfig_mismatch"
    assert not isinstance(gm.get_submodule("0"), intrinsic.ConvReLU2d)


def test_conv_add_fusion_uses_the_root_and_extra_input_getters() -> None:
    from fxquant.patterns import conv_add_configs
    from fxquant.patterns.reference import weighted_dtype_configs

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
