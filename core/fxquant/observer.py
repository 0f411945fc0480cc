"""Observers at the contract's path ``fxquant.observer``.

Every public name of :mod:`fxquant.numerics.observer`, re-exported.

Example:
    >>> import fxquant.observer, fxquant.numerics.observer
    >>> fxquant.observer.__all__ == fxquant.numerics.observer.__all__
    True
"""

from fxquant.numerics.observer import *  # noqa: F403 (the contract's path: every public name)
from fxquant.numerics.observer import __all__ as __all__
