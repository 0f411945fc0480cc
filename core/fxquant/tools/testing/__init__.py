"""A test kit for backend plugin authors: single-op models and lowering checks.

A plugin that lowers reference patterns to kernels can check every kernel
against the reference model with a few lines::

    import pytest
    from fxquant.tools import testing

    @pytest.mark.parametrize("case", testing.LOWERING_CASES, ids=lambda c: c.name)
    def test_kernel_is_within_one_step(case):
        testing.check_lowering("mine", case, (2, 4, 4, 6))

Each check raises :class:`AssertionError` with the model's lowering report
when it fails, so it reads like an ``assert`` in any test framework. Nothing
here imports a test framework: the module costs only torch and fxquant.

    Case, LOWERING_CASES       one single-op model per kind of lowering kernel
    quantize_case              (lowered, reference, inputs) of a case for a backend
    check_lowering             the lowered case is within one quantization step
    check_fully_lowered        every quantized op of the case became a kernel
    check_*                    state_dict, deepcopy/pickle, engine, warning and
                               inference-mode checks on a lowered conv-bn-relu

The kit is one package, a module per part: ``cases`` (the single-op models and
quantizing them), ``checks`` (every ``check_*`` and the lists of them), ``oracle``
(torch.ao's patterns read as fxquant's), ``digits`` (real data for accuracy tests)
and ``loader`` (a Python file imported by path). Their names are all here.
"""

from __future__ import annotations

from fxquant.tools.testing import cases, checks, digits, loader, oracle
from fxquant.tools.testing.cases import *  # noqa: F403 (the kit's names, each module's __all__)
from fxquant.tools.testing.checks import *  # noqa: F403
from fxquant.tools.testing.digits import *  # noqa: F403
from fxquant.tools.testing.loader import *  # noqa: F403
from fxquant.tools.testing.oracle import *  # noqa: F403

__all__: list[str] = []
__all__ += cases.__all__
__all__ += checks.__all__
__all__ += digits.__all__
__all__ += loader.__all__
__all__ += oracle.__all__
