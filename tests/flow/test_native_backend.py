"""``backend_config=None`` is the host's native backend, lowered, as in torch.ao (issue 30).

A torch.ao script unchanged (``prepare_fx(model, get_default_qconfig_mapping(), example)``,
``convert_fx(prepared)``) lowers to the native engine there; here it must lower too, with
``explain`` saying which backend ``None`` resolved to and why.
"""

from __future__ import annotations

import copy
import platform
import warnings

import fxquant
import pytest
import torch
from fxquant.errors import NativeBackendWarning
from fxquant.flow.state import flow_state
from fxquant.registry.install import install_command
from fxquant.registry.native import native_backend
from torch import nn

X86_HOST = platform.machine().lower() in ("x86_64", "amd64")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))


class Residual(nn.Module):
    """conv -> bn -> add -> relu: x86 fuses the add into the conv, the reference backend not."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.relu = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)) + x)


def _converted(backend_config: fxquant.BackendConfig | None = None) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping()
    prepared = fxquant.prepare_fx(
        copy.deepcopy(model), mapping, (x,), backend_config=backend_config
    )
    prepared(x)
    return fxquant.convert_fx(prepared)


def _statuses(model: torch.nn.Module) -> dict[str, str]:
    return {e.node: str(e.status) for e in fxquant.explain(model, show=False).entries()}


@pytest.mark.skipif(not X86_HOST, reason="the native backend of an x86 CPU")
def test_a_torch_ao_script_without_backend_config_lowers_with_x86_and_says_why() -> None:
    if "x86" not in fxquant.list_backends():
        pytest.skip("pip install plugins/x86")
    converted = _converted()
    state = flow_state(converted)
    assert state is not None
    assert state.backend_config.name == "x86"
    assert _statuses(converted)["conv"] == "lowered"
    assert _statuses(converted)["fc"] == "lowered"
    notes = fxquant.explain(converted, show=False).notes()
    assert notes[0].startswith(
        "backend: x86 (backend_config=None: the native backend of this x86 CPU"
    )
    assert any(n.startswith("kernels: backend 'x86'") for n in notes)
    explicit = _converted(fxquant.get_backend_config("x86"))
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(converted(x), explicit(x))


@pytest.mark.skipif(not X86_HOST, reason="the native backend of an x86 CPU")
def test_qat_fuse_and_reference_resolve_none_the_same_way() -> None:
    if "x86" not in fxquant.list_backends():
        pytest.skip("pip install plugins/x86")
    model = Net().train()
    x = torch.randn(2, 3, 8, 8)
    mapping = fxquant.get_default_qconfig_mapping(is_qat=True)
    prepared = fxquant.prepare_qat_fx(model, mapping, (x,))
    state = flow_state(prepared)
    assert state is not None
    assert state.backend_config.name == "x86"
    prepared(x)
    reference = fxquant.convert_to_reference_fx(prepared.eval())
    assert fxquant.explain(reference, show=False).notes()[0].startswith("backend: x86 (")
    fused = fxquant.fuse_fx(Residual().eval())
    assert type(fused.get_submodule("conv")).__name__ == "ConvAddReLU2d"  # x86 fuses the add


def test_convert_lowers_with_the_backend_prepare_resolved_none_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if "qnnpack" not in fxquant.list_backends():
        pytest.skip("pip install plugins/qnnpack")
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    with monkeypatch.context() as patch:
        patch.setattr(platform, "machine", lambda: "aarch64")  # prepared on an ARM host
        prepared = fxquant.prepare_fx(
            Net().eval(), fxquant.get_default_qconfig_mapping("qnnpack"), (x,)
        )
    prepared(x)
    converted = fxquant.convert_fx(prepared)  # converted here: still qnnpack
    state = flow_state(converted)
    assert state is not None
    assert state.backend_config.name == "qnnpack"
    notes = fxquant.explain(converted, show=False).notes()
    assert notes[0].startswith("backend: qnnpack (backend_config=None: the native backend of")
    assert any(n.startswith("kernels: backend 'qnnpack'") for n in notes)
    assert _statuses(converted)["fc"] == "lowered"


def test_no_native_backend_installed_falls_back_to_reference_naming_the_plugin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(
        fxquant.registry.default_registry(), "list_backends", lambda: ["reference", "tensorrt"]
    )
    model = Net().eval()
    mapping = fxquant.get_default_qconfig_mapping("reference")
    with pytest.warns(NativeBackendWarning) as caught:
        prepared = fxquant.prepare_fx(model, mapping, (torch.randn(2, 3, 8, 8),))
    [warning] = caught
    assert warning.filename == __file__  # the user's prepare_fx call
    message = str(warning.message)
    assert message.startswith("prepare_fx: this x86 CPU's native backend 'x86' is not installed")
    assert install_command("x86") in message
    state = flow_state(prepared)
    assert state is not None
    assert state.backend_config.name == "reference"
    notes = fxquant.explain(prepared, show=False).notes()
    assert notes[0] == "backend: reference (backend_config=None: 'x86' is not installed)"


def test_an_explicit_reference_backend_is_never_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fxquant.registry.default_registry(), "list_backends", lambda: ["reference"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared = fxquant.prepare_fx(
            Net().eval(),
            fxquant.get_default_qconfig_mapping("reference"),
            (torch.randn(2, 3, 8, 8),),
            backend_config=fxquant.get_backend_config("reference"),
        )
    assert not any(n.startswith("backend:") for n in fxquant.explain(prepared, show=False).notes())


@pytest.mark.parametrize(
    ("installed", "machine", "expected"),
    [
        (["fbgemm", "onednn", "qnnpack", "reference", "x86"], "x86_64", "x86"),
        (["fbgemm", "onednn", "qnnpack", "reference", "x86"], "AMD64", "x86"),
        (["fbgemm", "onednn", "qnnpack", "reference"], "x86_64", "fbgemm"),
        (["onednn", "reference"], "i686", "onednn"),
        (["fbgemm", "qnnpack", "reference", "x86"], "aarch64", "qnnpack"),
        (["fbgemm", "qnnpack", "reference", "x86"], "arm64", "qnnpack"),
        (["reference", "x86"], "armv7l", "reference"),
        (["qnnpack", "reference", "x86"], "riscv64", "reference"),
        (["executorch", "reference", "tensorrt"], "x86_64", "reference"),
    ],
)
def test_the_native_backend_of_each_cpu_among_the_installed_ones(
    installed: list[str], machine: str, expected: str
) -> None:
    choice = native_backend(installed, machine)
    assert choice.name == expected
    assert (choice.missing is None) == (expected != "reference")
    if choice.missing is not None and machine != "riscv64":
        wanted = "qnnpack" if machine.startswith("arm") else "x86"
        assert install_command(wanted) in choice.missing
