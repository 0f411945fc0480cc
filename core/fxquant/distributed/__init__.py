"""Old path of :mod:`fxquant_distributed`,
in the optional distribution ``fxquant-distributed``.

Importing it warns (DeprecationWarning) and gives that module, or names the distribution
to install when it is missing.
"""

from fxquant.moved import redirect

redirect(__name__)
