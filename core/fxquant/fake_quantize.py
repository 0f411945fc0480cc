"""Fake-quantize modules at the contract's path ``fxquant.fake_quantize``.

Every public name of :mod:`fxquant.numerics.fake_quantize`, re-exported.

Example:
    >>> import fxquant.fake_quantize, fxquant.numerics.fake_quantize
    >>> fxquant.fake_quantize.__all__ == fxquant.numerics.fake_quantize.__all__
    True
"""

from fxquant.numerics.fake_quantize import *  # noqa: F403 (the contract's path: every public name)
from fxquant.numerics.fake_quantize import __all__ as __all__
