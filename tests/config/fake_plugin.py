"""A stand-in fxquant plugin for the config tests: observer, modules and fusers.

Tests make ``tests`` a trusted plugin root by announcing this module as an
entry point (see ``conftest.py``), so its names resolve from JSON.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fxquant.factory import ModuleFactory
from fxquant.registry import default_registry, loading


class TinyObserver(torch.nn.Module):
    """Records nothing; enough to stand for an observer class in a QConfig."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.kwargs = kwargs

    @classmethod
    def with_args(cls, **kwargs: Any) -> ModuleFactory:
        return ModuleFactory(cls, kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class FusedConvReLU(torch.nn.Sequential):
    """A fused module class."""


def fuse_conv_relu(is_qat: bool, conv: torch.nn.Module, relu: torch.nn.Module) -> torch.nn.Module:
    return FusedConvReLU(conv, relu)


def root_node_getter(pattern: Any) -> Any:
    return pattern[-1]


def extra_inputs_getter(pattern: Any) -> list[Any]:
    return []


NOT_A_FUNCTION = 3


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Announce this module as the only installed fxquant plugin inside the block."""
    record = loading.EntryPointRecord(backend="fake", value=__name__, dist_key="fake", dist=None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loading, "scan", lambda: [record])
        # serialize reads the registry's scan (kept until refresh)
        patch.setattr(default_registry(), "records", lambda: [record])
        yield
