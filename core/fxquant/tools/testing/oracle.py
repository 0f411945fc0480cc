"""torch.ao's pattern configs read as fxquant's, to check that a backend covers them.

The caller imports torch.ao and passes its configs in: nothing here imports it.

Example:
    >>> check_covers_ao_patterns("reference", [])
"""

from __future__ import annotations

from typing import Any

import fxquant
from fxquant.config.pattern import simple_to_complex, validate_complex
from fxquant.torch_ao_names import as_fxquant_class

__all__ = [
    "ao_normalized_pattern",
    "ao_op_as_fxquant",
    "check_covers_ao_patterns",
]


def ao_op_as_fxquant(op: Any) -> Any:
    """A torch.ao class (or nested pattern of them) as the fxquant class of the same name.

    Kept for plugin tests; see :func:`fxquant.torch_ao_names.as_fxquant_class`.

    Example:
        >>> import torch
        >>> ao_op_as_fxquant((torch.nn.ReLU, "relu"))
        (<class 'torch.nn.modules.activation.ReLU'>, 'relu')
    """
    return as_fxquant_class(op)


def ao_normalized_pattern(ao_config: Any) -> Any:
    """The fxquant normalized (complex-format) pattern of a torch.ao BackendPatternConfig.

    Example:
        >>> import types, torch
        >>> ao_config = types.SimpleNamespace(_pattern_complex_format=None, pattern=torch.relu)
        >>> ao_normalized_pattern(ao_config) is torch.relu
        True
    """
    if ao_config._pattern_complex_format is not None:
        return validate_complex(ao_op_as_fxquant(ao_config._pattern_complex_format))
    return simple_to_complex(ao_op_as_fxquant(ao_config.pattern))


def check_covers_ao_patterns(backend: str, ao_configs: Any, *, at_least: int = 0) -> None:
    """Assert that ``backend`` lists every pattern of torch.ao's pattern configs ``ao_configs``.

    Args:
        backend: the backend name.
        ao_configs: ``configs`` of a torch.ao BackendConfig (the caller imports torch.ao).
        at_least: the least number of distinct torch.ao patterns expected.

    Example:
        >>> check_covers_ao_patterns("reference", [])
    """
    theirs = [ao_normalized_pattern(c) for c in ao_configs]
    ours = {c.normalized_pattern for c in fxquant.get_backend_config(backend).configs}
    missing = [p for p in theirs if p not in ours]
    if missing or len(set(theirs)) < at_least or len(ours) < len(set(theirs)):
        msg = f"{backend}: {len(missing)} of {len(theirs)} torch.ao patterns missing: {missing}"
        raise AssertionError(msg)
