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

from fxquant.tools.testing.cases import (
    LOWERING_CASES,
    SIZE_BOUNDS,
    Binary,
    Case,
    Cat,
    Function,
    FunctionalLinear,
    OpFamilies,
    Sizes,
    lowering_statuses,
    output_scale,
    quantize_case,
    quantize_model,
    tolerance,
)
from fxquant.tools.testing.checks import (
    NamedCheck,
    backend_checks,
    check_deepcopy_and_pickle,
    check_default_mapping_lowers_every_op,
    check_deployed,
    check_engine_restored,
    check_fixed_qparams_grid,
    check_forward_warns_nothing,
    check_fully_lowered,
    check_hooks_answer_only_for,
    check_inference_mode,
    check_listed_by_cli,
    check_lowering,
    check_no_warning_in_fresh_process,
    check_quantize_warns_nothing,
    check_state_dict_round_trip,
    lowering_checks,
)
from fxquant.tools.testing.digits import (
    Digits,
    digits_accuracy,
    load_digits,
    train_digits_classifier,
)
from fxquant.tools.testing.loader import (
    load_module_from_path,
)
from fxquant.tools.testing.oracle import (
    ao_normalized_pattern,
    ao_op_as_fxquant,
    check_covers_ao_patterns,
)

__all__ = [
    "LOWERING_CASES",
    "SIZE_BOUNDS",
    "Binary",
    "Case",
    "Cat",
    "Digits",
    "Function",
    "FunctionalLinear",
    "NamedCheck",
    "OpFamilies",
    "Sizes",
    "ao_normalized_pattern",
    "ao_op_as_fxquant",
    "backend_checks",
    "check_covers_ao_patterns",
    "check_deepcopy_and_pickle",
    "check_default_mapping_lowers_every_op",
    "check_deployed",
    "check_engine_restored",
    "check_fixed_qparams_grid",
    "check_forward_warns_nothing",
    "check_fully_lowered",
    "check_hooks_answer_only_for",
    "check_inference_mode",
    "check_listed_by_cli",
    "check_lowering",
    "check_no_warning_in_fresh_process",
    "check_quantize_warns_nothing",
    "check_state_dict_round_trip",
    "digits_accuracy",
    "load_digits",
    "load_module_from_path",
    "lowering_checks",
    "lowering_statuses",
    "output_scale",
    "quantize_case",
    "quantize_model",
    "tolerance",
    "train_digits_classifier",
]
